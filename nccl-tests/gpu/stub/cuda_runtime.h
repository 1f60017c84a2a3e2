// Stand-in for CUDA's cuda_runtime.h: just enough for `g++ -Istub` to compile nccl_selftest.cu's
// host code without a CUDA toolkit (CI has none). Kernels become plain functions whose grid-stride
// loops cover everything (one "thread"); memory is host memory. Never used on a GPU machine.
#pragma once
#include <stdlib.h>
#include <string.h>

#define __global__
#define __device__
#define __host__

struct stub_dim3 {
  unsigned x, y, z;
};
static const stub_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0};
static const stub_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};

typedef enum { cudaSuccess = 0, cudaErrorNotSupported = 801 } cudaError_t;
typedef void* cudaStream_t;
typedef enum {
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
} cudaMemcpyKind;
struct cudaDeviceProp {
  char name[256];
};

static inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "not supported (stub cuda_runtime.h: no GPU)";
}
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int) { return cudaErrorNotSupported; }
static inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = 0;
  return cudaErrorNotSupported;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  strcpy(p->name, "stub");
  return cudaErrorNotSupported;
}
static inline cudaError_t cudaMalloc(void** p, size_t n) {
  *p = malloc(n);
  return *p ? cudaSuccess : cudaErrorNotSupported;
}
static inline cudaError_t cudaFree(void* p) {
  free(p);
  return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  memset(p, v, n);
  return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  memcpy(d, s, n);
  return cudaSuccess;
}
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  unsigned long long old = *p;
  *p += v;
  return old;
}
