// gemv_tiled (see gemv_tiled.h): GEMV v3 for re-tiled Q4_0 / Q4_K weights on bf16 tensor cores.
//
// Launch: a block of 8 warps covers 8 / S row groups (16 rows each); the S warps of one row group split its units
// (64 columns each) into S contiguous ranges (S in {1, 2, 4, 8}, chosen from the shape only so that small matrices
// still spread over the SMs). grid.y walks slices of at most 8 activation vectors; a slice of nv vectors uses
// 3·nv MMA columns (hi, mid, lo per vector), i.e. C = ceil(3·nv / 8) column chunks of 8.
//
// Per block: (1) the slice's activations are split into bf16 parts and written to shared memory already in MMA
// B-fragment order (xf: [group q][chunk c][lane][4 words]; Q4_K also gets per-group column sums xs); (2) each warp
// streams its units: kUnroll 16-byte loads per lane in flight (streaming cache hint), then per unit and per
// 32-element group two m16n8k16 MMAs per chunk into a zeroed tile, scaled into f32 accumulators; (3) the S partial
// tiles of a row group are summed in warp order through shared memory, the three parts of each vector are added
// ((hi + mid) + lo) and y is written. No atomics; the order depends only on the shape.
//
// MMA fragments (PTX m16n8k16, bf16): lane = 4g + t; A regs {row g k 2t..2t+1, row g+8 k 2t.., row g k 2t+8..,
// row g+8 k 2t+8..}; B regs {k 2t..2t+1 col g, k 2t+8..2t+9 col g}; C {row g col 2t, 2t+1, row g+8 col 2t, 2t+1}.
// The k order inside an MMA is free as long as A and B agree: lane t's word t of a block holds elements 4t..4t+3
// (low nibbles) and 16+4t..19+4t (high nibbles); (w & 0x000F000F) | 0x43004300 gives the bf16 pair (128 + q) of
// elements (4t, 4t+2) and (w >> 8) the pair (4t+1, 4t+3), so MMA 0 of a group takes those and MMA 1 the
// elements 16 + the same, with B built from x in exactly that order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "core/quant/blocks.h"
#include "core/quant/quant_internal.h"
#include "gpu/cuda_check.h"
#include "gpu/dequant.cuh"
#include "gpu/gemv_tiled.h"

namespace kestrel::gpu {
namespace {

constexpr int kTileRows = 16;
constexpr int kUnitElems = 64;
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxSliceVectors = 8;
constexpr int kMaxChunks = 3;  // 8 vectors = 24 columns = 3 chunks of 8
constexpr int kUnroll = 8;     // units (16-byte loads per lane) in flight per warp
constexpr int kMaxVectors = 32;
constexpr int64_t kMaxCols = 65536;
constexpr uint32_t kQ40Bias = 0xC308C308u;  // bf16x2 (-136, -136): 128 + q - 136 = q - 8
constexpr uint32_t kQ4KBias = 0xC300C300u;  // bf16x2 (-128, -128)
constexpr uint32_t kOneBf16x2 = 0x3F803F80u;

// ---- device helpers ---------------------------------------------------------------------------------------------

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// bf16x2 of the low nibbles of bytes 0 and 2 of w, minus the bias: exact small integers.
__device__ __forceinline__ uint32_t dec(uint32_t w, uint32_t bias) {
  const uint32_t v = (w & 0x000F000Fu) | 0x43004300u;
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(kOneBf16x2), "r"(bias));
  return r;
}

__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The bf16 part `part` (0 hi, 1 mid, 2 lo) of x, as its 16 bits. hi + mid + lo equals x to 24 bits.
__device__ __forceinline__ uint16_t part_bits(float x, int part) {
  __nv_bfloat16 h = __float2bfloat16_rn(x);
  if (part > 0) {
    const float r = __fsub_rn(x, __bfloat162float(h));
    h = __float2bfloat16_rn(r);
    if (part > 1) h = __float2bfloat16_rn(__fsub_rn(r, __bfloat162float(h)));
  }
  uint16_t bits;
  memcpy(&bits, &h, sizeof bits);
  return bits;
}

__device__ __forceinline__ float bits_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

struct KernelArgs {
  const uint4* qs;      // tiled qs part
  const uint8_t* meta;  // tiled meta part
  int n_units;          // units per row group
  int n_rg;             // row groups
  int split;            // S: warps per row group
  const uint4* xf;      // prepared x: B fragments [n_groups][c_total][32]
  const float* xs;      // prepared x: column sums [n_groups][c_total * 8]
  int c_total;          // column chunks of all vectors
  int n_vec;            // vectors of the call
  float* y;             // f32 [n_vec, n_rows]
  int64_t n_rows;
};

// Prepared activations: per 32-element group q and chunk c of 8 columns (column = 3·vector + part), lane (g, t)'s
// four B registers (bf16 pairs in the k order described at the top), and per (q, column) the f32 sum of the part's
// 32 values (the Q4_K min term).
__global__ void prepare_x_kernel(const float* __restrict__ x, int n_cols, int n_vec, int c_total, uint4* xf,
                                 float* xs) {
  const int n_groups = n_cols / 32;
  const int n_items = n_groups * c_total * 32;
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n_items; idx += gridDim.x * blockDim.x) {
    const int q = idx / (c_total * 32);
    const int rem = idx % (c_total * 32);
    const int c = rem / 32;
    const int lane = rem % 32;
    const int col = 8 * c + lane / 4;
    const int t = lane % 4;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (col < 3 * n_vec) {
      const float* xb = x + static_cast<size_t>(col / 3) * n_cols + 32 * q + 4 * t;
      const int part = col % 3;
      const float4 lo4 = *reinterpret_cast<const float4*>(xb);
      const float4 hi4 = *reinterpret_cast<const float4*>(xb + 16);
      v.x = pack2(part_bits(lo4.x, part), part_bits(lo4.z, part));
      v.y = pack2(part_bits(lo4.y, part), part_bits(lo4.w, part));
      v.z = pack2(part_bits(hi4.x, part), part_bits(hi4.z, part));
      v.w = pack2(part_bits(hi4.y, part), part_bits(hi4.w, part));
    }
    xf[idx] = v;
  }
  const int n_sums = n_groups * c_total * 8;
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n_sums; idx += gridDim.x * blockDim.x) {
    const int q = idx / (c_total * 8);
    const int col = idx % (c_total * 8);
    float sum = 0.0f;
    if (col < 3 * n_vec) {
      const float* xb = x + static_cast<size_t>(col / 3) * n_cols + 32 * q;
      for (int k = 0; k < 32; ++k) sum = __fadd_rn(sum, bits_to_float(part_bits(xb[k], col % 3)));
    }
    xs[idx] = sum;
  }
}

__device__ __forceinline__ float half_to_float(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

// A 6-bit value as float without a conversion instruction: 2^23 + v, minus 2^23 (exact).
__device__ __forceinline__ float small_to_float(uint32_t v) {
  return __fsub_rn(__uint_as_float(0x4B000000u | v), 8388608.0f);
}

template <GgmlType T, int C>
__global__ void __launch_bounds__(kThreads, 2) gemv_tiled_kernel(KernelArgs a) {
  __shared__ float red[kWarps][C][32][4];
  __shared__ float tot[kWarps][kTileRows][C * 8];
  const int chunk0 = blockIdx.y * kMaxChunks;  // slices of 8 vectors = 3 chunks
  const int vec0 = blockIdx.y * kMaxSliceVectors;
  const int nv = min(kMaxSliceVectors, a.n_vec - vec0);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int rg_per_block = kWarps / a.split;
  const int rg = blockIdx.x * rg_per_block + warp / a.split;
  const int s = warp % a.split;
  const int per = (a.n_units + a.split - 1) / a.split;
  const int u_begin = min(a.n_units, s * per);
  const int u_end = (rg < a.n_rg) ? min(a.n_units, u_begin + per) : u_begin;

  float acc[C][4];
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;

  const uint4* qs_rg = a.qs + static_cast<size_t>(rg) * a.n_units * 32 + lane;
  for (int u0 = u_begin; u0 < u_end; u0 += kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      if (u0 + i < u_end) wv[i] = load_stream(qs_rg + static_cast<size_t>(u0 + i) * 32);
    }
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int u = u0 + i;
      if (u >= u_end) break;
      // Per-group scales of rows g and g + 8 (and Q4_K mins).
      float sc_g[2], sc_g8[2], mn_g[2], mn_g8[2];
      if constexpr (T == GgmlType::kQ4_0) {
        const uint2 d =
            __ldg(reinterpret_cast<const uint2*>(a.meta + (static_cast<size_t>(rg) * a.n_units + u) * 64 + g * 8));
        sc_g[0] = half_to_float(d.x & 0xFFFFu);
        sc_g8[0] = half_to_float(d.x >> 16);
        sc_g[1] = half_to_float(d.y & 0xFFFFu);
        sc_g8[1] = half_to_float(d.y >> 16);
        mn_g[0] = mn_g[1] = mn_g8[0] = mn_g8[1] = 0.0f;
      } else {
        const int sb = u / 4;
        const int j = u % 4;
        const uint8_t* mb = a.meta + (static_cast<size_t>(rg) * (a.n_units / 4) + sb) * 256;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint4 hd = __ldg(reinterpret_cast<const uint4*>(mb + (g + 8 * r) * 16));
          // field j (24 bits at bit 24j of the words y, z, w)
          const uint32_t lo = j == 0 ? hd.y : (j == 1 ? hd.y : (j == 2 ? hd.z : hd.w));
          const uint32_t hi = j == 0 ? hd.z : (j == 1 ? hd.z : (j == 2 ? hd.w : hd.w));
          const uint32_t f = __funnelshift_r(lo, hi, (24 * j) & 31) & 0xFFFFFFu;
          const float d = half_to_float(hd.x & 0xFFFFu);
          const float dmin = half_to_float(hd.x >> 16);
          float* sc = r == 0 ? sc_g : sc_g8;
          float* mn = r == 0 ? mn_g : mn_g8;
          sc[0] = __fmul_rn(d, small_to_float(f & 63u));
          sc[1] = __fmul_rn(d, small_to_float((f >> 6) & 63u));
          mn[0] = __fmul_rn(dmin, small_to_float((f >> 12) & 63u));
          mn[1] = __fmul_rn(dmin, small_to_float((f >> 18) & 63u));
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t A0[4], A1[4];  // MMA 0 and MMA 1 of group h
        if constexpr (T == GgmlType::kQ4_0) {
          const uint32_t p0 = h == 0 ? wv[i].x : wv[i].z;
          const uint32_t p1 = h == 0 ? wv[i].y : wv[i].w;
          A0[0] = dec(p0, kQ40Bias);
          A0[1] = dec(p1, kQ40Bias);
          A0[2] = dec(p0 >> 8, kQ40Bias);
          A0[3] = dec(p1 >> 8, kQ40Bias);
          A1[0] = dec(p0 >> 4, kQ40Bias);
          A1[1] = dec(p1 >> 4, kQ40Bias);
          A1[2] = dec(p0 >> 12, kQ40Bias);
          A1[3] = dec(p1 >> 12, kQ40Bias);
        } else {
          const int sh = 4 * h;
          A0[0] = dec(wv[i].x >> sh, kQ4KBias);
          A0[1] = dec(wv[i].y >> sh, kQ4KBias);
          A0[2] = dec(wv[i].x >> (8 + sh), kQ4KBias);
          A0[3] = dec(wv[i].y >> (8 + sh), kQ4KBias);
          A1[0] = dec(wv[i].z >> sh, kQ4KBias);
          A1[1] = dec(wv[i].w >> sh, kQ4KBias);
          A1[2] = dec(wv[i].z >> (8 + sh), kQ4KBias);
          A1[3] = dec(wv[i].w >> (8 + sh), kQ4KBias);
        }
        const int q = 2 * u + h;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const uint4 b = __ldg(a.xf + (static_cast<size_t>(q) * a.c_total + chunk0 + c) * 32 + lane);
          float ct[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma(ct, A0[0], A0[1], A0[2], A0[3], b.x, b.y);
          mma(ct, A1[0], A1[1], A1[2], A1[3], b.z, b.w);
          if constexpr (T == GgmlType::kQ4_0) {
            acc[c][0] = __fmaf_rn(sc_g[h], ct[0], acc[c][0]);
            acc[c][1] = __fmaf_rn(sc_g[h], ct[1], acc[c][1]);
            acc[c][2] = __fmaf_rn(sc_g8[h], ct[2], acc[c][2]);
            acc[c][3] = __fmaf_rn(sc_g8[h], ct[3], acc[c][3]);
          } else {
            const float2 sx = __ldg(
                reinterpret_cast<const float2*>(a.xs + (static_cast<size_t>(q) * a.c_total + chunk0 + c) * 8 + 2 * t));
            acc[c][0] = __fmaf_rn(sc_g[h], ct[0], __fmaf_rn(-mn_g[h], sx.x, acc[c][0]));
            acc[c][1] = __fmaf_rn(sc_g[h], ct[1], __fmaf_rn(-mn_g[h], sx.y, acc[c][1]));
            acc[c][2] = __fmaf_rn(sc_g8[h], ct[2], __fmaf_rn(-mn_g8[h], sx.x, acc[c][2]));
            acc[c][3] = __fmaf_rn(sc_g8[h], ct[3], __fmaf_rn(-mn_g8[h], sx.y, acc[c][3]));
          }
        }
      }
    }
  }

  // Sum the S partial tiles of each row group in warp order, then the three parts of each vector.
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int k = 0; k < 4; ++k) red[warp][c][lane][k] = acc[c][k];
  }
  __syncthreads();
  if (s == 0 && rg < a.n_rg) {
    const int rl = warp / a.split;
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float v = 0.0f;
        for (int w = warp; w < warp + a.split; ++w) v = __fadd_rn(v, red[w][c][lane][k]);
        tot[rl][g + (k >= 2 ? 8 : 0)][8 * c + 2 * t + (k & 1)] = v;
      }
    }
    __syncwarp();
    for (int o = lane; o < kTileRows * nv; o += 32) {
      const int row = o % kTileRows;
      const int v = o / kTileRows;
      const float* tr = &tot[rl][row][3 * v];
      const float val = __fadd_rn(__fadd_rn(tr[0], tr[1]), tr[2]);
      a.y[static_cast<size_t>(vec0 + v) * a.n_rows + static_cast<int64_t>(rg) * kTileRows + row] = val;
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------------------------

int chunks_for(int nv) { return (3 * nv + 7) / 8; }

// Warps per row group: about kUnroll units per warp (one round of loads in flight), more warps for short matrices
// so they still spread over the SMs.
int pick_split(int64_t n_rg, int64_t n_units) {
  int s = 1;
  while (s < kWarps &&
         (n_units > static_cast<int64_t>(kUnroll) * s || (n_rg * s < 132 * 16 && n_units / (2 * s) >= 2))) {
    s *= 2;
  }
  return s;
}

template <GgmlType T, int C>
Status launch(const KernelArgs& args, int slices, cudaStream_t stream) {
  const int rg_per_block = kWarps / args.split;
  const dim3 grid(static_cast<unsigned>((args.n_rg + rg_per_block - 1) / rg_per_block), static_cast<unsigned>(slices));
  gemv_tiled_kernel<T, C><<<grid, kThreads, 0, stream>>>(args);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

template <GgmlType T>
Status launch_type(const KernelArgs& args, cudaStream_t stream) {
  // Slices of 8 vectors (3 chunks); a final partial slice runs with the full slices' chunk count (its unused
  // columns are zero), so each vector's arithmetic is the same whatever the slice: MMA columns are independent.
  const int slices = (args.n_vec + kMaxSliceVectors - 1) / kMaxSliceVectors;
  const int c = chunks_for(std::min(args.n_vec, kMaxSliceVectors));
  if (c == 1) return launch<T, 1>(args, slices, stream);
  if (c == 2) return launch<T, 2>(args, slices, stream);
  return launch<T, 3>(args, slices, stream);
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

uint64_t xf_bytes(int64_t n_cols, int n_vec) {
  return static_cast<uint64_t>(n_cols / 32) * static_cast<uint64_t>(chunks_for(n_vec)) * 32 * 16;
}

}  // namespace

bool q4_tiled_supports(GgmlType type, int64_t n_cols, int64_t n_rows) {
  if (n_rows <= 0 || n_rows % kTileRows != 0 || n_cols <= 0 || n_cols > kMaxCols) return false;
  if (n_rows / kTileRows > std::numeric_limits<int32_t>::max() / kWarps) return false;
  if (type == GgmlType::kQ4_0) return n_cols % kUnitElems == 0;
  if (type == GgmlType::kQ4_K) return n_cols % 256 == 0;
  return false;
}

uint64_t q4_tiled_bytes(GgmlType type, int64_t n_cols, int64_t n_rows) {
  const uint64_t elems = static_cast<uint64_t>(n_cols) * static_cast<uint64_t>(n_rows);
  return type == GgmlType::kQ4_K ? elems / 256 * sizeof(BlockQ4_K) : elems / 32 * sizeof(BlockQ4_0);
}

uint64_t tiled_x_bytes(int64_t n_cols, int n_vec) {
  return xf_bytes(n_cols, n_vec) + static_cast<uint64_t>(n_cols / 32) * chunks_for(n_vec) * 8 * sizeof(float);
}

Status q4_tile(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, std::span<uint8_t> out) {
  if (!q4_tiled_supports(type, n_cols, n_rows)) {
    return make_error(ErrorCode::kInvalidArgument, "q4_tile: " + std::string(ggml_type_name(type)) + " {" +
                                                       std::to_string(n_cols) + ", " + std::to_string(n_rows) +
                                                       "} cannot be tiled (q4_0 needs n_cols % 64, q4_K n_cols % "
                                                       "256, n_rows % 16, n_cols <= 65536)");
  }
  if (out.size() != q4_tiled_bytes(type, n_cols, n_rows) || raw == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "q4_tile: output holds " + std::to_string(out.size()) +
                                                       " bytes, the tiled matrix needs " +
                                                       std::to_string(q4_tiled_bytes(type, n_cols, n_rows)));
  }
  const auto* src = static_cast<const uint8_t*>(raw);
  const int64_t n_units = n_cols / kUnitElems;
  const int64_t n_rg = n_rows / kTileRows;
  uint8_t* qs = out.data();
  uint8_t* meta = out.data() + n_rg * n_units * 512;
  if (type == GgmlType::kQ4_0) {
    const int64_t row_bytes = n_cols / 32 * static_cast<int64_t>(sizeof(BlockQ4_0));
    auto block = [&](int64_t row, int64_t b) { return src + row * row_bytes + b * sizeof(BlockQ4_0); };
    for (int64_t rg = 0; rg < n_rg; ++rg) {
      for (int64_t u = 0; u < n_units; ++u) {
        uint8_t* tile = qs + (rg * n_units + u) * 512;
        uint8_t* m = meta + (rg * n_units + u) * 64;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          const int64_t r0 = rg * kTileRows + g;
          const int64_t r8 = r0 + 8;
          // qs of a block start 2 bytes in (after d).
          std::memcpy(tile + lane * 16 + 0, block(r0, 2 * u) + 2 + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 4, block(r8, 2 * u) + 2 + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 8, block(r0, 2 * u + 1) + 2 + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 12, block(r8, 2 * u + 1) + 2 + 4 * t, 4);
        }
        for (int g = 0; g < 8; ++g) {
          const int64_t r0 = rg * kTileRows + g;
          std::memcpy(m + g * 8 + 0, block(r0, 2 * u), 2);
          std::memcpy(m + g * 8 + 2, block(r0 + 8, 2 * u), 2);
          std::memcpy(m + g * 8 + 4, block(r0, 2 * u + 1), 2);
          std::memcpy(m + g * 8 + 6, block(r0 + 8, 2 * u + 1), 2);
        }
      }
    }
  } else {
    const int64_t n_sb = n_cols / 256;
    const int64_t row_bytes = n_sb * static_cast<int64_t>(sizeof(BlockQ4_K));
    auto block = [&](int64_t row, int64_t sb) { return src + row * row_bytes + sb * sizeof(BlockQ4_K); };
    constexpr size_t kQsOffset = offsetof(BlockQ4_K, qs);
    for (int64_t rg = 0; rg < n_rg; ++rg) {
      for (int64_t u = 0; u < n_units; ++u) {
        const int64_t sb = u / 4;
        const int64_t j = u % 4;
        uint8_t* tile = qs + (rg * n_units + u) * 512;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          const int64_t r0 = rg * kTileRows + g;
          const int64_t r8 = r0 + 8;
          std::memcpy(tile + lane * 16 + 0, block(r0, sb) + kQsOffset + 32 * j + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 4, block(r8, sb) + kQsOffset + 32 * j + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 8, block(r0, sb) + kQsOffset + 32 * j + 16 + 4 * t, 4);
          std::memcpy(tile + lane * 16 + 12, block(r8, sb) + kQsOffset + 32 * j + 16 + 4 * t, 4);
        }
      }
      for (int64_t sb = 0; sb < n_sb; ++sb) {
        for (int row = 0; row < kTileRows; ++row) {
          const uint8_t* b = block(rg * kTileRows + row, sb);
          uint8_t* m = meta + (rg * n_sb + sb) * 256 + row * 16;
          std::memcpy(m, b, 4);  // d, dmin
          uint8_t sc[8];
          uint8_t mn[8];
          for (int k = 0; k < 8; ++k)
            quant_internal::k4_get_scale_min(k, b + offsetof(BlockQ4_K, scales), &sc[k], &mn[k]);
          uint8_t packed[12] = {};
          for (int j = 0; j < 4; ++j) {
            const uint32_t field = static_cast<uint32_t>(sc[2 * j]) | (static_cast<uint32_t>(sc[2 * j + 1]) << 6) |
                                   (static_cast<uint32_t>(mn[2 * j]) << 12) |
                                   (static_cast<uint32_t>(mn[2 * j + 1]) << 18);
            for (int bit = 0; bit < 24; ++bit) {
              if ((field >> bit) & 1u) {
                const int at = 24 * j + bit;
                packed[at / 8] = static_cast<uint8_t>(packed[at / 8] | (1u << (at % 8)));
              }
            }
          }
          std::memcpy(m + 4, packed, 12);
        }
      }
    }
  }
  return ok_status();
}

Status gemv_tiled_prepare_x(const float* x, int64_t n_cols, int n_vec, void* xprep, cudaStream_t stream) {
  if (n_cols <= 0 || n_cols % kUnitElems != 0 || n_cols > kMaxCols || n_vec < 1 || n_vec > kMaxVectors) {
    return make_error(ErrorCode::kInvalidArgument, "gemv_tiled_prepare_x: n_cols " + std::to_string(n_cols) +
                                                       " (a multiple of 64 up to 65536) or n_vec " +
                                                       std::to_string(n_vec) + " (1..32) out of range");
  }
  if (x == nullptr || xprep == nullptr || !aligned(x, 16) || !aligned(xprep, 16)) {
    return make_error(ErrorCode::kInvalidArgument, "gemv_tiled_prepare_x: null or misaligned pointer (16 bytes)");
  }
  const int c_total = chunks_for(n_vec);
  auto* xf = static_cast<uint4*>(xprep);
  auto* xs = reinterpret_cast<float*>(static_cast<uint8_t*>(xprep) + xf_bytes(n_cols, n_vec));
  const int items = static_cast<int>(n_cols / 32) * c_total * 32;
  const int blocks = std::min(1024, (items + 255) / 256);
  prepare_x_kernel<<<blocks, 256, 0, stream>>>(x, static_cast<int>(n_cols), n_vec, c_total, xf, xs);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

Status gemv_q4_tiled(const TiledQ4View& w, const void* xprep, int n_vec, float* y, cudaStream_t stream) {
  if (!q4_tiled_supports(w.type, w.n_cols, w.n_rows)) {
    return make_error(ErrorCode::kInvalidArgument, "gemv_q4_tiled: " + std::string(ggml_type_name(w.type)) + " {" +
                                                       std::to_string(w.n_cols) + ", " + std::to_string(w.n_rows) +
                                                       "} is not a tiled shape (see q4_tiled_supports)");
  }
  if (n_vec < 1 || n_vec > kMaxVectors) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemv_q4_tiled: n_vec " + std::to_string(n_vec) + " is outside [1, 32]");
  }
  if (w.data == nullptr || xprep == nullptr || y == nullptr || !aligned(w.data, 16) || !aligned(xprep, 16) ||
      !aligned(y, 4)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemv_q4_tiled: null or misaligned pointer (w and xprep need 16 bytes, y 4)");
  }
  const auto x0 = reinterpret_cast<uintptr_t>(xprep);
  const auto y0 = reinterpret_cast<uintptr_t>(y);
  const auto x1 = x0 + tiled_x_bytes(w.n_cols, n_vec);
  const auto y1 = y0 + static_cast<uintptr_t>(n_vec) * static_cast<uintptr_t>(w.n_rows) * sizeof(float);
  if (x0 < y1 && y0 < x1) return make_error(ErrorCode::kInvalidArgument, "gemv_q4_tiled: y overlaps xprep");
  const int64_t n_rg = w.n_rows / kTileRows;
  const int64_t n_units = w.n_cols / kUnitElems;
  KernelArgs args{};
  args.qs = static_cast<const uint4*>(w.data);
  args.meta = static_cast<const uint8_t*>(w.data) + n_rg * n_units * 512;
  args.n_units = static_cast<int>(n_units);
  args.n_rg = static_cast<int>(n_rg);
  args.split = pick_split(n_rg, n_units);
  args.c_total = chunks_for(n_vec);
  args.xf = static_cast<const uint4*>(xprep);
  args.xs = reinterpret_cast<const float*>(static_cast<const uint8_t*>(xprep) + xf_bytes(w.n_cols, n_vec));
  args.n_vec = n_vec;
  args.y = y;
  args.n_rows = w.n_rows;
  if (w.type == GgmlType::kQ4_0) return launch_type<GgmlType::kQ4_0>(args, stream);
  return launch_type<GgmlType::kQ4_K>(args, stream);
}

}  // namespace kestrel::gpu
