// gemm_imma (see gemm_imma.h): a warp multiplies 4 row groups × one segment of up to 8 vectors, unit by unit of 64
// columns; the fragments, the C start value and the scaling are gemv_imma's (gemv_imma.cu's head derives them;
// imma_tile.cuh's multiply_add is the one-row-group form of the loop below): Q4_0 scales each block's exact sum in
// f32, Q4_K sums a super-block's sub-blocks times their scales (and mins times digit sums) in int32 and scales once.
//
// An MMA's 8 columns are the digits of its vectors: with four digits a pair of vectors (column 4v + digit; lane t's
// two C columns are digits 2(t & 1), 2(t & 1) + 1 of vector t >> 1, joined across the lane pair at the end), with two
// digits a quad (column 2v + digit; lane t's C columns are both digits of vector t, so a lane ends with its vector's
// sums). Two digits read the prepared form's first two digit words and the digit sums of the first pair, which are
// exactly the two-digit form's (imma_prepare.cuh: D = 128·Σd0 + Σd1).
//
// Loads: each lane copies its own A words (4 row groups: 16 bytes of quants, 8 of scales) and B words (per vector set:
// 16 bytes of digits, 8 of digit sums) of a unit into its own shared-memory slots with cp.async, kStages - 1 units
// ahead of the multiply, and reads back only what it copied (no barriers: the warps of a block run apart). The copies
// need no registers while in flight, so the 200-odd registers of the accumulators and one unit's fragments leave room
// for two blocks of four warps an SM (loading into registers one unit ahead, one block of eight warps, measured
// slower). Every vector set is multiplied even past a segment's n_vec: a branch per set would put each MMA in its own
// basic block, and nothing would overlap the MMAs' latency.
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
using imma_tile::k_field;
using imma_tile::kDigitUnit0;
using imma_tile::kMagic;
using imma_tile::kMagicF;
using imma_tile::kNibbles;
using imma_tile::kTileRows;
using imma_tile::kUnitElems;
using imma_tile::mma_u8s8;
using imma_tile::pair_sum;

constexpr int kRG = 4;      // row groups a warp holds
constexpr int kWarps = 4;   // warps of a block, along rows: a block is 256 rows × one segment
constexpr int kStages = 4;  // units in flight per warp (kStages - 1 ahead of the one multiplied)
constexpr int kTileRowGroups = kWarps * kRG;
constexpr int kMaxSets = 4;  // vector sets of a segment at four digits (pairs)

// A warp's vector sets for kDigits digits: sets of 8 / kDigits vectors (one MMA's columns), a segment's worth.
template <int kDigits>
struct Sets {
  static_assert(kDigits == 4 || kDigits == 2, "four or two digits");
  static constexpr int kPerSet = 8 / kDigits;                   // vectors an MMA holds
  static constexpr int kCount = kImmaSegmentVectors / kPerSet;  // sets a warp holds
  static constexpr int kLanesPerVector = kDigits / 2;           // lanes t whose C columns are one vector's digits
  static_assert(kCount * kPerSet == kImmaSegmentVectors && kCount <= kMaxSets, "a warp holds one segment");
};

// One warp's stage, structure of arrays by slot so that a warp's 16- and 8-byte reads hit distinct banks:
// A quants [r][lane] 16 B, A scales [r][lane] 8 B, B digits [p][lane] 16 B, B digit sums [p][lane] 8 B (room for
// kMaxSets sets; two digits use half of B's).
constexpr int kAScaleOff = kRG * 32 * 16;
constexpr int kBOff = kAScaleOff + kRG * 32 * 8;
constexpr int kBSumOff = kBOff + kMaxSets * 32 * 16;
constexpr int kStageBytes = kBSumOff + kMaxSets * 32 * 8;
// Q4_K: a warp's super-block heads (rows g and g + 8 of each row group: d, dmin and the packed scales and mins, 32
// bytes) for the current group and the next, in a ring of two slots after its stages: [slot][r][g] 32 bytes, copied
// by lane t = 0 of each g with the group's first unit and read by its four lanes.
constexpr int kHeadSlotBytes = kRG * 8 * 32;
constexpr int kWarpBytes = kStages * kStageBytes + 2 * kHeadSlotBytes;
template <GgmlType T>
constexpr size_t kSmemBytes = static_cast<size_t>(kWarps) *
                              (T == GgmlType::kQ4_K ? kWarpBytes : kStages * kStageBytes);  // 104 / 96 KiB: 2 an SM

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

// out[base + i] for a lane's i in [0, N), without indexing the array at run time (it stays in registers).
template <int N>
__device__ __forceinline__ int pick(const int (&v)[kImmaSegmentVectors], int base, int i) {
  int r = v[base];
#pragma unroll
  for (int j = 1; j < N; ++j) r = i == j ? v[base + j] : r;
  return r;
}

// Grid: x = segment, y = tile of 256 rows; the blocks of one row tile are adjacent, so the tile's weights come from
// DRAM once and from L2 for the other segments. T: Q4_0 (per 32-element block an f16 scale: the exact float trick
// per MMA) or Q4_K (per 256-column super-block d and dmin, per 32-element sub-block 6-bit scale and min: integer sums
// over the super-block, gemv_imma's Q4_K arithmetic).
template <bool kTable, int kDigits, GgmlType T>
__global__ void __launch_bounds__(kWarps * 32, 2) gemm_imma_kernel(GemmArgs a) {
  using S = Sets<kDigits>;
  constexpr int kNS = S::kCount;
  constexpr bool kK = T == GgmlType::kQ4_K;
  static_assert(T == GgmlType::kQ4_0 || kK, "Q4_0 or Q4_K");
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
  int vec[kImmaSegmentVectors];
  int out[kImmaSegmentVectors];
  if constexpr (kTable) {
    const ImmaSegment* e = static_cast<const ImmaSegment*>(a.base) + seg;
    w = static_cast<const uint8_t*>(e->data);
    n_vec = min(e->n_vec, kImmaSegmentVectors);
#pragma unroll
    for (int j = 0; j < kImmaSegmentVectors; ++j) {
      vec[j] = e->vec[min(j, max(n_vec - 1, 0))];
      out[j] = e->out[min(j, max(n_vec - 1, 0))];
    }
  } else {
    w = static_cast<const uint8_t*>(a.base);
    n_vec = min(kImmaSegmentVectors, a.n_vec - seg * kImmaSegmentVectors);
#pragma unroll
    for (int j = 0; j < kImmaSegmentVectors; ++j) vec[j] = out[j] = seg * kImmaSegmentVectors + min(j, n_vec - 1);
  }
  if (n_vec <= 0) return;

  // Per set p the lane's B vector and digit (column g) and its C vector and digit pair h (columns 2t, 2t + 1), as byte
  // offsets from xprep: digits of unit 0 (+ 256 a unit), digit sums of unit 0 (+ 16 a unit); a group's scale lies at
  // its digit-sum offset + sdelta + 4 per group.
  const uint32_t vb = static_cast<uint32_t>(a.lay.vec_bytes());
  const int h = t % S::kLanesPerVector;
  uint32_t xf[kNS];
  uint32_t xd[kNS];
#pragma unroll
  for (int p = 0; p < kNS; ++p) {
    const int vf = pick<S::kPerSet>(vec, p * S::kPerSet, g / kDigits);
    const int vd = pick<S::kPerSet>(vec, p * S::kPerSet, t / S::kLanesPerVector);
    xf[p] = static_cast<uint32_t>(vf) * vb + static_cast<uint32_t>((g % kDigits) * 4 + t) * 16;
    xd[p] = static_cast<uint32_t>(vd) * vb + static_cast<uint32_t>(a.lay.frag_bytes()) + h * 8;
  }
  const uint32_t sdelta = static_cast<uint32_t>(a.lay.dsum_bytes()) - h * 8;
  // The lane's A words of unit 0 per row group, as byte offsets from w (rows past the last group repeat it; not
  // stored): quants + 512 a unit; Q4_0 scales + 64 a unit, Q4_K row g's super-block head + 256 a group (+ 64 a unit).
  uint32_t wq[kRG];
  uint32_t wm[kRG];
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
    const uint32_t tile0 = static_cast<uint32_t>(min(rg0 + r, a.n_rg - 1)) * static_cast<uint32_t>(a.n_units);
    wq[r] = tile0 * 512 + lane * 16;
    wm[r] = a.meta_off + tile0 * 64 + g * (kK ? 16 : 8);
  }

  const uint32_t mine = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                        static_cast<uint32_t>(warp * (kK ? kWarpBytes : kStages * kStageBytes));
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
        if constexpr (!kK) cp_async8(st + kAScaleOff + (r * 32 + lane) * 8, mu + wm[r]);
      }
      if constexpr (kK) {
        if (u % kUnitsPerSlice == 0 && t == 0) {  // the group's heads, rows g and g + 8
          const uint32_t slot =
              mine + static_cast<uint32_t>(kStages * kStageBytes + ((u / kUnitsPerSlice) % 2) * kHeadSlotBytes);
#pragma unroll
          for (int r = 0; r < kRG; ++r) {
            cp_async16(slot + (r * 8 + g) * 32, mu + wm[r]);
            cp_async16(slot + (r * 8 + g) * 32 + 16, mu + wm[r] + 128);
          }
        }
      }
#pragma unroll
      for (int p = 0; p < kNS; ++p) {
        cp_async16(st + kBOff + (p * 32 + lane) * 16, xu + xf[p]);
        cp_async8(st + kBSumOff + (p * 32 + lane) * 8, du + xd[p]);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count right
  };

  // Q4_0: acc holds the current group's block sums (f32, scaled per block); Q4_K: isum the sub-block sums times their
  // scales and msum the mins times the digit sums (int32, over the super-block). Rows g and g + 8, in units of the
  // lane's second digit; sum: the groups before, scaled.
  [[maybe_unused]] float acc[kRG][kNS][2];
  [[maybe_unused]] int isum[kRG][kNS][2];
  [[maybe_unused]] int msum[kRG][kNS][2];
  float sum[kRG][kNS][2];
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
#pragma unroll
    for (int p = 0; p < kNS; ++p) {
      sum[r][p][0] = sum[r][p][1] = 0.0f;
      if constexpr (kK) {
        isum[r][p][0] = isum[r][p][1] = msum[r][p][0] = msum[r][p][1] = 0;
      } else {
        acc[r][p][0] = acc[r][p][1] = 0.0f;
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  float xs[kNS];
  const uint8_t* smem_base = smem + warp * (kK ? kWarpBytes : kStages * kStageBytes);
  for (int u = 0; u < a.n_units; ++u) {
    issue(u + kStages - 1);
    if (u % kUnitsPerSlice == 0) {  // the group's scale per vector, used at its end
      const uint8_t* sg = a.xprep + sdelta + static_cast<uint32_t>(u / kUnitsPerSlice) * 4;
#pragma unroll
      for (int p = 0; p < kNS; ++p) xs[p] = *reinterpret_cast<const float*>(sg + xd[p]);
    }
    cp_async_wait<kStages - 1>();
    // Q4_K: the heads lane t = 0 copied become visible to the other lanes of its g (and every lane is past the reads
    // of the slot the next group's copy overwrites).
    if constexpr (kK) {
      if (u % kUnitsPerSlice == 0) __syncwarp();
    }
    const uint8_t* st = smem_base + (u % kStages) * kStageBytes;
    [[maybe_unused]] const uint8_t* heads =
        smem_base + kStages * kStageBytes + ((u / kUnitsPerSlice) % 2) * kHeadSlotBytes;
    uint4 fb[kNS];
    int2 dd[kNS];
#pragma unroll
    for (int p = 0; p < kNS; ++p) {
      fb[p] = *reinterpret_cast<const uint4*>(st + kBOff + (p * 32 + lane) * 16);
      dd[p] = *reinterpret_cast<const int2*>(st + kBSumOff + (p * 32 + lane) * 8);
    }
#pragma unroll
    for (int r = 0; r < kRG; ++r) {
      const uint4 q = *reinterpret_cast<const uint4*>(st + (r * 32 + lane) * 16);
      if constexpr (kK) {
        // The unit's two sub-blocks (low nibbles: 2j, high: 2j + 1), each scale and min 6 bits of the unit's field.
        const uint4 hg = *reinterpret_cast<const uint4*>(heads + (r * 8 + g) * 32);
        const uint4 hg8 = *reinterpret_cast<const uint4*>(heads + (r * 8 + g) * 32 + 16);
        const uint32_t f0 = k_field(hg, u % kUnitsPerSlice);
        const uint32_t f8 = k_field(hg8, u % kUnitsPerSlice);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const int sh = 4 * b;
          const uint32_t a0 = (q.x >> sh) & kNibbles, a1 = (q.y >> sh) & kNibbles, a2 = (q.z >> sh) & kNibbles,
                         a3 = (q.w >> sh) & kNibbles;
          const int sc0 = static_cast<int>((f0 >> (6 * b)) & 63u), mn0 = static_cast<int>((f0 >> (12 + 6 * b)) & 63u);
          const int sc8 = static_cast<int>((f8 >> (6 * b)) & 63u), mn8 = static_cast<int>((f8 >> (12 + 6 * b)) & 63u);
#pragma unroll
          for (int p = 0; p < kNS; ++p) {  // every set, even past n_vec: no branch between the MMAs
            int c[4];
            mma_u8s8(c, a0, a1, a2, a3, b == 0 ? fb[p].x : fb[p].z, b == 0 ? fb[p].y : fb[p].w, 0, 0);
            const int dsum = b == 0 ? dd[p].x : dd[p].y;
            // |128·c0 + c1| < 2^22, times sc < 64, over 8 sub-blocks: < 2^31.
            isum[r][p][0] += (c[0] * 128 + c[1]) * sc0;
            isum[r][p][1] += (c[2] * 128 + c[3]) * sc8;
            msum[r][p][0] += mn0 * dsum;
            msum[r][p][1] += mn8 * dsum;
          }
        }
      } else {
        const uint2 d = *reinterpret_cast<const uint2*>(st + kAScaleOff + (r * 32 + lane) * 8);
#pragma unroll
        for (int b = 0; b < 2; ++b) {              // the unit's two blocks
          const uint32_t pw = b == 0 ? q.x : q.z;  // row g
          const uint32_t qw = b == 0 ? q.y : q.w;  // row g + 8
          const uint32_t a0 = pw & kNibbles, a1 = qw & kNibbles, a2 = (pw >> 4) & kNibbles, a3 = (qw >> 4) & kNibbles;
          const uint32_t sc = b == 0 ? d.x : d.y;
          const float s_g = half_bits(sc & 0xFFFFu);
          const float s_g8 = half_bits(sc >> 16);
#pragma unroll
          for (int p = 0; p < kNS; ++p) {  // every set, even past n_vec: no branch between the MMAs
            int c[4];
            mma_u8s8(c, a0, a1, a2, a3, b == 0 ? fb[p].x : fb[p].z, b == 0 ? fb[p].y : fb[p].w, 0,
                     kMagic - 8 * (b == 0 ? dd[p].x : dd[p].y));
            acc[r][p][0] = __fmaf_rn(__int_as_float(c[0] * 128 + c[1]) - kMagicF, s_g, acc[r][p][0]);
            acc[r][p][1] = __fmaf_rn(__int_as_float(c[2] * 128 + c[3]) - kMagicF, s_g8, acc[r][p][1]);
          }
        }
      }
    }
    if (u % kUnitsPerSlice == kUnitsPerSlice - 1) {  // a group's end: its scale per vector
#pragma unroll
      for (int r = 0; r < kRG; ++r) {
        [[maybe_unused]] float dg[2], dm[2];
        if constexpr (kK) {
          const uint32_t d0 = *reinterpret_cast<const uint32_t*>(heads + (r * 8 + g) * 32);
          const uint32_t d8 = *reinterpret_cast<const uint32_t*>(heads + (r * 8 + g) * 32 + 16);
          dg[0] = half_bits(d0 & 0xFFFFu), dm[0] = half_bits(d0 >> 16);
          dg[1] = half_bits(d8 & 0xFFFFu), dm[1] = half_bits(d8 >> 16);
        }
#pragma unroll
        for (int p = 0; p < kNS; ++p) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            if constexpr (kK) {
              const float v = __fmaf_rn(dg[i], static_cast<float>(isum[r][p][i]),
                                        -__fmul_rn(dm[i], static_cast<float>(msum[r][p][i])));
              sum[r][p][i] = __fadd_rn(sum[r][p][i], __fmul_rn(xs[p], v));
              isum[r][p][i] = msum[r][p][i] = 0;
            } else {
              sum[r][p][i] = __fadd_rn(sum[r][p][i], __fmul_rn(xs[p], acc[r][p][i]));
              acc[r][p][i] = 0.0f;
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // Four digits: a vector's digits joined over the lane pair t, t ^ 1, then lane t even stores; two digits: the sums
  // are in units of digit 1 (128^−1 of the group scale) and every lane stores its own vector. Rows g, g + 8.
#pragma unroll
  for (int r = 0; r < kRG; ++r) {
#pragma unroll
    for (int p = 0; p < kNS; ++p) {
      if constexpr (kDigits == 4) {
        pair_sum(sum[r][p], lane);
      } else {
        sum[r][p][0] = __fmul_rn(sum[r][p][0], kDigitUnit0);
        sum[r][p][1] = __fmul_rn(sum[r][p][1], kDigitUnit0);
      }
      const int i = t / S::kLanesPerVector;
      const int o = pick<S::kPerSet>(out, p * S::kPerSet, i);
      if (h == 0 && p * S::kPerSet + i < n_vec && rg0 + r < a.n_rg) {
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

template <bool kTable, int kDigits, GgmlType T>
Status launch_kernel(const GemmArgs& a, cudaStream_t stream) {
  constexpr auto kernel = gemm_imma_kernel<kTable, kDigits, T>;
  KESTREL_TRY(check_smem<kernel>(kSmemBytes<T>, "gemm_imma: its operand stages"));
  const dim3 grid(static_cast<unsigned>(a.n_seg),
                  static_cast<unsigned>((a.n_rg + kTileRowGroups - 1) / kTileRowGroups));
  kernel<<<grid, kWarps * 32, kSmemBytes<T>, stream>>>(a);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

template <bool kTable>
Status launch(const GemmArgs& a, GgmlType type, GemmDigits digits, cudaStream_t stream) {
  const bool two = digits == GemmDigits::kTwo;
  if (type == GgmlType::kQ4_K) {
    return two ? launch_kernel<kTable, 2, GgmlType::kQ4_K>(a, stream)
               : launch_kernel<kTable, 4, GgmlType::kQ4_K>(a, stream);
  }
  return two ? launch_kernel<kTable, 2, GgmlType::kQ4_0>(a, stream)
             : launch_kernel<kTable, 4, GgmlType::kQ4_0>(a, stream);
}

Status bad_digits(const char* what, GemmDigits digits) {
  return make_error(ErrorCode::kInvalidArgument,
                    std::string(what) + ": digits " + std::to_string(static_cast<int>(digits)) + " (4 or 2)");
}

std::string shape_text(GgmlType type, int64_t n_cols, int64_t n_rows) {
  return std::string(ggml_type_name(type)) + " {" + std::to_string(n_cols) + ", " + std::to_string(n_rows) + "}";
}

}  // namespace

bool gemm_imma_supports(GgmlType type, int64_t n_cols, int64_t n_rows) {
  return (type == GgmlType::kQ4_0 || type == GgmlType::kQ4_K) && n_cols % (kUnitElems * kUnitsPerSlice) == 0 &&
         gemv_imma_supports(type, n_cols, n_rows);
}

Status gemm_imma(const TiledView& w, const void* xprep, int n_vec, float* y, cudaStream_t stream, GemmDigits digits) {
  if (!gemm_digits_valid(digits)) return bad_digits("gemm_imma", digits);
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
  return launch<false>(a, w.type, digits, stream);
}

Status gemm_imma_segments(GgmlType type, int64_t n_cols, int64_t n_rows, const ImmaSegment* segments, int n_segments,
                          const void* xprep, float* y, int64_t y_stride, cudaStream_t stream, const int32_t* n_used,
                          GemmDigits digits) {
  if (!gemm_digits_valid(digits)) return bad_digits("gemm_imma_segments", digits);
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
  return launch<true>(a, type, digits, stream);
}

}  // namespace kestrel::gpu
