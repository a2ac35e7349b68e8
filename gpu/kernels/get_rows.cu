// get_rows (see get_rows.h): one kernel per GGUF type, templated on gpu/kernels/dequant.cuh's traits.
//
// Grid: blockIdx.x walks the ids (striding when there are more than 65535), blockIdx.y and the 256 threads walk
// the columns, so writes to dst are coalesced; each thread dequantizes the one element it writes. An embedding
// lookup moves n_ids * n_cols floats, so this simple shape is bandwidth-bound on the writes, as it should be.
// Tested bit for bit against core's dequantize_row in tests/gpu/test_get_rows.cpp.
#include <cstdint>
#include <limits>
#include <string>

#include "core/gguf/ggml_type.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/dequant.cuh"
#include "gpu/kernels/get_rows.h"

namespace kestrel::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = 65535;
constexpr int64_t kMaxGridY = 64;

// dst: f32 [n_ids, n_cols]; src: n_rows rows of row_bytes; ids: int32 [n_ids]; bad_ids: int32 [1] or null.
template <GgmlType T>
__global__ void get_rows_kernel(const uint8_t* __restrict__ src, int64_t row_bytes, int64_t n_cols, int64_t n_rows,
                                const int32_t* __restrict__ ids, int64_t n_ids, float* __restrict__ dst,
                                int32_t* bad_ids) {
  using D = Dequant<T>;
  for (int64_t r = blockIdx.x; r < n_ids; r += gridDim.x) {
    const int64_t id = ids[r];
    const bool in_range = id >= 0 && id < n_rows;
    if (!in_range && bad_ids != nullptr && blockIdx.y == 0 && threadIdx.x == 0) atomicAdd(bad_ids, 1);
    // A bad id never forms an address into src: its row is written from a constant.
    const auto* row = reinterpret_cast<const typename D::Block*>(src + (in_range ? id * row_bytes : 0));
    float* out = dst + r * n_cols;
    const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
    for (int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < n_cols; c += stride) {
      out[c] = in_range ? D::elem(row + c / D::kBlockElems, static_cast<int>(c % D::kBlockElems))
                        : __uint_as_float(0x7FC00000u);
    }
  }
}

struct Launch {
  const DeviceMatrixView* src;
  int64_t row_bytes;
  const int32_t* ids;
  int64_t n_ids;
  float* dst;
  int32_t* bad_ids;
  cudaStream_t stream;
};

template <GgmlType T>
Status launch(const Launch& a) {
  const int64_t col_blocks = (a.src->n_cols + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(a.n_ids < kMaxGridX ? a.n_ids : kMaxGridX),
                  static_cast<unsigned>(col_blocks < kMaxGridY ? col_blocks : kMaxGridY));
  get_rows_kernel<T><<<grid, kThreads, 0, a.stream>>>(static_cast<const uint8_t*>(a.src->data), a.row_bytes,
                                                      a.src->n_cols, a.src->n_rows, a.ids, a.n_ids, a.dst, a.bad_ids);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

Status dispatch(const Launch& a) {
  return dispatch_dequant_type(
      a.src->type, [&](auto t) { return launch<decltype(t)::value>(a); },
      Status(make_error(ErrorCode::kInternal, "get_rows: supported type without a kernel")));
}

bool aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

// Checks everything but the ids' values; returns the row size in bytes.
Expected<int64_t> check_args(const DeviceMatrixView& src, int64_t n_ids, const int32_t* ids_dev, const float* dst) {
  if (!get_rows_supports(src.type)) {
    const auto traits = ggml_type_traits(static_cast<uint32_t>(src.type));
    return make_error(ErrorCode::kUnsupported,
                      "get_rows: type " +
                          (traits ? std::string(traits->name) : std::to_string(static_cast<uint32_t>(src.type))) +
                          " is not supported (f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K are)");
  }
  if (src.n_cols < 0 || src.n_rows < 0 || n_ids < 0) {
    return make_error(ErrorCode::kInvalidArgument, "get_rows: negative size (n_cols " + std::to_string(src.n_cols) +
                                                       ", n_rows " + std::to_string(src.n_rows) + ", n_ids " +
                                                       std::to_string(n_ids) + ")");
  }
  KESTREL_TRY_ASSIGN(const uint64_t row_bytes, ggml_row_bytes(src.type, static_cast<uint64_t>(src.n_cols)));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if ((src.n_rows > 0 && static_cast<int64_t>(row_bytes) > kMax / src.n_rows) ||
      (n_ids > 0 && src.n_cols > kMax / n_ids)) {
    return make_error(ErrorCode::kInvalidArgument, "get_rows: matrix or output size overflows 64 bits");
  }
  if (n_ids == 0 || src.n_cols == 0) return static_cast<int64_t>(row_bytes);
  if (ids_dev == nullptr || dst == nullptr || (src.n_rows > 0 && src.data == nullptr)) {
    return make_error(ErrorCode::kInvalidArgument, "get_rows: null device pointer (src, ids or dst)");
  }
  if (!aligned(src.data, src.type == GgmlType::kF32 ? 4 : 2) || !aligned(dst, 4) || !aligned(ids_dev, 4)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "get_rows: misaligned device pointer (src needs 2 bytes, 4 for f32; ids and dst 4)");
  }
  return static_cast<int64_t>(row_bytes);
}

}  // namespace

bool get_rows_supports(GgmlType type) { return has_dequant(type); }

Status get_rows(const DeviceMatrixView& src, std::span<const int32_t> ids_host, const int32_t* ids_dev, float* dst,
                cudaStream_t stream) {
  const auto n_ids = static_cast<int64_t>(ids_host.size());
  KESTREL_TRY_ASSIGN(const int64_t row_bytes, check_args(src, n_ids, ids_dev, dst));
  for (int64_t i = 0; i < n_ids; ++i) {
    const int32_t id = ids_host[static_cast<size_t>(i)];
    if (id < 0 || id >= src.n_rows) {
      return make_error(ErrorCode::kOutOfRange, "get_rows: id " + std::to_string(id) + " at position " +
                                                    std::to_string(i) + " is outside the matrix's " +
                                                    std::to_string(src.n_rows) + " rows");
    }
  }
  if (n_ids == 0 || src.n_cols == 0) return ok_status();
  return dispatch(Launch{&src, row_bytes, ids_dev, n_ids, dst, nullptr, stream});
}

Status get_rows_device_ids(const DeviceMatrixView& src, const int32_t* ids_dev, int64_t n_ids, float* dst,
                           int32_t* bad_ids, cudaStream_t stream) {
  KESTREL_TRY_ASSIGN(const int64_t row_bytes, check_args(src, n_ids, ids_dev, dst));
  if (n_ids == 0 || src.n_cols == 0) return ok_status();
  if (bad_ids != nullptr && !aligned(bad_ids, 4)) {
    return make_error(ErrorCode::kInvalidArgument, "get_rows: misaligned bad_ids counter");
  }
  return dispatch(Launch{&src, row_bytes, ids_dev, n_ids, dst, bad_ids, stream});
}

}  // namespace kestrel::gpu
