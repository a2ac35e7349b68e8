// norm_row.cuh: one row's residual add and RMSNorm by one block, and the prepared form of the normalised row, for
// rms_norm.cu's kernels: one body for the plain, fused and preparing forms, so the bits are the same whichever of them
// a norm runs in. Device code only; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels/block_reduce.cuh"
#include "gpu/kernels/imma_prepare.cuh"

namespace kestrel::gpu::norm_row {

// One row of n by the whole block (any blockDim.x that is a multiple of 32): with kAdd, res[i] ← res[i] + delta_at(i)
// (written back) first; then y[i] = (res[i] · s) · w[i], s = 1 / sqrt(Σ res² / n + eps). Thread t takes the columns
// t, t + blockDim.x, ... and sums their squares in that order (fmaf), then block_sum adds the threads' sums in a fixed
// order. Every thread reads back only what it wrote, so y may be res for the plain form. scratch: 33 floats of shared
// memory. Contains __syncthreads(): call from every thread of the block.
template <bool kAdd, class Delta>
__device__ __forceinline__ void residual_norm(float* res, Delta&& delta_at, const float* w, int64_t n, float eps,
                                              float* y, float* scratch) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = res[i];
    if constexpr (kAdd) {
      v = __fadd_rn(v, delta_at(i));
      res[i] = v;
    }
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, scratch);
  const float mean = __fdiv_rn(ss, static_cast<float>(n));
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  // The weight by ordinary loads: kernels that call this after a programmatic wait keep non-coherent loads out of
  // their wait's shadow (tools/check_pdl_loads.sh).
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fmul_rn(__fmul_rn(res[i], scale), __ldca(w + i));
}

// The prepared form (imma_prepare.cuh) of row `row` of y (rows of n, n a multiple of 64) into xprep, each warp taking
// 256-column groups in turn: the bytes gemv_imma_prepare_x writes from y. Call after the block's writes of the row and
// a __syncthreads(); the row is read back through L2, where the other threads' writes are.
__device__ __forceinline__ void prepare_row(const float* y, int n, const imma_prep::XLayout& lay, uint8_t* xprep,
                                            int row) {
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int grp = static_cast<int>(threadIdx.x / 32); grp < lay.n_groups; grp += warps) {
    imma_prep::prepare_group(imma_prep::L2Rows{y}, n, lay, xprep, row, grp, static_cast<int>(threadIdx.x % 32));
  }
}

}  // namespace kestrel::gpu::norm_row
