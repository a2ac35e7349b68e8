// tile_matrix (see tiled_matrix.h): the host-side re-tiling of Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 rows for GEMV v4.
#include "gpu/memory/tiled_matrix.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gpu/memory/tile_pieces.h"

namespace kestrel::gpu {
namespace {

constexpr int kTileRows = tile_pieces::kTileRows;
constexpr int kUnitElems = tile_pieces::kUnitElems;
constexpr int64_t kMaxCols = 8192;
constexpr uint64_t kParallelBytes = uint64_t{4} << 20;  // output bytes per worker thread, at least

// Row groups [rg0, rg1) of one matrix (src: its raw rows, out: its tiled bytes), piece by piece.
template <GgmlType kType>
void tile_row_groups(const uint8_t* src, int64_t n_cols, int64_t n_rg, int64_t rg0, int64_t rg1, uint8_t* out) {
  const int64_t n_pieces = tile_pieces::qs_pieces(kType, n_cols), n_meta = tile_pieces::meta_items(kType, n_cols);
  for (int64_t rg = rg0; rg < rg1; ++rg) {
    for (int64_t p = 0; p < n_pieces; ++p) tile_pieces::write_qs_piece<kType>(src, n_cols, rg, p, out);
    for (int64_t i = 0; i < n_meta; ++i) tile_pieces::write_meta_item<kType>(src, n_cols, n_rg, rg, i, out);
  }
}

}  // namespace

bool tiled_supports(GgmlType type, int64_t n_cols, int64_t n_rows) {
  if (n_rows <= 0 || n_rows % kTileRows != 0 || n_cols <= 0 || n_cols > kMaxCols) return false;
  if (n_rows / kTileRows > std::numeric_limits<int32_t>::max() / 16) return false;  // row groups × splits in int
  if (type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0) return n_cols % kUnitElems == 0;
  if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K) return n_cols % 256 == 0;
  return false;
}

uint64_t tiled_bytes(GgmlType type, int64_t n_cols, int64_t n_rows) {
  const uint64_t elems = static_cast<uint64_t>(n_cols) * static_cast<uint64_t>(n_rows);
  if (type == GgmlType::kQ4_K) return elems / 256 * sizeof(BlockQ4_K);
  if (type == GgmlType::kQ5_K) return elems / 256 * sizeof(BlockQ5_K);
  if (type == GgmlType::kQ6_K) return elems / 256 * sizeof(BlockQ6_K);
  if (type == GgmlType::kQ8_0) return elems / 32 * sizeof(BlockQ8_0);
  return elems / 32 * sizeof(BlockQ4_0);
}

Status tile_matrix(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, std::span<uint8_t> out) {
  return tile_matrix_stack(type, raw, n_cols, n_rows, 1, out, 1);
}

Status tile_matrix_stack(GgmlType type, const void* raw, int64_t n_cols, int64_t n_rows, int64_t n_slices,
                         std::span<uint8_t> out, int max_threads) {
  if (!tiled_supports(type, n_cols, n_rows)) {
    return make_error(ErrorCode::kInvalidArgument, "tile_matrix: " + std::string(ggml_type_name(type)) + " {" +
                                                       std::to_string(n_cols) + ", " + std::to_string(n_rows) +
                                                       "} cannot be tiled (q4_0 and q8_0 need n_cols % 64, the "
                                                       "k-quants n_cols % 256, n_rows % 16, n_cols <= 8192)");
  }
  const uint64_t slice_bytes = tiled_bytes(type, n_cols, n_rows);
  if (raw == nullptr || n_slices < 1 || max_threads < 0) {
    return make_error(ErrorCode::kInvalidArgument, "tile_matrix: null input, slice count " + std::to_string(n_slices) +
                                                       " below 1 or thread count " + std::to_string(max_threads) +
                                                       " below 0");
  }
  if (out.size() / slice_bytes != static_cast<uint64_t>(n_slices) || out.size() % slice_bytes != 0) {
    return make_error(ErrorCode::kInvalidArgument, "tile_matrix: output holds " + std::to_string(out.size()) +
                                                       " bytes, " + std::to_string(n_slices) + " tiled matrices need " +
                                                       std::to_string(slice_bytes) + " each");
  }
  const auto* src = static_cast<const uint8_t*>(raw);
  const int64_t n_rg = n_rows / kTileRows;
  const int64_t total = n_rg * n_slices;  // row groups of the whole stack
  // Item k = row group k % n_rg of slice k / n_rg; a worker takes a contiguous range of items.
  auto work = [&](int64_t k0, int64_t k1) {
    while (k0 < k1) {
      const int64_t slice = k0 / n_rg;
      const int64_t rg0 = k0 % n_rg;
      const int64_t rg1 = std::min(n_rg, rg0 + (k1 - k0));
      const uint8_t* s = src + static_cast<uint64_t>(slice) * slice_bytes;
      uint8_t* o = out.data() + static_cast<uint64_t>(slice) * slice_bytes;
      tile_pieces::with_tiled_type(type,
                                   [&](auto t) { tile_row_groups<decltype(t)::value>(s, n_cols, n_rg, rg0, rg1, o); });
      k0 += rg1 - rg0;
    }
  };
  // Threads: at most max_threads (0: the hardware's), and one per kParallelBytes of output.
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t by_size = std::max<uint64_t>(1, out.size() / kParallelBytes);
  const int64_t n_threads = static_cast<int64_t>(std::min<uint64_t>(
      {max_threads == 0 ? hw : static_cast<unsigned>(max_threads), by_size, static_cast<uint64_t>(total)}));
  if (n_threads <= 1) {
    work(0, total);
    return ok_status();
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(n_threads - 1));
  for (int64_t i = 1; i < n_threads; ++i) pool.emplace_back(work, total * i / n_threads, total * (i + 1) / n_threads);
  work(0, total / n_threads);
  for (std::thread& th : pool) th.join();
  return ok_status();
}

}  // namespace kestrel::gpu
