// imma_prepare.cuh: the prepared-activation form GEMV v4 multiplies (see gemv_imma.h) and the device code that writes
// it, one warp per (vector, 256-element group), for gemv_imma.cu's preparation kernel and for kernels that prepare x
// beside other work (moe_imma's router-and-prepare kernel).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kestrel::gpu::imma_prep {

constexpr int kUnitsPerSlice = 4;  // 256 columns: one activation scale group, one Q4_K super-block
constexpr int kGroupElems = 256;

// Prepared activations, per vector: frag [unit][digit 0..3][t 0..3] uint4 {b0 blk0, b1 blk0, b0 blk1, b1 blk1},
// dsum [unit][h 0..1] int2 {D blk0, D blk1} with D = 128·Σd(digit 2h) + Σd(digit 2h + 1) over the block's 32
// elements (the digit pair a lane's two C columns hold, in units of digit 2h + 1), scale [group] f32 (padded with zeros
// to 16 bytes). Units are padded to whole groups (zeros).
struct XLayout {
  int n_groups = 0;
  __host__ __device__ int n_units() const { return n_groups * kUnitsPerSlice; }
  __host__ __device__ size_t frag_bytes() const { return static_cast<size_t>(n_units()) * 256; }
  __host__ __device__ size_t dsum_bytes() const { return static_cast<size_t>(n_units()) * 16; }
  __host__ __device__ size_t scale_bytes() const { return (static_cast<size_t>(n_groups) * 4 + 15) / 16 * 16; }
  __host__ __device__ size_t vec_bytes() const { return frag_bytes() + dsum_bytes() + scale_bytes(); }
};

inline XLayout x_layout(int64_t n_cols) { return XLayout{static_cast<int>((n_cols + kGroupElems - 1) / kGroupElems)}; }

// Elements e0..e0+7 of a row (16-byte aligned) into v. The row sources below (PlainRows, SwigluRows) say where
// prepare_group takes a vector's elements from.
__device__ __forceinline__ void load8(const float* row, int e0, float (&v)[8]) {
  const float4* src = reinterpret_cast<const float4*>(row + e0);
  const float4 a = src[0];
  const float4 b = src[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The rows of x as they are.
struct PlainRows {
  const float* x;
  __device__ void load(int vec, int n_cols, int e0, float (&v)[8]) const {
    load8(x + static_cast<size_t>(vec) * n_cols, e0, v);
  }
};

// silu(g) · u as ref::swiglu_forward: silu(g) = g · (1 / (1 + e^−g)), no contraction.
__device__ __forceinline__ float swiglu(float g, float u) {
  const float s = __fmul_rn(g, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g))));
  return __fmul_rn(s, u);
}

// The rows of x as they are, read through L2 only (ld.global.cg): for rows another block wrote during the same kernel.
struct L2Rows {
  const float* x;
  __device__ void load(int vec, int n_cols, int e0, float (&v)[8]) const {
    const auto* src = reinterpret_cast<const float4*>(x + static_cast<size_t>(vec) * n_cols + e0);
    const float4 a = __ldcg(src);
    const float4 b = __ldcg(src + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
};

// silu(gate) · up, element by element (swiglu).
struct SwigluRows {
  const float* gate;
  const float* up;
  __device__ void load(int vec, int n_cols, int e0, float (&v)[8]) const {
    float u[8];
    load8(gate + static_cast<size_t>(vec) * n_cols, e0, v);
    load8(up + static_cast<size_t>(vec) * n_cols, e0, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = swiglu(v[j], u[j]);
  }
};

// Group grp of vector vec by one warp (lane = its lane): lane l takes elements 8l..8l+7 of the group, from `rows`,
// and writes the group's digits, digit sums and scale into out (vector vec at vec · lay.vec_bytes()).
template <class Rows>
__device__ __forceinline__ void prepare_group(const Rows& rows, int n_cols, const XLayout& lay,
                                              uint8_t* __restrict__ out, int vec, int grp, int lane) {
  if (grp >= lay.n_groups) return;
  const int e0 = grp * kGroupElems + 8 * lane;
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (e0 < n_cols) rows.load(vec, n_cols, e0, v);  // n_cols is a multiple of 64: a lane's 8 are all in or all out
  float m = 0.0f;
  bool finite = true;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    m = fmaxf(m, fabsf(v[j]));
    finite = finite && isfinite(v[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  finite = __all_sync(0xFFFFFFFFu, finite);
  int ex = 0;
  (void)frexpf(m, &ex);  // m < 2^ex (0 for m == 0)
  // Digits: |x / s| < 64, then three more base-128 digits of the remainder (all exact f32 steps).
  int8_t d[4][8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float r = ldexpf(v[j], 6 - ex);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float dq = rintf(r);
      d[q][j] = static_cast<int8_t>(dq);
      r = (r - dq) * 128.0f;
    }
  }
  uint8_t* base = out + static_cast<size_t>(vec) * lay.vec_bytes();
  auto* frag = reinterpret_cast<uint32_t*>(base);
  auto* dsum = reinterpret_cast<int*>(base + lay.frag_bytes());
  auto* scale = reinterpret_cast<float*>(base + lay.frag_bytes() + lay.dsum_bytes());
  // Element 8l + j of the group: unit u = l / 8, block blk = (l % 8) / 4, k = 8·(l % 4) + j: B register half
  // k / 16, lane t = (k % 16) / 4.
  const int u = grp * kUnitsPerSlice + lane / 8;
  const int blk = (lane % 8) / 4;
  const int half = (lane % 4) / 2;
  const int t0 = 2 * (lane % 2);
  int sums[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t w0 = 0, w1 = 0;
    int s = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w0 |= static_cast<uint32_t>(static_cast<uint8_t>(d[q][j])) << (8 * j);
      w1 |= static_cast<uint32_t>(static_cast<uint8_t>(d[q][4 + j])) << (8 * j);
      s += d[q][j] + d[q][4 + j];
    }
    const size_t f = (static_cast<size_t>(u) * 16 + q * 4) * 4 + 2 * blk + half;  // word index of (u, q, t = 0)
    frag[f + static_cast<size_t>(t0) * 4] = w0;
    frag[f + static_cast<size_t>(t0 + 1) * 4] = w1;
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 2);
    sums[q] = s;  // Σ of digit q over the block's 32 elements (|.| <= 2048)
  }
  if (lane % 4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) dsum[(static_cast<size_t>(u) * 2 + h) * 2 + blk] = 128 * sums[2 * h] + sums[2 * h + 1];
  }
  if (lane == 0) scale[grp] = finite ? ldexpf(1.0f, ex - 6) : __int_as_float(0x7FC00000);
  // The last group's warp also zeroes the scale row's padding, so that every byte of the prepared form is defined
  // (two preparations of the same rows compare equal byte for byte).
  if (grp == lay.n_groups - 1 && lane > 0 && grp + lane < static_cast<int>(lay.scale_bytes() / 4))
    scale[grp + lane] = 0.0f;
}

}  // namespace kestrel::gpu::imma_prep
