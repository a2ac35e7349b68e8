// gemv_tiled (see gemv_tiled.h): GEMV v3 for re-tiled Q4_0 / Q4_K weights on bf16 tensor cores.
//
// Work split: a row group (16 rows) is streamed by S warps (S in {1, 2, 4, 8}; each takes a contiguous range of its
// units of 64 columns) or, for matrices with many row groups, by one warp that then moves on to the row group
// gridDim.x·8 further (S = 1, persistent). A warp streams its units in batches of kBatch: the weight words and scales
// of the next STAGES - 1 batches are copied into shared memory (cp.async) while the current batch is multiplied,
// so loads stay in flight while the tensor cores work. grid.y walks slices of activation vectors (8, 5 or 2 per slice,
// by row length, so that a slice's prepared activations fit in shared memory); a slice of nv vectors uses 3·nv MMA
// columns (hi, mid, lo parts of each vector), i.e. C = ceil(3·nv / 8) column chunks of 8.
//
// Per block: the slice's prepared activations (B fragments and per-group column sums, gemv_tiled_prepare_x) are
// copied to shared memory with cp.async while the first weight batch is in flight. Per unit and 32-element group,
// two m16n8k16 MMAs per chunk multiply the raw (128 + q) bf16 quants; the bias comes off with the column sum:
// Q4_0 y += d·(mma − 136·Σx), Q4_K y += d·sc·mma − (128·d·sc + dmin·m)·Σx. Partial tiles of a row group are summed
// in warp order through shared memory, the three parts of each vector are added ((hi + mid) + lo) and y is written.
// No atomics; the order depends only on the shape, so runs are bit-identical and y[v] does not depend on n_vec.
//
// MMA fragments (PTX m16n8k16, bf16): lane = 4g + t; A regs {row g k 2t..2t+1, row g+8 k 2t.., row g k 2t+8..,
// row g+8 k 2t+8..}; B regs {k 2t..2t+1 col g, k 2t+8..2t+9 col g}; C {row g col 2t, 2t+1, row g+8 col 2t, 2t+1}.
// The k order inside an MMA is free as long as A and B agree: lane t's word t of a block holds elements 4t..4t+3
// (low nibbles) and 16+4t..19+4t (high nibbles); (w & 0x000F000F) | 0x43004300 gives the bf16 pair (128 + q) of
// elements (4t, 4t+2) and (w >> 8) the pair (4t+1, 4t+3), so MMA 0 of a group takes those and MMA 1 the
// elements 16 + the same, with B built from x in exactly that order.
//
// Measured history (docs/benchmarks.md, geomean over the batch-1 cases): v3.0 staged and split x in every block
// (17.6% of the size-matched read); v3.1 prepared x once but loaded scales and B fragments only after the weights
// arrived, a second and third round trip (50.2%); v3.2 prefetched scales with the weights into registers, double-
// buffered, persistent warps (49.7%; lm_head 43% → 53%: too few bytes in flight, 2 KiB per warp); v3.3 (this) streams
// weights and scales through shared-memory stages per warp with cp.async (no registers held by loads), one block of
// 16 warps per SM so the activations are staged once per SM and 5 stages fit (4 batches, 8 KiB, in flight per warp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <string>

#include "core/quant/blocks.h"
#include "core/quant/quant_internal.h"
#include "gpu/cuda_check.h"
#include "gpu/gemv_tiled.h"

namespace kestrel::gpu {
namespace {

constexpr int kTileRows = 16;
constexpr int kUnitElems = 64;
constexpr int kWarps = 16;  // one block of 512 threads per SM: the activations are staged once per SM
constexpr int kThreads = 32 * kWarps;
constexpr int kBatch = 4;  // units per prefetch batch (one Q4_K super-block)
constexpr int kMaxVectors = 32;
constexpr int64_t kMaxCols = 8192;
constexpr uint32_t kMask = 0x000F000Fu;
constexpr uint32_t kBf16Magic = 0x43004300u;  // bf16x2 (128, 128): OR-ing a nibble in gives 128 + q exactly

// ---- device helpers ---------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t dec(uint32_t w) { return (w & kMask) | kBf16Magic; }

__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
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

__device__ __forceinline__ float half_to_float(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

// A 6-bit value as float without a conversion instruction: 2^23 + v, minus 2^23 (exact).
__device__ __forceinline__ float small_to_float(uint32_t v) {
  return __fsub_rn(__uint_as_float(0x4B000000u | v), 8388608.0f);
}

// Prepared activations of one slice: [group q][chunk c][lane] uint4 of B registers, then [q][c * 8] f32 column sums.
struct SliceLayout {
  int n_groups;
  int c;           // chunks per slice
  int slice_vecs;  // vectors per slice (the last slice may hold fewer)
  __host__ __device__ size_t xf_words() const { return static_cast<size_t>(n_groups) * c * 32; }  // uint4 count
  __host__ __device__ size_t xs_floats() const { return static_cast<size_t>(n_groups) * c * 8; }
  __host__ __device__ size_t slice_bytes() const { return xf_words() * 16 + xs_floats() * 4; }
};

// One column of a slice: vector col / 3 of the slice, part col % 3; columns past 3·nv are zero.
__global__ void prepare_x_kernel(const float* __restrict__ x, int n_cols, int n_vec, SliceLayout lay,
                                 uint8_t* __restrict__ out) {
  const int slice = blockIdx.y;
  const int vec0 = slice * lay.slice_vecs;
  const int nv = min(lay.slice_vecs, n_vec - vec0);
  uint8_t* base = out + static_cast<size_t>(slice) * lay.slice_bytes();
  auto* xf = reinterpret_cast<uint4*>(base);
  auto* xs = reinterpret_cast<float*>(base + lay.xf_words() * 16);
  const int n_items = static_cast<int>(lay.xf_words());
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n_items; idx += gridDim.x * blockDim.x) {
    const int q = idx / (lay.c * 32);
    const int rem = idx % (lay.c * 32);
    const int col = 8 * (rem / 32) + (rem % 32) / 4;
    const int t = rem % 4;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (col < 3 * nv) {
      const float* xb = x + static_cast<size_t>(vec0 + col / 3) * n_cols + 32 * q + 4 * t;
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
  const int n_sums = static_cast<int>(lay.xs_floats());
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n_sums; idx += gridDim.x * blockDim.x) {
    const int q = idx / (lay.c * 8);
    const int col = idx % (lay.c * 8);
    float sum = 0.0f;
    if (col < 3 * nv) {
      const float* xb = x + static_cast<size_t>(vec0 + col / 3) * n_cols + 32 * q;
      for (int k = 0; k < 32; ++k) sum = __fadd_rn(sum, bits_to_float(part_bits(xb[k], col % 3)));
    }
    xs[idx] = sum;
  }
}

struct KernelArgs {
  const uint4* qs;       // tiled qs part
  const uint8_t* meta;   // tiled meta part
  int n_units;           // units per row group
  int n_rg;              // row groups
  int split;             // S: warps per row group; 1 = persistent warps
  int per;               // units per warp range (S > 1)
  const uint8_t* xprep;  // prepared activations, slices of lay.slice_bytes()
  SliceLayout lay;
  int n_vec;
  float* y;  // f32 [n_vec, n_rows]
  int64_t n_rows;
};

// One batch of up to kBatch units of one row group, in shared memory: the warp's weight words (lane-major, as the
// tiles store them) and the scale words its lanes need.
struct Stage {
  uint4 w[kBatch][32];
  union {
    uint2 m0[kBatch][8];  // Q4_0: per unit and g, d of rows g, g+8 for both blocks
    uint4 mk[8][2];       // Q4_K: per g, the 16-byte heads of rows g and g + 8 for the batch's super-block
  } m;
};
static_assert(sizeof(Stage) == kBatch * 512 + 256, "a stage is one batch of weights plus 256 bytes of scales");

__device__ __forceinline__ void cp_async16_s(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void cp_async8_s(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Issues the copies of one batch into the stage at shared address `st` (no commit). Addresses are formed once per
// batch; the per-unit offsets are constants.
template <GgmlType T>
__device__ __forceinline__ void issue_batch(const KernelArgs& a, int rg, int u0, int cnt, int lane, uint32_t st) {
  const size_t unit0 = static_cast<size_t>(rg) * a.n_units + u0;
  const uint4* qs = a.qs + unit0 * 32 + lane;
  const uint32_t w_dst = st + static_cast<uint32_t>(offsetof(Stage, w)) + lane * 16;
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    if (i < cnt) cp_async16_s(w_dst + i * 512, qs + i * 32);
  }
  if (lane % 4 != 0) return;
  const int g = lane / 4;
  const uint32_t m_dst = st + static_cast<uint32_t>(offsetof(Stage, m));
  if constexpr (T == GgmlType::kQ4_0) {
    const uint8_t* m = a.meta + unit0 * 64 + g * 8;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (i < cnt) cp_async8_s(m_dst + (i * 8 + g) * 8, m + i * 64);
    }
  } else {
    const uint8_t* mb = a.meta + (static_cast<size_t>(rg) * (a.n_units / 4) + u0 / 4) * 256;
    cp_async16_s(m_dst + g * 32, mb + g * 16);
    cp_async16_s(m_dst + g * 32 + 16, mb + (g + 8) * 16);
  }
}

template <GgmlType T, int C>
__device__ __forceinline__ void compute_batch(const Stage& st, int u0, int cnt, int lane, const uint4* xf_s,
                                              const float* xs_s, float (&acc)[C][4]) {
  const int g = lane / 4;
  const int t = lane % 4;
  // This batch's B fragments and column sums; every index below is a compile-time offset from these.
  const uint4* xb = xf_s + u0 * 2 * C * 32 + lane;
  const float* sb = xs_s + u0 * 2 * C * 8 + 2 * t;
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    if (i >= cnt) break;
    const uint4 w = st.w[i][lane];
    float sc_g[2], sc_g8[2], co_g[2], co_g8[2];  // scale and Σx coefficient per group h, rows g and g + 8
    if constexpr (T == GgmlType::kQ4_0) {
      const uint2 d = st.m.m0[i][g];
      const float2 d0 = __half22float2(*reinterpret_cast<const __half2*>(&d.x));
      const float2 d1 = __half22float2(*reinterpret_cast<const __half2*>(&d.y));
      sc_g[0] = d0.x;
      sc_g8[0] = d0.y;
      sc_g[1] = d1.x;
      sc_g8[1] = d1.y;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        co_g[h] = -136.0f;  // applied before the scale: d·(mma − 136·Σx)
        co_g8[h] = -136.0f;
      }
    } else {
      const int j = i;  // Q4_K batches start on a super-block: unit u0 + i is its chunk i
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint4 hd = st.m.mk[g][r];
        const uint32_t lo = j < 2 ? hd.y : (j == 2 ? hd.z : hd.w);
        const uint32_t hi = j < 2 ? hd.z : hd.w;
        const uint32_t f = __funnelshift_r(lo, hi, (24 * j) & 31) & 0xFFFFFFu;
        const float d = half_to_float(hd.x & 0xFFFFu);
        const float dmin = half_to_float(hd.x >> 16);
        float* sc = r == 0 ? sc_g : sc_g8;
        float* co = r == 0 ? co_g : co_g8;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc[h] = __fmul_rn(d, small_to_float((f >> (6 * h)) & 63u));
          const float mn = __fmul_rn(dmin, small_to_float((f >> (12 + 6 * h)) & 63u));
          co[h] = -__fmaf_rn(128.0f, sc[h], mn);  // y += sc·mma + co·Σx
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t A0[4], A1[4];  // MMA 0 and MMA 1 of group h
      if constexpr (T == GgmlType::kQ4_0) {
        const uint32_t p0 = h == 0 ? w.x : w.z;
        const uint32_t p1 = h == 0 ? w.y : w.w;
        A0[0] = dec(p0);
        A0[1] = dec(p1);
        A0[2] = dec(p0 >> 8);
        A0[3] = dec(p1 >> 8);
        A1[0] = dec(p0 >> 4);
        A1[1] = dec(p1 >> 4);
        A1[2] = dec(p0 >> 12);
        A1[3] = dec(p1 >> 12);
      } else {
        const int sh = 4 * h;
        A0[0] = dec(w.x >> sh);
        A0[1] = dec(w.y >> sh);
        A0[2] = dec(w.x >> (8 + sh));
        A0[3] = dec(w.y >> (8 + sh));
        A1[0] = dec(w.z >> sh);
        A1[1] = dec(w.w >> sh);
        A1[2] = dec(w.z >> (8 + sh));
        A1[3] = dec(w.w >> (8 + sh));
      }
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const uint4 bf = xb[((2 * i + h) * C + c) * 32];
        const float2 sx = *reinterpret_cast<const float2*>(sb + ((2 * i + h) * C + c) * 8);
        float ct[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma(ct, A0[0], A0[1], A0[2], A0[3], bf.x, bf.y);
        mma(ct, A1[0], A1[1], A1[2], A1[3], bf.z, bf.w);
        if constexpr (T == GgmlType::kQ4_0) {
          acc[c][0] = __fmaf_rn(sc_g[h], __fmaf_rn(co_g[h], sx.x, ct[0]), acc[c][0]);
          acc[c][1] = __fmaf_rn(sc_g[h], __fmaf_rn(co_g[h], sx.y, ct[1]), acc[c][1]);
          acc[c][2] = __fmaf_rn(sc_g8[h], __fmaf_rn(co_g8[h], sx.x, ct[2]), acc[c][2]);
          acc[c][3] = __fmaf_rn(sc_g8[h], __fmaf_rn(co_g8[h], sx.y, ct[3]), acc[c][3]);
        } else {
          acc[c][0] = __fmaf_rn(sc_g[h], ct[0], __fmaf_rn(co_g[h], sx.x, acc[c][0]));
          acc[c][1] = __fmaf_rn(sc_g[h], ct[1], __fmaf_rn(co_g[h], sx.y, acc[c][1]));
          acc[c][2] = __fmaf_rn(sc_g8[h], ct[2], __fmaf_rn(co_g8[h], sx.x, acc[c][2]));
          acc[c][3] = __fmaf_rn(sc_g8[h], ct[3], __fmaf_rn(co_g8[h], sx.y, acc[c][3]));
        }
      }
    }
  }
}

// Writes one row group's outputs from a warp's tile `tile` ([16 rows][C * 8 cols] in shared memory, filled).
template <int C>
__device__ __forceinline__ void write_rows(const float (*tile)[C * 8], int rg, int vec0, int nv, int lane,
                                           const KernelArgs& a) {
  for (int o = lane; o < kTileRows * nv; o += 32) {
    const int row = o % kTileRows;
    const int v = o / kTileRows;
    const float* tr = &tile[row][3 * v];
    a.y[static_cast<size_t>(vec0 + v) * a.n_rows + static_cast<int64_t>(rg) * kTileRows + row] =
        __fadd_rn(__fadd_rn(tr[0], tr[1]), tr[2]);
  }
}

// A warp's position in its stream of batches: row group rg, units [u, range_end).
struct Cursor {
  int rg;
  int u;
  bool valid;
};

__device__ __forceinline__ Cursor advance(Cursor c, int range_begin, int range_end, int rg_stride, int n_rg,
                                          bool persistent) {
  c.u += kBatch;
  if (c.u >= range_end) {
    c.rg = persistent ? c.rg + rg_stride : n_rg;
    c.u = range_begin;
  }
  c.valid = c.rg < n_rg;
  return c;
}

// STAGES: batches per warp, STAGES - 1 of them in flight ahead of the one being multiplied (5, 3 or 2: as many as
// shared memory holds beside the activations).
template <GgmlType T, int C, int STAGES>
__global__ void __launch_bounds__(kThreads, 1) gemv_tiled_kernel(KernelArgs a) {
  extern __shared__ uint4 smem[];
  __shared__ float tot[kWarps][kTileRows][C * 8];
  const int slice = blockIdx.y;
  const int vec0 = slice * a.lay.slice_vecs;
  const int nv = min(a.lay.slice_vecs, a.n_vec - vec0);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  // Dynamic shared memory: [slice activations][kWarps][STAGES] stages.
  const uint4* xf_s = smem;
  const float* xs_s = reinterpret_cast<const float*>(smem + a.lay.xf_words());
  const size_t act_words = (a.lay.slice_bytes() + 15) / 16;
  Stage* stages = reinterpret_cast<Stage*>(smem + act_words) + warp * STAGES;
  const auto stages_s = static_cast<uint32_t>(__cvta_generic_to_shared(stages));  // shared address of stage 0

  // The slice's activations (one cp.async group, the oldest of every thread).
  const uint8_t* src = a.xprep + static_cast<size_t>(slice) * a.lay.slice_bytes();
  const int n16 = static_cast<int>(a.lay.slice_bytes() / 16);
  for (int i = threadIdx.x; i < n16; i += kThreads) cp_async16(smem + i, src + static_cast<size_t>(i) * 16);
  cp_async_commit();

  // This warp's stream.
  const bool persistent = a.split == 1;
  const int s = persistent ? 0 : warp % a.split;
  const int rg_first = persistent ? blockIdx.x * kWarps + warp : blockIdx.x * (kWarps / a.split) + warp / a.split;
  const int range_begin = persistent ? 0 : min(a.n_units, s * a.per);
  const int range_end = persistent ? a.n_units : min(a.n_units, range_begin + a.per);
  const int rg_stride = gridDim.x * kWarps;
  Cursor issue{rg_first, range_begin, rg_first < a.n_rg && range_begin < range_end};
  Cursor comp = issue;

  // Prologue: STAGES - 1 batches in flight (one group each, empty groups past the end keep the count).
#pragma unroll
  for (int k = 0; k < STAGES - 1; ++k) {
    if (issue.valid) {
      issue_batch<T>(a, issue.rg, issue.u, min(kBatch, range_end - issue.u), lane,
                     stages_s + static_cast<uint32_t>(k * sizeof(Stage)));
      issue = advance(issue, range_begin, range_end, rg_stride, a.n_rg, persistent);
    }
    cp_async_commit();
  }
  cp_async_wait<STAGES - 1>();  // the activations (issued before the stages) have landed for this thread
  __syncthreads();

  float acc[C][4];
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;

  int k_comp = 0;            // stage of the batch being multiplied
  int k_issue = STAGES - 1;  // stage the next copy goes to
  while (comp.valid) {
    cp_async_wait<STAGES - 2>();  // batch k_comp has landed (for this lane)
    __syncwarp();                 // ... and for every lane of the warp
    const int cnt = min(kBatch, range_end - comp.u);
    compute_batch<T, C>(stages[k_comp], comp.u, cnt, lane, xf_s, xs_s, acc);
    __syncwarp();  // every lane is done with stage k_comp before it is refilled
    if (issue.valid) {
      issue_batch<T>(a, issue.rg, issue.u, min(kBatch, range_end - issue.u), lane,
                     stages_s + static_cast<uint32_t>(k_issue * sizeof(Stage)));
      issue = advance(issue, range_begin, range_end, rg_stride, a.n_rg, persistent);
    }
    cp_async_commit();
    k_comp = k_comp + 1 == STAGES ? 0 : k_comp + 1;
    k_issue = k_issue + 1 == STAGES ? 0 : k_issue + 1;
    const Cursor next = advance(comp, range_begin, range_end, rg_stride, a.n_rg, persistent);
    if (persistent && next.rg != comp.rg) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          tot[warp][g + (e >= 2 ? 8 : 0)][8 * c + 2 * t + (e & 1)] = acc[c][e];
          acc[c][e] = 0.0f;
        }
      }
      __syncwarp();
      write_rows<C>(tot[warp], comp.rg, vec0, nv, lane, a);
      __syncwarp();
    }
    comp = next;
  }
  cp_async_wait<0>();
  if (persistent) return;

  // Split row groups: sum the S partial tiles in warp order, through the (now idle) stage memory.
  __syncthreads();
  auto* red = reinterpret_cast<float(*)[C][32][4]>(smem + act_words);  // [kWarps][C][32][4]
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp][c][lane][e] = acc[c][e];
  }
  __syncthreads();
  if (s == 0 && rg_first < a.n_rg) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = 0.0f;
        for (int w = warp; w < warp + a.split; ++w) v = __fadd_rn(v, red[w][c][lane][e]);
        tot[warp][g + (e >= 2 ? 8 : 0)][8 * c + 2 * t + (e & 1)] = v;
      }
    }
    __syncwarp();
    write_rows<C>(tot[warp], rg_first, vec0, nv, lane, a);
  }
}

// ---- host side ----------------------------------------------------------------------------------------------------

int chunks_for(int nv) { return (3 * nv + 7) / 8; }

// Vectors per slice: 8 (3 chunks) while the slice's prepared activations stay within kSliceSmem, else 5, else 2.
constexpr size_t kSliceSmem = 72 * 1024;
int slice_cap(int64_t n_cols) {
  for (int v : {8, 5, 2}) {
    const SliceLayout lay{static_cast<int>(n_cols / 32), chunks_for(v), v};
    if (lay.slice_bytes() <= kSliceSmem || v == 2) return v;
  }
  return 2;
}

SliceLayout layout_for(int64_t n_cols, int n_vec) {
  const int sv = std::min(n_vec, slice_cap(n_cols));
  return SliceLayout{static_cast<int>(n_cols / 32), chunks_for(sv), sv};
}

// Dynamic shared memory of one block: the slice's activations, then `stages` stages per warp.
size_t dynamic_smem(const SliceLayout& lay, int stages) {
  return (lay.slice_bytes() + 15) / 16 * 16 + static_cast<size_t>(kWarps) * stages * sizeof(Stage);
}

// The most stages (5, 3 or 2) that fit in one block's shared memory beside the activations and the static tiles.
constexpr size_t kBlockSmem = 227 * 1024;
int stages_for(const SliceLayout& lay) {
  const size_t fixed = static_cast<size_t>(kWarps) * kTileRows * lay.c * 8 * sizeof(float);
  for (int st : {5, 3}) {
    if (dynamic_smem(lay, st) + fixed <= kBlockSmem) return st;
  }
  return 2;
}

int n_slices(int n_vec, const SliceLayout& lay) { return (n_vec + lay.slice_vecs - 1) / lay.slice_vecs; }

struct DeviceFacts {
  int sms = 132;
};
DeviceFacts device_facts() {
  static const DeviceFacts facts = [] {
    DeviceFacts f;
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) {
      int n = 0;
      if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0) f.sms = n;
    }
    (void)cudaGetLastError();
    return f;
  }();
  return facts;
}

// Persistent warps when there are many row groups; otherwise S warps per row group so that short matrices still
// spread over the SMs, with S chosen from the shape only (never from n_vec). S stops at 8: with 16 it took one row
// group per block, so every block staged the whole activation slice for 1/16 of the work (attn_gate 58% → 39%).
void pick_split(int64_t n_rg, int64_t n_units, GgmlType type, int* split, int* per) {
  const int64_t target = static_cast<int64_t>(device_facts().sms) * kWarps;  // one block of 16 warps per SM
  if (n_rg >= target) {
    *split = 1;
    *per = static_cast<int>(n_units);
    return;
  }
  int s = 1;
  while (s < 8 && n_rg * s < target && n_units / (2 * s) >= kBatch / 2) s *= 2;
  int p = static_cast<int>((n_units + s - 1) / s);
  if (type == GgmlType::kQ4_K) p = (p + 3) / 4 * 4;  // batches stay inside one super-block
  *split = s == 1 ? 2 : s;                           // S = 1 is reserved for persistent warps
  if (s == 1) p = static_cast<int>(n_units);
  *per = p;
}

template <GgmlType T, int C, int STAGES>
Status launch(const KernelArgs& args, int slices, cudaStream_t stream) {
  const size_t smem = dynamic_smem(args.lay, STAGES);
  // Allow the whole opt-in shared memory once per instantiation (each launch asks only for what it uses).
  static std::atomic<bool> attr_set{false};
  if (!attr_set.load(std::memory_order_acquire)) {
    const int most = static_cast<int>(kBlockSmem - sizeof(float) * kWarps * kTileRows * C * 8);
    KESTREL_CUDA_TRY(
        cudaFuncSetAttribute(gemv_tiled_kernel<T, C, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    attr_set.store(true, std::memory_order_release);
  }
  int blocks = 0;
  if (args.split == 1) {
    blocks = std::min(args.n_rg / kWarps + 1, device_facts().sms);
  } else {
    const int rg_per_block = kWarps / args.split;
    blocks = (args.n_rg + rg_per_block - 1) / rg_per_block;
  }
  gemv_tiled_kernel<T, C, STAGES>
      <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(slices)), kThreads, smem, stream>>>(args);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

template <GgmlType T, int C>
Status launch_stages(const KernelArgs& args, int slices, cudaStream_t stream) {
  const int st = stages_for(args.lay);
  if (st == 5) return launch<T, C, 5>(args, slices, stream);
  if (st == 3) return launch<T, C, 3>(args, slices, stream);
  return launch<T, C, 2>(args, slices, stream);
}

template <GgmlType T>
Status launch_type(const KernelArgs& args, cudaStream_t stream) {
  const int slices = n_slices(args.n_vec, args.lay);
  if (args.lay.c == 1) return launch_stages<T, 1>(args, slices, stream);
  if (args.lay.c == 2) return launch_stages<T, 2>(args, slices, stream);
  return launch_stages<T, 3>(args, slices, stream);
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

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
  if (n_cols <= 0 || n_cols % kUnitElems != 0 || n_vec < 1) return 0;
  const SliceLayout lay = layout_for(n_cols, n_vec);
  return static_cast<uint64_t>(n_slices(n_vec, lay)) * lay.slice_bytes();
}

Status q4_tile(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, std::span<uint8_t> out) {
  if (!q4_tiled_supports(type, n_cols, n_rows)) {
    return make_error(ErrorCode::kInvalidArgument, "q4_tile: " + std::string(ggml_type_name(type)) + " {" +
                                                       std::to_string(n_cols) + ", " + std::to_string(n_rows) +
                                                       "} cannot be tiled (q4_0 needs n_cols % 64, q4_K n_cols % "
                                                       "256, n_rows % 16, n_cols <= 8192)");
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
                                                       " (a multiple of 64 up to 8192) or n_vec " +
                                                       std::to_string(n_vec) + " (1..32) out of range");
  }
  if (x == nullptr || xprep == nullptr || !aligned(x, 16) || !aligned(xprep, 16)) {
    return make_error(ErrorCode::kInvalidArgument, "gemv_tiled_prepare_x: null or misaligned pointer (16 bytes)");
  }
  const SliceLayout lay = layout_for(n_cols, n_vec);
  const int items = static_cast<int>(lay.xf_words());
  const dim3 grid(static_cast<unsigned>(std::min(256, (items + 255) / 256)),
                  static_cast<unsigned>(n_slices(n_vec, lay)));
  prepare_x_kernel<<<grid, 256, 0, stream>>>(x, static_cast<int>(n_cols), n_vec, lay, static_cast<uint8_t*>(xprep));
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
  pick_split(n_rg, n_units, w.type, &args.split, &args.per);
  args.xprep = static_cast<const uint8_t*>(xprep);
  args.lay = layout_for(w.n_cols, n_vec);
  args.n_vec = n_vec;
  args.y = y;
  args.n_rows = w.n_rows;
  if (w.type == GgmlType::kQ4_0) return launch_type<GgmlType::kQ4_0>(args, stream);
  return launch_type<GgmlType::kQ4_K>(args, stream);
}

}  // namespace kestrel::gpu
