// gemm_imma (see gemm_imma.h): a warp multiplies 4 row groups × one segment of up to 8 vectors (4 MMA pairs), unit by
// unit of 64 columns; the fragments, the C start value and the scaling are gemv_imma's (gemv_imma.cu's head derives
// them; imma_tile.cuh's multiply_add is the one-row-group form of the loop below).
//
// Loads: each lane copies its own A words (4 row groups: 16 bytes of quants, 8 of scales) and B words (4 pairs: 16
// bytes of digits, 8 of digit sums) of a unit into its own shared-memory slots with cp.async, kStages - 1 units ahead
// of the multiply, and reads back only what it copied (no barriers: the warps of a block run apart). The copies need
// no registers while in flight, so the 200-odd registers of the accumulators and one unit's fragments leave room for
// two blocks of four warps an SM (loading into registers one unit ahead, one block of eight warps, measured slower).
// Every pair is multiplied even past a segment's n_vec: a branch per pair would put each MMA in its own basic block,
// and nothing would overlap the MMAs' latency.
#include <algorithm>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/gemm_imma.h"
#include "gpu/kernels/imma_prepare.cuh"
#include "gpu/kernels/imma_tile.cuh"
#include "gpu/kernels/smem_optin.cuh"

namespace kestrel::gpu {
namespace {

using imma_prep::kUnitsPerSlice;
using imma_prep::x_layout;
using imma_prep::XLayout;
using imma_tile::half_bits;
using imma_tile::kMagic;
using imma_tile::kMagicF;
using imma_tile::kNibbles;
using imma_tile::kTileRows;
using imma_tile::kUnitElems;
using imma_tile::mma_u8s8;
using imma_tile::pair_sum;

constexpr int kRG = 4;      // row groups a warp holds
constexpr int kNP = 4;      // vector pairs a warp holds (one segment of kImmaSegmentVectors)
constexpr int kWarps = 4;   // warps of a block, along rows: a block is 256 rows × one segment
constexpr int kStages = 4;  // units in flight per warp (kStages - 1 ahead of the one multiplied)
constexpr int kTileRowGroups = kWarps * kRG;
static_assert(2 * kNP == kImmaSegmentVectors, "a warp holds one segment");
// One warp's stage, structure of arrays by slot so that a warp's 16- and 8-byte reads hit distinct banks:
// A quants [r][lane] 16 B, A scales [r][lane] 8 B, B digits [p][lane] 16 B, B digit sums [p][lane] 8 B.
constexpr int kAScaleOff = kRG * 32 * 16;
constexpr int kBOff = kAScaleOff + kRG * 32 * 8;
constexpr int kBSumOff = kBOff + kNP * 32 * 16;
constexpr int kStageBytes = kBSumOff + kNP * 32 * 8;
constexpr size_t kSmemBytes = static_cast<size_t>(kWarps) * kStages * kStageBytes;  // 96 KiB: two blocks an SM

struct GemmArgs {
  const void* base;  // dense: the tiled matrix (segment s holds vectors 8s ..); table: the ImmaSegment table
  const uint8_t* xprep;
  float* y;
  int64_t y_stride;
  const int32_t* n_used;  // table: the segments in use (optional)
  uint32_t meta_off;      // bytes from a matrix's start to its scales
  int n_units;            // 64-column units a row (a multiple of 4)
  int n_rg;               // row groups
  int n_vec;              // dense: vectors
  int n_seg;              // segments (dense: ceil(n_vec / 8); table: the table's length)
  XLayout lay;
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Grid: x = segment, y = tile of 256 rows; the blocks of one row tile are adjacent, so the tile's weights come from
// DRAM once and from L2 for the other segments.
template <bool kTable>
__global__ void __launch_bounds__(kWarps * 32, 2) gemm_imma_q4_0_kernel(GemmArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int seg = static_cast<int>(blockIdx.x);
  const int rg0 = (static_cast<int>(blockIdx.y) * kWarps + warp) * kRG;
  int n_seg = a.n_seg;
  if constexpr (kTable) {
    if (a.n_used != nullptr) n_seg = min(n_seg, *a.n_used);
  }
  if (seg >= n_seg || rg0 >= a.n_rg) return;  // whole warps: nothing below synchronizes the block

  // The segment: its matrix, vectors and output rows (slots past n_vec repeat the last vector; not stored).
  const uint8_t* w;
  int n_vec;
  int vec[2 * kNP];
  int out[2 * kNP];
  if constexpr (kTable) {
    const ImmaSegment* e = static_cast<const ImmaSegment*>(a.base) + seg;
    w = static_cast<const uint8_t*>(e->data);
    n_vec = min(e->n_vec, 2 * kNP);
#pragma unroll
    for (int j = 0; j < 2 * kNP; ++j) {
      vec[j] = e->vec[min(j, max(n_vec - 1, 0))];
      out[j] = e->out[min(j, max(n_vec - 1, 0))];
    }
  } else {
    w = static_cast<const uint8_t*>(a.base);
    n_vec = min(2 * kNP, a.n_vec - seg * 2 * kNP);
#pragma unroll
    for (int j = 0; j < 2 * kNP; ++j) vec[j] = out[j] = seg * 2 * kNP + min(j, n_vec - 1);
  }
  if (n_vec <= 0) return;

  // Per pair p the lane's B vector (g < 4: the pair's first) and C vector (t < 2: the pair's first), as byte offsets
  // from xprep: digits of unit 0 (+ 256 a unit), digit sums of unit 0 (+ 16 a unit); a group's scale lies at its
  // digit-sum offset + sdelta + 4 per group.
  const uint32_t vb = static_cast<uint32_t>(a.lay.vec_bytes());
  uint32_t xf[kNP];
  uint32_t xd[kNP];
#pragma unroll
  for (int p = 0; p < kNP; ++p) {
    const int vf = g < 4 ? vec[2 * p] : vec[2 * p + 1];
    const int vd = t < 2 ? vec[2 * p] : vec[2 * p + 1];
    xf[p] = static_cast<uint32_t>(vf) * vb + static_cast<uint32_t>((g % 4) * 4 + t) * 16;
    xd[p] = static_cast<uint32_t>(vd) * vb + static_cast<uint32_t>(a.lay.frag_bytes()) + (t % 2) * 8;
  }
  const uint32_t sdelta = static_cast<uint32_t>(a.lay.dsum_bytes()) - (t % 2) * 8;
  // The lane's A words of unit 0 per row group, as byte offsets from w (rows past the last group repeat it; not
  // stored): quants + 512 a unit, scales + 64 a unit.
  uint32_t wq[kRG];
  uint32_t wm[kRG];
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
    const uint32_t tile0 = static_cast<uint32_t>(min(rg0 + r, a.n_rg - 1)) * static_cast<uint32_t>(a.n_units);
    wq[r] = tile0 * 512 + lane * 16;
    wm[r] = a.meta_off + tile0 * 64 + g * 8;
  }

  const uint32_t mine =
      static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + static_cast<uint32_t>(warp * kStages * kStageBytes);
  auto issue = [&](int u) {
    if (u < a.n_units) {
      const uint32_t st = mine + static_cast<uint32_t>((u % kStages) * kStageBytes);
      const uint8_t* wu = w + static_cast<uint32_t>(u) * 512;
      const uint8_t* mu = w + static_cast<uint32_t>(u) * 64;
      const uint8_t* xu = a.xprep + static_cast<uint32_t>(u) * 256;
      const uint8_t* du = a.xprep + static_cast<uint32_t>(u) * 16;
#pragma unroll
      for (int r = 0; r < kRG; ++r) {
        cp_async16(st + (r * 32 + lane) * 16, wu + wq[r]);
        cp_async8(st + kAScaleOff + (r * 32 + lane) * 8, mu + wm[r]);
      }
#pragma unroll
      for (int p = 0; p < kNP; ++p) {
        cp_async16(st + kBOff + (p * 32 + lane) * 16, xu + xf[p]);
        cp_async8(st + kBSumOff + (p * 32 + lane) * 8, du + xd[p]);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count right
  };

  float acc[kRG][kNP][2];  // the current group's block sums, rows g and g + 8, in units of digit 2h + 1
  float sum[kRG][kNP][2];  // the groups before, scaled
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
#pragma unroll
    for (int p = 0; p < kNP; ++p) acc[r][p][0] = acc[r][p][1] = sum[r][p][0] = sum[r][p][1] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  float xs[kNP];
  const uint8_t* smem_base = smem + warp * kStages * kStageBytes;
  for (int u = 0; u < a.n_units; ++u) {
    issue(u + kStages - 1);
    if (u % kUnitsPerSlice == 0) {  // the group's scale per vector, used at its end
      const uint8_t* sg = a.xprep + sdelta + static_cast<uint32_t>(u / kUnitsPerSlice) * 4;
#pragma unroll
      for (int p = 0; p < kNP; ++p) xs[p] = *reinterpret_cast<const float*>(sg + xd[p]);
    }
    cp_async_wait<kStages - 1>();
    const uint8_t* st = smem_base + (u % kStages) * kStageBytes;
    uint4 fb[kNP];
    int2 dd[kNP];
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      fb[p] = *reinterpret_cast<const uint4*>(st + kBOff + (p * 32 + lane) * 16);
      dd[p] = *reinterpret_cast<const int2*>(st + kBSumOff + (p * 32 + lane) * 8);
    }
#pragma unroll
    for (int r = 0; r < kRG; ++r) {
      const uint4 q = *reinterpret_cast<const uint4*>(st + (r * 32 + lane) * 16);
      const uint2 d = *reinterpret_cast<const uint2*>(st + kAScaleOff + (r * 32 + lane) * 8);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t pw = h == 0 ? q.x : q.z;  // row g
        const uint32_t qw = h == 0 ? q.y : q.w;  // row g + 8
        const uint32_t a0 = pw & kNibbles, a1 = qw & kNibbles, a2 = (pw >> 4) & kNibbles, a3 = (qw >> 4) & kNibbles;
        const uint32_t sc = h == 0 ? d.x : d.y;
        const float s_g = half_bits(sc & 0xFFFFu);
        const float s_g8 = half_bits(sc >> 16);
#pragma unroll
        for (int p = 0; p < kNP; ++p) {  // every pair, even past n_vec: no branch between the MMAs
          int c[4];
          mma_u8s8(c, a0, a1, a2, a3, h == 0 ? fb[p].x : fb[p].z, h == 0 ? fb[p].y : fb[p].w, 0,
                   kMagic - 8 * (h == 0 ? dd[p].x : dd[p].y));
          acc[r][p][0] = __fmaf_rn(__int_as_float(c[0] * 128 + c[1]) - kMagicF, s_g, acc[r][p][0]);
          acc[r][p][1] = __fmaf_rn(__int_as_float(c[2] * 128 + c[3]) - kMagicF, s_g8, acc[r][p][1]);
        }
      }
    }
    if (u % kUnitsPerSlice == kUnitsPerSlice - 1) {  // a group's end: its scale per vector
#pragma unroll
      for (int p = 0; p < kNP; ++p) {
#pragma unroll
        for (int r = 0; r < kRG; ++r) {
          sum[r][p][0] = __fadd_rn(sum[r][p][0], __fmul_rn(xs[p], acc[r][p][0]));
          sum[r][p][1] = __fadd_rn(sum[r][p][1], __fmul_rn(xs[p], acc[r][p][1]));
          acc[r][p][0] = acc[r][p][1] = 0.0f;
        }
      }
    }
  }
  cp_async_wait<0>();

  // The four digits of each vector joined (lanes t, t ^ 1), then rows g, g + 8 of the lane's vector stored.
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      pair_sum(sum[r][p], lane);
      const int slot = 2 * p + t / 2;
      const int o = t < 2 ? out[2 * p] : out[2 * p + 1];  // out[slot], without indexing the array at run time
      if (t % 2 == 0 && slot < n_vec && rg0 + r < a.n_rg) {
        float* yo = a.y + static_cast<int64_t>(o) * a.y_stride + static_cast<int64_t>(rg0 + r) * kTileRows;
        yo[g] = sum[r][p][0];
        yo[g + 8] = sum[r][p][1];
      }
    }
  }
}

bool aligned(const void* p, uintptr_t al) { return (reinterpret_cast<uintptr_t>(p) % al) == 0; }

GemmArgs base_args(GgmlType type, int64_t n_cols, int64_t n_rows, const void* xprep, float* y, int64_t y_stride) {
  GemmArgs a{};
  a.xprep = static_cast<const uint8_t*>(xprep);
  a.y = y;
  a.y_stride = y_stride;
  a.meta_off = static_cast<uint32_t>(tiled_meta_offset(type, n_cols, n_rows));
  a.n_units = static_cast<int>(n_cols / kUnitElems);
  a.n_rg = static_cast<int>(n_rows / kTileRows);
  a.lay = x_layout(n_cols);
  return a;
}

template <bool kTable>
Status launch(const GemmArgs& a, cudaStream_t stream) {
  KESTREL_TRY(check_smem<gemm_imma_q4_0_kernel<kTable>>(kSmemBytes, "gemm_imma: its operand stages"));
  const dim3 grid(static_cast<unsigned>(a.n_seg),
                  static_cast<unsigned>((a.n_rg + kTileRowGroups - 1) / kTileRowGroups));
  gemm_imma_q4_0_kernel<kTable><<<grid, kWarps * 32, kSmemBytes, stream>>>(a);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

std::string shape_text(GgmlType type, int64_t n_cols, int64_t n_rows) {
  return std::string(ggml_type_name(type)) + " {" + std::to_string(n_cols) + ", " + std::to_string(n_rows) + "}";
}

}  // namespace

bool gemm_imma_supports(GgmlType type, int64_t n_cols, int64_t n_rows) {
  return type == GgmlType::kQ4_0 && n_cols % (kUnitElems * kUnitsPerSlice) == 0 &&
         gemv_imma_supports(type, n_cols, n_rows);
}

Status gemm_imma(const TiledView& w, const void* xprep, int n_vec, float* y, cudaStream_t stream) {
  if (!gemm_imma_supports(w.type, w.n_cols, w.n_rows)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemm_imma: " + shape_text(w.type, w.n_cols, w.n_rows) + " is not a shape it takes");
  }
  if (n_vec < 1 || imma_x_bytes(w.n_cols, n_vec) == 0) {
    return make_error(ErrorCode::kInvalidArgument, "gemm_imma: n_vec " + std::to_string(n_vec) + " out of range");
  }
  KESTREL_TRY(imma_dense_pointers_check("gemm_imma", w, xprep, n_vec, y));
  GemmArgs a = base_args(w.type, w.n_cols, w.n_rows, xprep, y, w.n_rows);
  a.base = w.data;
  a.n_vec = n_vec;
  a.n_seg = (n_vec + kImmaSegmentVectors - 1) / kImmaSegmentVectors;
  return launch<false>(a, stream);
}

Status gemm_imma_segments(GgmlType type, int64_t n_cols, int64_t n_rows, const ImmaSegment* segments, int n_segments,
                          const void* xprep, float* y, int64_t y_stride, cudaStream_t stream, const int32_t* n_used) {
  if (!gemm_imma_supports(type, n_cols, n_rows)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemm_imma_segments: " + shape_text(type, n_cols, n_rows) + " is not a shape it takes");
  }
  if (n_segments < 0 || (n_segments > 0 && segments == nullptr) || xprep == nullptr || y == nullptr ||
      !aligned(xprep, 16) || !aligned(y, 4) || y_stride < n_rows) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemm_imma_segments: bad table, pointer (xprep 16-byte aligned, y 4) or y_stride " +
                          std::to_string(y_stride) + " < n_rows " + std::to_string(n_rows));
  }
  if (n_segments == 0) return ok_status();
  GemmArgs a = base_args(type, n_cols, n_rows, xprep, y, y_stride);
  a.base = segments;
  a.n_used = n_used;
  a.n_seg = n_segments;
  return launch<true>(a, stream);
}

}  // namespace kestrel::gpu
