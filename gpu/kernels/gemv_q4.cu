// gemv_q4 (see gemv_q4.h): GEMV v2 for Q4_0 and Q4_K rows of whole 144-byte groups (256 elements).
//
// Both types pack 256 elements into 144 bytes (8 Q4_0 blocks, or 1 Q4_K block), so a row is a run of 9-unit
// groups of aligned 16-byte units. A warp owns R consecutive rows and walks them in steps of kStepElems
// (2048) elements = kStepUnits (72) units per row: for all R rows at once its lanes issue the step's 16-byte
// loads (consecutive lanes, consecutive units: coalesced; 3 loads per row per lane, 12 in flight per lane, streaming
// cache hint), park them in the warp's slice of shared memory, and lane l then takes elements 64l .. 64l + 63 of
// the step (Q4_0: blocks 2l and 2l + 1; Q4_K: chunk l % 4 of block l / 4, i.e. sub-blocks 2(l % 4) and
// 2(l % 4) + 1). It reads its quants as 32-bit words (stride 9 words across lanes for Q4_0: no bank conflict),
// turns 8 nibbles at a time into floats with integer ops (mask, byte-permute into 2^23 + q, one subtract: exact),
// dequantizes each element exactly as Dequant<T>::elem (__fmul_rn/__fsub_rn, same order), and multiplies the 8
// weights of each of the R rows into every vector's accumulator, so each 8-float slice of x (two 16-byte loads)
// is loaded once per vector for R rows. Vectors go in slices of kVecSlice along grid.y (the weight is then
// re-read from L2, not HBM, for n_vec > 8), which keeps the accumulators in registers.
//
// R (rows per warp) is 4 for >= 8192 rows, 2 for >= 2048, else 1, so short matrices still fill the SMs.
//
// Order: lane l sums its elements in ascending order across steps, then a fixed xor-butterfly sums the lanes; the
// order depends only on the shape, so runs are bit-identical and y[v] does not depend on n_vec.
#include <cstdint>

#include "core/quant/blocks.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/dequant.cuh"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/gemv_q4.h"

namespace kestrel::gpu::detail {
namespace {

constexpr int kWarps = 4;  // warps per block; each owns R rows (launch_rows picks R in {1, 2, 4})
constexpr int kThreads = 32 * kWarps;
// Resident blocks per SM the register budget must allow: 4 (16 warps, <= 128 registers) while the accumulators
// are few, 3 (12 warps, <= 168 registers) for 4 and 8 vectors, where 128 would spill.
constexpr int min_blocks(int nv) { return nv <= 2 ? 4 : 3; }
constexpr int kVecSlice = 8;    // vectors per grid.y slice
constexpr int kStepUnits = 72;  // 16-byte units of a row per step: 8 groups of 9 (1152 bytes)
constexpr int kStepElems = 2048;
constexpr int kGroupUnits = 9;  // 144 bytes = 256 elements
constexpr int kUnitsPerLane = (kStepUnits + 31) / 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
static_assert(kStepUnits % kGroupUnits == 0 && kStepUnits / kGroupUnits * 256 == kStepElems);
static_assert(kStepElems == 64 * 32, "each lane takes 64 elements of a step");

// 2^23 + q for the byte j (0..3) of `m` (q = that byte, < 256): the float's mantissa holds q exactly.
__device__ __forceinline__ float magic_byte(uint32_t m, int j) {
  return __uint_as_float(__byte_perm(m, 0x4B000000u, 0x7440u | static_cast<unsigned>(j)));
}

// Quants of 8 consecutive elements: nibble `nib` (0 low, 1 high) of the 8 bytes in words a (bytes 0-3) and b
// (bytes 4-7), each as 2^23 + q.
__device__ __forceinline__ void magic_nibbles(uint32_t a, uint32_t b, int nib, float (&f)[8]) {
  const uint32_t ma = (a >> (4 * nib)) & 0x0F0F0F0Fu;
  const uint32_t mb = (b >> (4 * nib)) & 0x0F0F0F0Fu;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f[j] = magic_byte(ma, j);
    f[4 + j] = magic_byte(mb, j);
  }
}

// Per-row, per-half (32 elements) decoding state of one lane.
struct Half {
  const uint32_t* words;  // the row's staged step, as 32-bit words
  float scale;            // Q4_0: d; Q4_K: step (d * sc)
  float offset;           // Q4_K: dmin * m; unused for Q4_0
};

template <GgmlType T>
__device__ __forceinline__ Half half_setup(const uint32_t* words, int lane, int h) {
  Half s{words, 0.0f, 0.0f};
  if constexpr (T == GgmlType::kQ4_0) {
    // Lane's 36 bytes are words 9l .. 9l + 8: block A = d (low half of word 9l) + 16 qs bytes, block B = d (high
    // half of word 9l + 4) + words 9l + 5 .. 9l + 8.
    const uint32_t w0 = words[9 * lane + 4 * h];
    s.scale = dq_fp16_to_f32(static_cast<uint16_t>(h == 0 ? (w0 & 0xFFFFu) : (w0 >> 16)));
  } else {
    static_assert(T == GgmlType::kQ4_K);
    const auto* b = reinterpret_cast<const BlockQ4_K*>(words) + lane / 4;
    dq_k4_step_offset(b, 2 * (lane % 4) + h, &s.scale, &s.offset);
  }
  return s;
}

// Weights of elements 8g .. 8g + 7 of half h of the lane's 64 elements, each bit-identical to Dequant<T>::elem.
template <GgmlType T>
__device__ __forceinline__ void weights8(const Half& s, int lane, int h, int g, float (&wv)[8]) {
  float f[8];
  if constexpr (T == GgmlType::kQ4_0) {
    // Element i < 16: low nibble of qs byte i; i >= 16: high nibble of byte i - 16. Bytes 8(g & 1) .. + 7.
    const int t = 2 * (g & 1);
    uint32_t a;
    uint32_t b;
    if (h == 0) {  // block A's qs start 2 bytes into word 9l
      const uint32_t* p = s.words + 9 * lane + t;
      a = __funnelshift_r(p[0], p[1], 16);
      b = __funnelshift_r(p[1], p[2], 16);
    } else {
      const uint32_t* p = s.words + 9 * lane + 5 + t;
      a = p[0];
      b = p[1];
    }
    magic_nibbles(a, b, g >> 1, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) wv[j] = __fmul_rn(__fsub_rn(f[j], 8388616.0f), s.scale);  // (q - 8) * d
  } else {
    // Sub-block 2c + h (c = lane % 4): element i is nibble h of byte i of the chunk's 32 qs bytes.
    const auto* b = reinterpret_cast<const BlockQ4_K*>(s.words) + lane / 4;
    const auto* q = reinterpret_cast<const uint32_t*>(b->qs) + 8 * (lane % 4) + 2 * g;
    magic_nibbles(q[0], q[1], h, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) wv[j] = __fsub_rn(__fmul_rn(s.scale, __fsub_rn(f[j], 8388608.0f)), s.offset);
  }
}

// w: n_out rows of row_bytes (a multiple of 144); x: f32 [n_vec, n_in]; y: f32 [n_vec, n_out]; this block's
// vectors are blockIdx.y * kVecSlice .. + min(kVecSlice, n_vec - that) - 1, at most NV of them.
template <GgmlType T, int NV, int R>
__global__ void __launch_bounds__(kThreads, min_blocks(NV))
    gemv_q4_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t n_in, int64_t n_out,
                   const float* __restrict__ x, int n_vec, float* __restrict__ y) {
  __shared__ uint4 stage[kWarps][R][kStepUnits];

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R;
  if (row0 >= n_out) return;  // whole warp; no block-wide barrier follows
  const int v0 = static_cast<int>(blockIdx.y) * kVecSlice;
  const int nv = n_vec - v0 < NV ? n_vec - v0 : NV;
  x += static_cast<int64_t>(v0) * n_in;
  y += static_cast<int64_t>(v0) * n_out;

  const uint4* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r < n_out ? row0 + r : n_out - 1;  // rows past the end repeat the last; not written
    rows[r] = reinterpret_cast<const uint4*>(w + row * row_bytes);
  }
  float acc[R][NV];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int v = 0; v < NV; ++v) acc[r][v] = 0.0f;
  }

  const int64_t units_total = row_bytes / 16;
  for (int64_t s0 = 0; s0 < units_total; s0 += kStepUnits) {
    const int units = units_total - s0 < kStepUnits ? static_cast<int>(units_total - s0) : kStepUnits;
    uint4 raw[R][kUnitsPerLane];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int k = 0; k < kUnitsPerLane; ++k) {
        const int u = lane + 32 * k;
        if (u < units) raw[r][k] = __ldcs(rows[r] + s0 + u);
      }
    }
    __syncwarp();  // every lane is done reading the previous step from the slice
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int k = 0; k < kUnitsPerLane; ++k) {
        const int u = lane + 32 * k;
        if (u < units) stage[warp][r][u] = raw[r][k];
      }
    }
    __syncwarp();

    // The lane's 64 elements lie in group lane / 4 of the step, present when the step reaches that far.
    if (kGroupUnits * (lane / 4 + 1) <= units) {
      const float* xl = x + s0 / kStepUnits * kStepElems + 64 * lane;
#pragma unroll 1
      for (int h = 0; h < 2; ++h) {
        Half hs[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          hs[r] = half_setup<T>(reinterpret_cast<const uint32_t*>(stage[warp][r]), lane, h);
        }
#pragma unroll 1
        for (int g = 0; g < 4; ++g) {
          float wv[R][8];
#pragma unroll
          for (int r = 0; r < R; ++r) weights8<T>(hs[r], lane, h, g, wv[r]);
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            if (v < nv) {
              const auto* xp = reinterpret_cast<const float4*>(xl + v * n_in + 32 * h + 8 * g);
              const float4 a = __ldg(xp);
              const float4 b = __ldg(xp + 1);
              const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
              for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[r][v] = fmaf(wv[r][j], xv[j], acc[r][v]);
              }
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int v = 0; v < NV; ++v) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) acc[r][v] += __shfl_xor_sync(kFullMask, acc[r][v], offset);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      if (v < nv && row0 + r < n_out && lane == (r * NV + v) % 32) y[v * n_out + row0 + r] = acc[r][v];
    }
  }
}

template <GgmlType T, int NV, int R>
Status launch(const DeviceMatrixView& w, int64_t row_bytes, const float* x, int n_vec, float* y, cudaStream_t stream) {
  constexpr int64_t kRowsPerBlock = static_cast<int64_t>(kWarps) * R;
  const dim3 grid(static_cast<unsigned>((w.n_rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((n_vec + kVecSlice - 1) / kVecSlice));
  gemv_q4_kernel<T, NV, R>
      <<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(w.data), row_bytes, w.n_cols, w.n_rows, x, n_vec, y);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

template <GgmlType T, int R>
Status launch_bucket(const DeviceMatrixView& w, int64_t row_bytes, const float* x, int n_vec, float* y,
                     cudaStream_t stream) {
  if (n_vec <= 1) return launch<T, 1, R>(w, row_bytes, x, n_vec, y, stream);
  if (n_vec <= 2) return launch<T, 2, R>(w, row_bytes, x, n_vec, y, stream);
  if (n_vec <= 4) return launch<T, 4, R>(w, row_bytes, x, n_vec, y, stream);
  return launch<T, kVecSlice, R>(w, row_bytes, x, n_vec, y, stream);
}

// Rows per warp from the row count alone (never n_vec; a row's summation order does not depend on it either):
// 4 rows share each x load where there are enough rows to fill the 132 SMs (>= 8192 rows: >= 512 blocks),
// fewer on shorter matrices so that they still spread over the SMs (2048 rows at 2 per warp: 256 blocks).
template <GgmlType T>
Status launch_rows(const DeviceMatrixView& w, int64_t row_bytes, const float* x, int n_vec, float* y,
                   cudaStream_t stream) {
  if (w.n_rows >= 8192) return launch_bucket<T, 4>(w, row_bytes, x, n_vec, y, stream);
  if (w.n_rows >= 2048) return launch_bucket<T, 2>(w, row_bytes, x, n_vec, y, stream);
  return launch_bucket<T, 1>(w, row_bytes, x, n_vec, y, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemv_q4_applies(const DeviceMatrixView& w, const float* x) {
  return (w.type == GgmlType::kQ4_0 || w.type == GgmlType::kQ4_K) && w.n_cols > 0 && w.n_cols % 256 == 0 &&
         aligned16(w.data) && aligned16(x);
}

Status gemv_q4(const DeviceMatrixView& w, int64_t row_bytes, const float* x, int n_vec, float* y, cudaStream_t stream) {
  static_assert(kGemvMaxVectors <= 65535 * kVecSlice);
  if (w.type == GgmlType::kQ4_0) return launch_rows<GgmlType::kQ4_0>(w, row_bytes, x, n_vec, y, stream);
  if (w.type == GgmlType::kQ4_K) return launch_rows<GgmlType::kQ4_K>(w, row_bytes, x, n_vec, y, stream);
  return make_error(ErrorCode::kInternal, "gemv_q4: called for a type it does not take");
}

}  // namespace kestrel::gpu::detail
