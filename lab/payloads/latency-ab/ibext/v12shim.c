/* Exports ncclNetPlugin_v12 over a plugin's ncclNetPlugin_v11 (same calls; v12 widens the
 * properties: vProps.devs[8], railId, planeId), so `switchless bench` (a v12 driver) can drive a
 * v11-only plugin such as nccl-rdma-sharp-plugins' IB transport. Lab tooling only. */
#include <stdint.h>
#include <string.h>
#include "nccl.h"
#include "net.h"

typedef struct { int ndevs; int devs[8]; } vprops12_t;
typedef struct {
  char *name; char *pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int forceFlush;
  int speed; int port; float latency; int maxComms; int maxRecvs; ncclNetDeviceType netDeviceType;
  int netDeviceVersion; vprops12_t vProps; size_t maxP2pBytes; size_t maxCollBytes;
  int maxMultiRequestSize; int16_t railId; int16_t planeId;
} props12_t;
_Static_assert(sizeof(props12_t) == 128, "v12 properties are 128 bytes");
_Static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties are 112 bytes");

extern ncclNet_v11_t ncclNetPlugin_v11;

static ncclResult_t props12(int dev, props12_t *p) {
  ncclNetProperties_v11_t q;
  ncclResult_t r = ncclNetPlugin_v11.getProperties(dev, &q);
  if (r != ncclSuccess) return r;
  memset(p, 0, sizeof(*p));
  p->name = q.name; p->pciPath = q.pciPath; p->guid = q.guid; p->ptrSupport = q.ptrSupport;
  p->regIsGlobal = q.regIsGlobal; p->forceFlush = q.forceFlush; p->speed = q.speed;
  p->port = q.port; p->latency = q.latency; p->maxComms = q.maxComms; p->maxRecvs = q.maxRecvs;
  p->netDeviceType = q.netDeviceType; p->netDeviceVersion = q.netDeviceVersion;
  p->vProps.ndevs = q.vProps.ndevs;
  for (int i = 0; i < q.vProps.ndevs && i < 4; i++) p->vProps.devs[i] = q.vProps.devs[i];
  p->maxP2pBytes = q.maxP2pBytes; p->maxCollBytes = q.maxCollBytes;
  p->maxMultiRequestSize = q.maxMultiRequestSize; p->railId = -1; p->planeId = -1;
  return ncclSuccess;
}

static ncclResult_t vdev12(int *d, vprops12_t *p) {
  ncclNetVDeviceProps_v11_t q;
  if (p->ndevs > 4) return ncclInvalidArgument;
  q.ndevs = p->ndevs;
  for (int i = 0; i < p->ndevs; i++) q.devs[i] = p->devs[i];
  return ncclNetPlugin_v11.makeVDevice(d, &q);
}

/* The v11 table is filled in by its own init (it picks the IB or UCX transport then): the v12
 * init runs it, then takes the filled table, with the two v12 entries swapped in (the layouts of
 * the tables are the same). */
ncclNet_v11_t ncclNetPlugin_v12;
static ncclResult_t (*init11)(void **, uint64_t, ncclNetCommConfig_v11_t *, ncclDebugLogger_t,
                              ncclProfilerCallback_t);
static ncclResult_t init12(void **ctx, uint64_t id, ncclNetCommConfig_v11_t *cfg, ncclDebugLogger_t log,
                           ncclProfilerCallback_t prof) {
  ncclResult_t r = init11(ctx, id, cfg, log, prof);
  if (r != ncclSuccess) return r;
  init11 = ncclNetPlugin_v11.init;
  ncclNetPlugin_v12 = ncclNetPlugin_v11;
  ncclNetPlugin_v12.init = init12;
  ncclNetPlugin_v12.getProperties = (ncclResult_t (*)(int, ncclNetProperties_v11_t *))props12;
  ncclNetPlugin_v12.makeVDevice =
      ncclNetPlugin_v11.makeVDevice ? (ncclResult_t (*)(int *, ncclNetVDeviceProps_v11_t *))vdev12 : NULL;
  return ncclSuccess;
}
__attribute__((constructor)) static void shim_init(void) {
  ncclNetPlugin_v12 = ncclNetPlugin_v11;
  init11 = ncclNetPlugin_v11.init;
  ncclNetPlugin_v12.init = init12;
}
