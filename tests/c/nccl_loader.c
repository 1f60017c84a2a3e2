/* A stand-in for NCCL's net plugin loader (src/plugin/plugin_open.cc + net.cc, v2.30): resolves
 * NCCL_NET_PLUGIN the way NCCL does, dlopen()s with RTLD_NOW|RTLD_LOCAL, takes the newest ncclNetPlugin_vN,
 * calls init (v12 signature) and devices, and finalizes/dlcloses. Used by .ci/steps/30-ffi.sh.
 * Prints one "result ..." line on stdout; the plugin's log lines go to stdout prefixed with "log ". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_net_switchless.h"

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                   ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  printf("log %s %lx %s:%d %s\n", level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "OTHER",
         flags, file, line, text);
}

static void* open_plugin(const char* name, char* used, size_t cap) {
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  snprintf(used, cap, "%s", name);
  if (h) return h;
  size_t n = strlen(name);
  int is_lib_so = strncmp(name, "lib", 3) == 0 && n > 3 && strcmp(name + n - 3, ".so") == 0;
  if (strchr(name, '/') == NULL && !is_lib_so) {
    snprintf(used, cap, "libnccl-net-%s.so", name);
    h = dlopen(used, RTLD_NOW | RTLD_LOCAL);
  }
  if (!h) fprintf(stderr, "NET/Plugin: Could not load %s: %s\n", used, dlerror());
  return h;
}

int main(void) {
  const char* name = getenv("NCCL_NET_PLUGIN");
  char used[4096];
  if (!name) name = "libnccl-net.so";
  void* h = open_plugin(name, used, sizeof used);
  if (!h) return 2;
  for (int v = 12; v >= 6; v--) {
    char sym[64];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    void* p = dlsym(h, sym);
    if (!p) continue;
    if (v != 12) {
      printf("result file=%s symbol=%s (older than v12: not driven)\n", used, sym);
      dlclose(h);
      return 3;
    }
    ncclNet_v12_t* net = (ncclNet_v12_t*)p;
    void* ctx = NULL;
    ncclNetCommConfig_v12_t config = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
    ncclResult_t r = net->init(&ctx, 0x1234, &config, logger, NULL);
    int ndev = -1;
    ncclResult_t rd = net->devices(&ndev);
    if (r == ncclSuccess) net->finalize(ctx);
    printf("result file=%s symbol=%s name=%s init=%d devices_rc=%d ndev=%d\n", used, sym, net->name, (int)r,
           (int)rd, ndev);
    fflush(stdout);
    dlclose(h);
    return 0;
  }
  fprintf(stderr, "no ncclNetPlugin_vN symbol in %s\n", used);
  return 4;
}
