/* A stand-in for NCCL's tuner loader (src/plugin/tuner.cc, src/plugin/plugin_open.cc and the versioned
 * src/plugin/tuner/tuner_vN.cc of v2.30; src/misc/tuner.cc before 2.26), driving the switchless library the
 * way NCCL does:
 *
 *  1. the net plugin: NCCL_NET_PLUGIN resolved as NCCL does (the name, then libnccl-net-<name>.so),
 *     dlopen(RTLD_NOW | RTLD_LOCAL), ncclNetPlugin_v12 init + devices (so its devices are open, as in a
 *     communicator; a failed init leaves the library loaded, as NCCL does);
 *  2. the tuner library: NCCL_TUNER_PLUGIN "none" -> no tuner; set -> the name, then
 *     libnccl-tuner-<name>.so; unset -> libnccl-tuner.so; when none of those loads, the net plugin's
 *     library is opened again by its name (ncclGetNetPluginLib);
 *  3. the symbol: ncclTunerPlugin_v6, v5, v4, v3, v2 in that order (NCCL's), or the version SWL_TUNER_VERSION
 *     names (1 included: NCCL 2.19/2.20 look only for v1);
 *  4. init with SWL_NRANKS / SWL_NNODES, getCollInfo for a fixed list of calls over cost tables in which NCCL
 *     (believing every NIC reaches every host) picks Ring/Simple for large all-reduce and Tree/LL for small
 *     ones, with PAT valid for all-gather; then destroy/finalize, dlclose, net finalize, dlclose.
 *
 * Prints "tuner ..." and "call ..." lines on stdout; the library's log lines go to stdout prefixed "log ".
 * Exit status: 0 when every call returned ncclSuccess, 2 when a library or symbol is missing, 3 otherwise. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "nccl_net_switchless.h"
#include "nccl_tuner_switchless.h"

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                   ...) {
  char text[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  printf("log %s %lx %s:%d %s\n", level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "OTHER",
         flags, file, line, text);
}

/* plugin_open.cc: the name as given, then <prefix>-<name>.so unless the name is a path or a lib*.so. */
static void* open_lib(const char* prefix, const char* name, char* used, size_t cap) {
  char def[256];
  if (!name || !*name) {
    snprintf(def, sizeof def, "%s.so", prefix);
    name = def;
  }
  snprintf(used, cap, "%s", name);
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  size_t n = strlen(name);
  int is_lib_so = strncmp(name, "lib", 3) == 0 && n > 3 && strcmp(name + n - 3, ".so") == 0;
  if (name != def && strchr(name, '/') == NULL && !is_lib_so) {
    snprintf(used, cap, "%s-%s.so", prefix, name);
    h = dlopen(used, RTLD_NOW | RTLD_LOCAL);
  }
  return h;
}

static const char* algo_name[] = {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"};
static const char* proto_name[] = {"LL", "LL128", "Simple"};

/* NCCL's table for one call: Ring and Tree valid for every protocol, PAT for all-gather, the rest ignored. */
static void nccl_table(float t[7][3], int coll, size_t bytes) {
  for (int a = 0; a < 7; a++)
    for (int p = 0; p < 3; p++) t[a][p] = NCCL_ALGO_PROTO_IGNORE;
  for (int p = 0; p < 3; p++) {
    t[NCCL_ALGO_RING][p] = 200.0f + p;
    t[NCCL_ALGO_TREE][p] = 300.0f + p;
    if (coll == ncclFuncAllGather) t[NCCL_ALGO_PAT][p] = 250.0f;
  }
  if (bytes >= (1 << 20))
    t[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = 100.0f;
  else
    t[NCCL_ALGO_TREE][NCCL_PROTO_LL] = 50.0f;
}

static void best(float t[7][3], int* ba, int* bp) {
  float m = 0;
  *ba = *bp = -1;
  for (int a = 0; a < 7; a++)
    for (int p = 0; p < 3; p++)
      if (t[a][p] >= 0 && (*ba < 0 || t[a][p] < m)) {
        m = t[a][p];
        *ba = a;
        *bp = p;
      }
}

static int valid_any(float t[7][3], int a) {
  return t[a][0] >= 0 || t[a][1] >= 0 || t[a][2] >= 0;
}

struct call {
  int coll;
  size_t bytes;
};
static const struct call calls[] = {
  {ncclFuncAllReduce, 4096},      {ncclFuncAllReduce, 1 << 20},         {ncclFuncAllReduce, 16 << 20},
  {ncclFuncAllReduce, 256 << 20}, {ncclFuncAllReduce, (size_t)1 << 30}, {ncclFuncAllGather, 1 << 20},
};

int main(void) {
  const char* netName = getenv("NCCL_NET_PLUGIN");
  char netUsed[4096], tunerUsed[4096];
  void* net = open_lib("libnccl-net", netName, netUsed, sizeof netUsed);
  if (!net) {
    fprintf(stderr, "net plugin %s: %s\n", netUsed, dlerror());
    return 2;
  }
  ncclNet_v12_t* n12 = (ncclNet_v12_t*)dlsym(net, "ncclNetPlugin_v12");
  if (!n12) return 2;
  void* netCtx = NULL;
  ncclNetCommConfig_v12_t config = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  ncclResult_t nr = n12->init(&netCtx, 0x1234, &config, logger, NULL);
  int ndev = -1;
  n12->devices(&ndev);
  printf("net file=%s init=%d ndev=%d\n", netUsed, (int)nr, ndev);

  const char* tunerName = getenv("NCCL_TUNER_PLUGIN");
  if (tunerName && strcasecmp(tunerName, "none") == 0) {
    printf("tuner none\n");
    return 0;
  }
  void* lib = open_lib("libnccl-tuner", tunerName, tunerUsed, sizeof tunerUsed);
  if (!lib) {
    snprintf(tunerUsed, sizeof tunerUsed, "%s", netUsed); /* ncclGetNetPluginLib */
    lib = dlopen(netUsed, RTLD_NOW | RTLD_LOCAL);
  }
  if (!lib) return 2;

  int want = getenv("SWL_TUNER_VERSION") ? atoi(getenv("SWL_TUNER_VERSION")) : 0;
  int version = 0;
  void* sym = NULL;
  for (int v = 6; v >= 1 && !sym; v--) {
    if (want ? v != want : v == 1) continue;
    char s[64];
    snprintf(s, sizeof s, "ncclTunerPlugin_v%d", v);
    sym = dlsym(lib, s);
    version = v;
  }
  if (!sym) {
    fprintf(stderr, "no tuner symbol in %s\n", tunerUsed);
    return 2;
  }
  size_t nRanks = getenv("SWL_NRANKS") ? strtoul(getenv("SWL_NRANKS"), NULL, 10) : 4;
  size_t nNodes = getenv("SWL_NNODES") ? strtoul(getenv("SWL_NNODES"), NULL, 10) : 4;
  const char* name = *(const char* const*)sym;
  void* ctx = NULL;
  ncclResult_t r;
  int failed = 0;
  switch (version) {
    case 1: r = ((ncclTuner_v1_t*)sym)->init(nRanks, nNodes, logger); break;
    case 2: r = ((ncclTuner_v2_t*)sym)->init(nRanks, nNodes, logger, &ctx); break;
    case 3: r = ((ncclTuner_v3_t*)sym)->init(nRanks, nNodes, logger, &ctx); break;
    case 4: r = ((ncclTuner_v4_t*)sym)->init(nRanks, nNodes, logger, &ctx); break;
    default: {
      ncclNvlDomainInfo_v5_t nvl = {(int)nNodes, (int)(nRanks / nNodes), (int)(nRanks / nNodes)};
      ncclTunerConstants_v5_t consts;
      memset(&consts, 0, sizeof consts);
      if (version == 5)
        r = ((ncclTuner_v5_t*)sym)->init(&ctx, 0x1234, nRanks, nNodes, logger, &nvl, &consts);
      else
        r = ((ncclTuner_v6_t*)sym)->init(&ctx, 0x1234, nRanks, nNodes, logger, &nvl, &consts);
    }
  }
  printf("tuner file=%s symbol=ncclTunerPlugin_v%d name=%s init=%d\n", tunerUsed, version, name, (int)r);
  failed |= r != ncclSuccess;

  for (size_t i = 0; r == ncclSuccess && i < sizeof calls / sizeof calls[0]; i++) {
    float t[7][3];
    int coll = calls[i].coll, nch = 0, a0, p0, a1, p1;
    size_t bytes = calls[i].bytes;
    nccl_table(t, coll, bytes);
    best(t, &a0, &p0);
    ncclResult_t c;
    if (version <= 2) {
      int algo = NCCL_ALGO_UNDEF, proto = NCCL_PROTO_UNDEF;
      if (version == 1)
        c = ((ncclTuner_v1_t*)sym)->getCollInfo((ncclFunc_t)coll, bytes, 0, 0, 1, &algo, &proto, &nch);
      else
        c = ((ncclTuner_v2_t*)sym)->getCollInfo(ctx, (ncclFunc_t)coll, bytes, 0, 0, 1, &algo, &proto, &nch);
      /* tuner_v2.cc: a named pair that NCCL computed becomes the cheapest (time 0). */
      if (algo >= 0 && algo < 7 && proto >= 0 && proto < 3 && t[algo][proto] != NCCL_ALGO_PROTO_IGNORE)
        t[algo][proto] = 0.0f;
    } else if (version == 3) {
      c = ((ncclTuner_v3_t*)sym)->getCollInfo(ctx, (ncclFunc_t)coll, bytes, 1, (float**)t, 7, 3, &nch);
    } else if (version == 4) {
      c = ((ncclTuner_v4_t*)sym)->getCollInfo(ctx, (ncclFunc_t)coll, bytes, 1, (float**)t, 7, 3, 0, &nch);
    } else if (version == 5) {
      c = ((ncclTuner_v5_t*)sym)->getCollInfo(ctx, (ncclFunc_t)coll, bytes, 1, (float**)t, 7, 3, 0, &nch);
    } else {
      c = ((ncclTuner_v6_t*)sym)->getCollInfo(ctx, (ncclFunc_t)coll, bytes, 1, (float**)t, 7, 3, 1, &nch);
    }
    best(t, &a1, &p1);
    printf("call coll=%d bytes=%zu rc=%d nccl=%s/%s pick=%s/%s nch=%d tree=%d pat=%d\n", coll, bytes, (int)c,
           algo_name[a0], proto_name[p0], a1 >= 0 ? algo_name[a1] : "none", p1 >= 0 ? proto_name[p1] : "none", nch,
           valid_any(t, NCCL_ALGO_TREE), valid_any(t, NCCL_ALGO_PAT));
    failed |= c != ncclSuccess;
  }
  if (r == ncclSuccess) {
    switch (version) {
      case 1: r = ((ncclTuner_v1_t*)sym)->destroy(); break;
      case 2: r = ((ncclTuner_v2_t*)sym)->destroy(ctx); break;
      case 3: r = ((ncclTuner_v3_t*)sym)->destroy(ctx); break;
      case 4: r = ((ncclTuner_v4_t*)sym)->destroy(ctx); break;
      case 5: r = ((ncclTuner_v5_t*)sym)->finalize(ctx); break;
      default: r = ((ncclTuner_v6_t*)sym)->finalize(ctx);
    }
    printf("tuner finalize=%d\n", (int)r);
    failed |= r != ncclSuccess;
  }
  fflush(stdout);
  dlclose(lib);
  if (nr == ncclSuccess) n12->finalize(netCtx);
  dlclose(net);
  return failed ? 3 : 0;
}
