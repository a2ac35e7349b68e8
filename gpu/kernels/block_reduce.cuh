// Deterministic warp max, warp and block-wide f32 sums for the small ops (rms_norm, attention_decode).
//
// Each warp reduces with an XOR butterfly (every lane ends with the same bits: each step adds the same two values
// on both lanes of a pair, and f32 addition is commutative), then thread 0's view of the per-warp sums is added in
// warp order. No atomics, so a given launch shape gives bit-identical results from run to run.
#pragma once

#include <cuda_runtime.h>

namespace kestrel::gpu {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
  return v;
}

// The largest `v` of the warp, on every lane (fmaxf: a NaN lane loses to a number).
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
}

// Sum of `v` over the block; every thread gets the result. blockDim.x must be a multiple of 32 (at most 1024);
// `scratch` is shared memory of at least 33 floats. Contains __syncthreads(): call from every thread of the block.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int n_warps = static_cast<int>(blockDim.x) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < n_warps; ++w) s += scratch[w];
    scratch[32] = s;
  }
  __syncthreads();
  return scratch[32];
}

}  // namespace kestrel::gpu
