// moe_combine.cuh: the per-token combine of an MoE layer's expert outputs, shared by gpu/kernels/moe_experts.cu and
// gpu/kernels/moe_imma.cu (ref::moe_forward's order): y = Σ over the token's entries by ascending expert id of ye·w,
// from 0, then + sigmoid(ffn_gate_inp_shexp · x)·shared. Device code only; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels/dequant.cuh"
#include "gpu/kernels/pdl.cuh"

namespace kestrel::gpu::moe_combine {

constexpr int kThreads = 256;  // block size of the combine kernels (the shared gate's reduction assumes it)

// sigmoid(gate_inp · x_t) for the shared-expert gate {h} of type T; every thread of the block calls it and gets
// the same value (lane-strided products with fmaf, warp butterflies, warps in order).
template <GgmlType T>
__device__ __forceinline__ float shared_gate(const uint8_t* __restrict__ gate_inp, const float* __restrict__ x_t,
                                             int h) {
  using D = Dequant<T>;
  __shared__ float warp_sums[kThreads / 32];
  const int tid = static_cast<int>(threadIdx.x);
  const auto* blocks = reinterpret_cast<const typename D::Block*>(gate_inp);
  float acc = 0.0f;
  for (int i = tid; i < h; i += kThreads)
    acc = fmaf(D::elem(blocks + i / D::kBlockElems, i % D::kBlockElems), x_t[i], acc);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
  if (tid % 32 == 0) warp_sums[tid / 32] = acc;
  __syncthreads();
  float logit = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) logit += warp_sums[w];
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logit)));
}

// shared_gate's value computed by one warp (lane = its lane), the same bits: the warp plays the block's kThreads / 32
// warps in turn (each one's lane-strided products and butterfly) and adds their sums in the same order.
template <GgmlType T>
__device__ __forceinline__ float shared_gate_warp(const uint8_t* __restrict__ gate_inp, const float* __restrict__ x_t,
                                                  int h, int lane) {
  using D = Dequant<T>;
  const auto* blocks = reinterpret_cast<const typename D::Block*>(gate_inp);
  float logit = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) {
    float acc = 0.0f;
    for (int i = 32 * w + lane; i < h; i += kThreads)
      acc = fmaf(D::elem(blocks + i / D::kBlockElems, i % D::kBlockElems), x_t[i], acc);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
    logit += acc;
  }
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logit)));
}

// Σ_j ye[row_j]·w_j at column c over a token's k entries (ascending expert id), from 0: row_of(j) gives entry j's row
// of ye, weight_of(j, row) its weight. ye was written by a kernel before this one: ordinary loads (pdl.cuh, ld_dep).
template <class RowOf, class WeightOf>
__device__ __forceinline__ float routed_sum_of(const float* ye, int k, int c, int h, RowOf&& row_of,
                                               WeightOf&& weight_of) {
  float y = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int row = row_of(j);
    y = __fadd_rn(y, __fmul_rn(ld_dep(ye + static_cast<int64_t>(row) * h + c), weight_of(j, row)));
  }
  return y;
}

// routed_sum_of over the token's entries as the routing left them (token_entry row t, entry_weight), each read when
// its turn comes (ordinary loads: written by a kernel before this one).
__device__ __forceinline__ float routed_sum(const float* ye, const int32_t* token_entry, const float* entry_weight,
                                            int k, int t, int c, int h) {
  return routed_sum_of(
      ye, k, c, h, [&](int j) { return ld_dep(token_entry + t * k + j); },
      [&](int, int row) { return ld_dep(entry_weight + row); });
}

}  // namespace kestrel::gpu::moe_combine
