// Stand-in for NCCL's nccl.h (see cuda_runtime.h here): the declarations nccl_selftest.cu uses,
// with the types and values of NCCL 2.30 (src/nccl.h.in); every call fails, so nothing here can
// pretend to have run a collective.
#pragma once
#include <stddef.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)
#define NCCL_UNIQUE_ID_BYTES 128

typedef struct ncclComm* ncclComm_t;
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef enum {
  ncclUint64 = 5,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

static inline const char* ncclGetErrorString(ncclResult_t) { return "stub nccl.h: no NCCL"; }
static inline const char* ncclGetLastError(ncclComm_t) { return "stub nccl.h: no NCCL"; }
static inline ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclInternalError;
}
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return ncclInternalError; }
static inline ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) { return ncclInternalError; }
static inline ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclInternalError; }
static inline ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclInternalError; }
static inline ncclResult_t ncclGroupStart(void) { return ncclInternalError; }
static inline ncclResult_t ncclGroupEnd(void) { return ncclInternalError; }
static inline ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, void*) {
  return ncclInternalError;
}
static inline ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, void*) {
  return ncclInternalError;
}
static inline ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, void*) {
  return ncclInternalError;
}
static inline ncclResult_t ncclAlltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t, void*) {
  return ncclInternalError;
}
static inline ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, void*) {
  return ncclInternalError;
}
static inline ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, void*) {
  return ncclInternalError;
}
static inline ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, void*) {
  return ncclInternalError;
}
