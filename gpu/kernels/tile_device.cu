// tile_stack_device (tile_device.h): one thread per 16-byte quant piece or meta item (gpu/memory/tile_pieces.h), a
// row group's pieces first, so a warp writes 512 contiguous bytes of the qs part.
#include <algorithm>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/tile_device.h"
#include "gpu/memory/tile_pieces.h"
#include "gpu/memory/tiled_matrix.h"

namespace kestrel::gpu {
namespace {

constexpr int kThreads = 256;

template <GgmlType kType>
__global__ void __launch_bounds__(kThreads)
    tile_stack_kernel(const uint8_t* raw, int64_t n_cols, int64_t n_rg, int64_t first, int64_t count,
                      uint64_t slice_bytes, uint8_t* out) {
  const int64_t n_pieces = tile_pieces::qs_pieces(kType, n_cols);
  const int64_t per_rg = n_pieces + tile_pieces::meta_items(kType, n_cols);
  const int64_t total = count * n_rg * per_rg;
  for (int64_t k = int64_t{blockIdx.x} * kThreads + threadIdx.x; k < total; k += int64_t{gridDim.x} * kThreads) {
    const int64_t slice = first + k / (n_rg * per_rg);
    const int64_t rem = k % (n_rg * per_rg);
    const int64_t rg = rem / per_rg, j = rem % per_rg;
    const uint8_t* s = raw + static_cast<uint64_t>(slice) * slice_bytes;
    uint8_t* o = out + static_cast<uint64_t>(slice) * slice_bytes;
    if (j < n_pieces) {
      tile_pieces::write_qs_piece<kType>(s, n_cols, rg, j, o);
    } else {
      tile_pieces::write_meta_item<kType>(s, n_cols, n_rg, rg, j - n_pieces, o);
    }
  }
}

}  // namespace

Status tile_stack_device(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, int64_t first, int64_t count,
                         void* out, cudaStream_t stream) {
  if (!tiled_supports(type, n_cols, n_rows) || raw == nullptr || out == nullptr || first < 0 || count < 0 ||
      reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "tile_stack_device: " + std::string(ggml_type_name(type)) + " {" + std::to_string(n_cols) + ", " +
                          std::to_string(n_rows) + "}, slices " + std::to_string(first) + " + " +
                          std::to_string(count) +
                          ": an untileable shape, a null or misaligned pointer, or a negative "
                          "slice range");
  }
  if (count == 0) return ok_status();
  const int64_t n_rg = n_rows / tile_pieces::kTileRows;
  const int64_t total = count * n_rg * (tile_pieces::qs_pieces(type, n_cols) + tile_pieces::meta_items(type, n_cols));
  int device = 0, sms = 0;
  KESTREL_CUDA_TRY(cudaGetDevice(&device));
  KESTREL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{sms} * 16);
  const auto* r = static_cast<const uint8_t*>(raw);
  auto* o = static_cast<uint8_t*>(out);
  const uint64_t slice_bytes = tiled_bytes(type, n_cols, n_rows);
  const dim3 grid(static_cast<unsigned>(blocks));
  tile_pieces::with_tiled_type(type, [&](auto t) {
    tile_stack_kernel<decltype(t)::value><<<grid, kThreads, 0, stream>>>(r, n_cols, n_rg, first, count, slice_bytes, o);
  });
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
