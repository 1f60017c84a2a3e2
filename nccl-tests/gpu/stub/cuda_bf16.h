// Stand-in for CUDA's cuda_bf16.h (see cuda_runtime.h here): bfloat16 as the top 16 bits of a
// float, rounded to nearest even, as __float2bfloat16 does.
#pragma once
#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
  uint16_t bits;
};
static inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  __nv_bfloat16 b;
  b.bits = (uint16_t)(u >> 16);
  return b;
}
static inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
