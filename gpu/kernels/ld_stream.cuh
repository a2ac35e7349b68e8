// ld_stream: read-only loads of streamed weights that bypass L1 (`ld.global.nc.L1::no_allocate`): each byte is
// read once per kernel, so keeping it in L1 would only evict what is reused (the prepared activations). asm
// volatile keeps them in program order relative to each other, as the GEMV's double buffering wants.
#pragma once

#include <cuda_runtime.h>

namespace kestrel::gpu {

__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ uint2 ldg_stream2(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t ldg_stream1(const void* p) {
  uint32_t r;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}

}  // namespace kestrel::gpu
