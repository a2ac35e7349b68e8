// dequant_group: one lane's group of kDequantGroup consecutive weights (and the matching activations) decoded at
// once, shared by the GEMV kernels that stage raw GGUF rows (gemv.cu) and the grouped MoE expert kernels
// (moe_experts.cu). Each weight is bit-identical to Dequant<T>::elem; the group never crosses a block, a K sub-block
// or a Q6_K scale group (8 divides 16), so a group's scale (and min) is decoded once.
#pragma once

#include "gpu/kernels/dequant.cuh"

namespace kestrel::gpu {

inline constexpr int kDequantGroup = 8;

// Weights of elements e0 .. e0 + n - 1 of a run of blocks (n < kDequantGroup only at the ragged end of a plain-type
// row).
template <GgmlType T>
__device__ __forceinline__ void dq_group_weights(const typename Dequant<T>::Block* blocks, int e0, int n,
                                                 float (&wv)[kDequantGroup]) {
  using D = Dequant<T>;
  if constexpr (D::kBlockElems == 1) {
#pragma unroll
    for (int j = 0; j < kDequantGroup; ++j) wv[j] = j < n ? D::elem(blocks + e0 + j, 0) : 0.0f;
  } else {
    const auto* b = blocks + e0 / D::kBlockElems;
    const int i0 = e0 % D::kBlockElems;
    if constexpr (T == GgmlType::kQ4_0) {
      const float d = dq_fp16_to_f32(b->d);
#pragma unroll
      for (int j = 0; j < kDequantGroup; ++j) wv[j] = __fmul_rn(static_cast<float>(D::quant(b, i0 + j)), d);
    } else if constexpr (T == GgmlType::kQ8_0) {
      const float d = dq_fp16_to_f32(b->d);
#pragma unroll
      for (int j = 0; j < kDequantGroup; ++j) wv[j] = __fmul_rn(static_cast<float>(b->qs[i0 + j]), d);
    } else if constexpr (T == GgmlType::kQ4_K || T == GgmlType::kQ5_K) {
      float step;
      float offset;
      dq_k4_step_offset(b, D::sub_block(i0), &step, &offset);
#pragma unroll
      for (int j = 0; j < kDequantGroup; ++j) {
        wv[j] = __fsub_rn(__fmul_rn(step, static_cast<float>(D::quant(b, i0 + j))), offset);
      }
    } else {
      static_assert(T == GgmlType::kQ6_K);
      const float step = __fmul_rn(dq_fp16_to_f32(b->d), static_cast<float>(b->scales[D::scale_index(i0)]));
#pragma unroll
      for (int j = 0; j < kDequantGroup; ++j) wv[j] = __fmul_rn(step, static_cast<float>(D::quant(b, i0 + j)));
    }
  }
}

// x[0 .. n - 1] into xv (zeros past n); two 16-byte loads when the group is whole and x is aligned for them.
__device__ __forceinline__ void dq_load_x(const float* __restrict__ p, int n, bool vec4, float (&xv)[kDequantGroup]) {
  if (vec4 && n == kDequantGroup) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    xv[0] = a.x;
    xv[1] = a.y;
    xv[2] = a.z;
    xv[3] = a.w;
    xv[4] = b.x;
    xv[5] = b.y;
    xv[6] = b.z;
    xv[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < kDequantGroup; ++j) xv[j] = j < n ? __ldg(p + j) : 0.0f;
  }
}

}  // namespace kestrel::gpu
