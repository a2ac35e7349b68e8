// gemv (see gemv.h): one kernel template over the GGUF type (gpu/kernels/dequant.cuh's traits) and the number of
// activation vectors rounded up to a bucket (1, 2, 4, 8, 16, 32), so the weight is read once for all vectors.
//
// Launch: blocks of kWarps warps; warp w of block b owns row 4b + w. The warp walks its row in chunks of
// kChunkElems elements: its 32 lanes copy the chunk's raw bytes into the warp's slice of shared memory with
// 16-byte loads of the aligned 16-byte units that cover it (consecutive lanes, consecutive units: coalesced;
// streaming cache hint, the weight is read once), where only the first and last unit, partly outside the chunk,
// are assembled from 2-byte loads of the bytes inside it (rows start anywhere 2-byte aligned, e.g. Q4_0's
// 18-byte blocks, and no byte outside the matrix is read). Then lane l takes the groups of 8 consecutive elements
// l, l + 32, ... of the chunk: it dequantizes the group from shared memory (scale decoded once per group) and
// accumulates w · x[v] in f32 for every vector v, reading x with 16-byte loads through the read-only cache,
// where the block's four rows share it. A fixed xor-butterfly of shuffles sums the 32 lanes; lane v writes
// y[v]. No atomics and a summation order that depends only on the shape, so repeated runs are bit-identical and
// y[v] is the same whatever n_vec. Tested against ref::matvec_batch in tests/gpu/test_gemv.cpp.
#include <cstdint>
#include <limits>
#include <string>

#include "core/gguf/ggml_type.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/dequant.cuh"
#include "gpu/kernels/dequant_group.cuh"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/gemv_q4.h"
#include "gpu/kernels/stage_row.cuh"

namespace kestrel::gpu {
namespace {

constexpr int kWarps = 4;  // rows per block, one per warp
constexpr int kThreads = 32 * kWarps;
constexpr int kChunkElems = 1024;  // elements of a row staged per step (a multiple of every block size)
constexpr int kGroup =
    kDequantGroup;  // consecutive elements one lane takes per step (divides 16: no block/scale crossing)
constexpr unsigned kFullMask = 0xFFFFFFFFu;
static_assert(kChunkElems % (32 * kGroup) == 0 && 16 % kGroup == 0);

// Shared-memory geometry of one chunk of type T.
template <GgmlType T>
struct ChunkShape {
  using D = Dequant<T>;
  static_assert(kChunkElems % D::kBlockElems == 0);
  static constexpr int kBytes = kChunkElems / D::kBlockElems * static_cast<int>(sizeof(typename D::Block));
  static constexpr int kUnits = stage_row::units_for(kBytes);
  static constexpr int kUnitsPerLane = (kUnits + 31) / 32;
};

// w: n_out rows of row_bytes; x: f32 [n_vec, n_in]; y: f32 [n_vec, n_out]; n_vec <= NV.
template <GgmlType T, int NV>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t n_in, int64_t n_out,
                const float* __restrict__ x, int n_vec, float* __restrict__ y) {
  using D = Dequant<T>;
  using Block = typename D::Block;
  using Shape = ChunkShape<T>;
  __shared__ uint4 stage[kWarps][Shape::kUnits];

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= n_out) return;  // whole warp; no block-wide barrier follows

  const uint8_t* row_ptr = w + row * row_bytes;
  // Groups start at multiples of 8 elements, so with this their x is 16-byte aligned.
  const bool x_vec4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 && n_in % 4 == 0;
  float acc[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) acc[v] = 0.0f;

  for (int64_t base = 0; base < n_in; base += kChunkElems) {
    const int elems = n_in - base < kChunkElems ? static_cast<int>(n_in - base) : kChunkElems;
    const auto* blocks = reinterpret_cast<const Block*>(
        stage_row::stage_chunk<T, Shape::kUnitsPerLane>(row_ptr, base, elems, stage[warp], lane));
    const float* xc = x + base;
    for (int e0 = kGroup * lane; e0 < elems; e0 += kGroup * 32) {
      const int n = elems - e0 < kGroup ? elems - e0 : kGroup;
      float wv[kGroup];
      dq_group_weights<T>(blocks, e0, n, wv);
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        if (v < n_vec) {
          float xv[kGroup];
          dq_load_x(xc + v * n_in + e0, n, x_vec4, xv);
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            if (j < n) acc[v] = fmaf(wv[j], xv[j], acc[v]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int v = 0; v < NV; ++v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc[v] += __shfl_xor_sync(kFullMask, acc[v], offset);
  }
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    if (v < n_vec && lane == v % 32) y[v * n_out + row] = acc[v];
  }
}

struct Args {
  const DeviceMatrixView* w;
  int64_t row_bytes;
  const float* x;
  int n_vec;
  float* y;
  cudaStream_t stream;
};

template <GgmlType T, int NV>
Status launch(const Args& a) {
  const auto blocks = static_cast<unsigned>((a.w->n_rows + kWarps - 1) / kWarps);
  gemv_kernel<T, NV><<<blocks, kThreads, 0, a.stream>>>(static_cast<const uint8_t*>(a.w->data), a.row_bytes,
                                                        a.w->n_cols, a.w->n_rows, a.x, a.n_vec, a.y);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

template <GgmlType T>
Status launch_bucket(const Args& a) {
  if (a.n_vec <= 1) return launch<T, 1>(a);
  if (a.n_vec <= 2) return launch<T, 2>(a);
  if (a.n_vec <= 4) return launch<T, 4>(a);
  if (a.n_vec <= 8) return launch<T, 8>(a);
  if (a.n_vec <= 16) return launch<T, 16>(a);
  return launch<T, 32>(a);
}

Status dispatch(const Args& a) {
  return dispatch_dequant_type(
      a.w->type, [&](auto t) { return launch_bucket<decltype(t)::value>(a); },
      Status(make_error(ErrorCode::kInternal, "gemv: supported type without a kernel")));
}

bool aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

std::string type_name(GgmlType t) {
  const auto traits = ggml_type_traits(static_cast<uint32_t>(t));
  return traits ? std::string(traits->name) : std::to_string(static_cast<uint32_t>(t));
}

// Checks everything the kernel relies on; returns the row size in bytes.
Expected<int64_t> check_args(const DeviceMatrixView& w, const float* x, int n_vec, const float* y) {
  if (!gemv_supports(w.type)) {
    return make_error(ErrorCode::kUnsupported, "gemv: type " + type_name(w.type) +
                                                   " is not supported (f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, "
                                                   "q6_K are)");
  }
  if (n_vec < 1 || n_vec > kGemvMaxVectors) {
    return make_error(ErrorCode::kInvalidArgument, "gemv: n_vec " + std::to_string(n_vec) + " is outside [1, " +
                                                       std::to_string(kGemvMaxVectors) +
                                                       "]; split larger batches into several calls");
  }
  if (w.n_cols < 0 || w.n_rows < 0) {
    return make_error(ErrorCode::kInvalidArgument, "gemv: negative matrix size (n_cols " + std::to_string(w.n_cols) +
                                                       ", n_rows " + std::to_string(w.n_rows) + ")");
  }
  KESTREL_TRY_ASSIGN(const uint64_t row_bytes, ggml_row_bytes(w.type, static_cast<uint64_t>(w.n_cols)));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if ((w.n_rows > 0 && static_cast<int64_t>(row_bytes) > kMax / w.n_rows) ||
      w.n_cols > kMax / kGemvMaxVectors / static_cast<int64_t>(sizeof(float)) ||
      w.n_rows > kMax / kGemvMaxVectors / static_cast<int64_t>(sizeof(float))) {
    return make_error(ErrorCode::kInvalidArgument, "gemv: matrix, x or y size overflows 64 bits");
  }
  if ((w.n_rows + kWarps - 1) / kWarps > std::numeric_limits<int32_t>::max()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemv: " + std::to_string(w.n_rows) + " rows exceed one grid; split the matrix");
  }
  if (w.n_rows == 0) return static_cast<int64_t>(row_bytes);
  if (y == nullptr || (w.n_cols > 0 && (x == nullptr || w.data == nullptr))) {
    return make_error(ErrorCode::kInvalidArgument, "gemv: null device pointer (w, x or y)");
  }
  if ((w.data != nullptr && !aligned(w.data, w.type == GgmlType::kF32 ? 4 : 2)) || (x != nullptr && !aligned(x, 4)) ||
      !aligned(y, 4)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "gemv: misaligned device pointer (w needs 2 bytes, 4 for f32; x and y 4)");
  }
  if (x != nullptr && w.n_cols > 0) {
    const auto x0 = reinterpret_cast<uintptr_t>(x);
    const auto y0 = reinterpret_cast<uintptr_t>(y);
    const auto x1 = x0 + static_cast<uintptr_t>(n_vec) * static_cast<uintptr_t>(w.n_cols) * sizeof(float);
    const auto y1 = y0 + static_cast<uintptr_t>(n_vec) * static_cast<uintptr_t>(w.n_rows) * sizeof(float);
    if (x0 < y1 && y0 < x1) return make_error(ErrorCode::kInvalidArgument, "gemv: y overlaps x");
  }
  return static_cast<int64_t>(row_bytes);
}

}  // namespace

bool gemv_supports(GgmlType type) { return has_dequant(type); }

Status gemv(const DeviceMatrixView& w, const float* x, int n_vec, float* y, cudaStream_t stream) {
  KESTREL_TRY_ASSIGN(const int64_t row_bytes, check_args(w, x, n_vec, y));
  if (w.n_rows == 0) return ok_status();
  // v2 (gemv_q4.cu) for Q4_0/Q4_K rows of whole 256-element groups on 16-byte aligned w and x; the choice
  // depends only on w and x, never on n_vec, so each y[v] stays independent of n_vec.
  if (detail::gemv_q4_applies(w, x)) return detail::gemv_q4(w, row_bytes, x, n_vec, y, stream);
  return dispatch(Args{&w, row_bytes, x, n_vec, y, stream});
}

}  // namespace kestrel::gpu
