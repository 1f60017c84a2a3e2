/* Stub for a CPU-only build of the IB plugin for the soft-RoCE lab (host memory only). */
#ifndef STUB_CUDA_RUNTIME_H
#define STUB_CUDA_RUNTIME_H
#include <stddef.h>
#include <stdint.h>
typedef int cudaError_t;
#define cudaSuccess 0
typedef struct CUstream_st *cudaStream_t;
static inline const char *cudaGetErrorString(cudaError_t e) { (void)e; return "cuda stub"; }
static inline cudaError_t cudaGetLastError(void) { return 0; }
#endif
