// populate_ranges (populate.h): page-aligned pieces of at most 64 MiB, one pool item each; populate_tensor_data is
// the one range spanning all tensor data.
#include "cpu/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kestrel::cpu {
namespace {

constexpr uintptr_t kPiece = 64u << 20;

// Maps the pages of [a, b) (a page-aligned).
void populate_piece(uintptr_t a, uintptr_t b, uintptr_t page) {
#ifdef MADV_POPULATE_READ
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the mapping's own addresses
  if (madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_READ) == 0) return;
#endif
  volatile uint8_t sink = 0;  // older kernels: fault each page in by reading it
  for (uintptr_t p = a; p < b; p += page) sink = sink + *reinterpret_cast<const volatile uint8_t*>(p);
}

}  // namespace

void populate_ranges(std::span<const std::span<const uint8_t>> ranges, WorkerPool& pool) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> pieces;  // page-aligned starts, in kPiece pieces
  for (const std::span<const uint8_t> r : ranges) {
    if (r.empty()) continue;
    const uintptr_t end = reinterpret_cast<uintptr_t>(r.data()) + r.size();
    for (uintptr_t a = reinterpret_cast<uintptr_t>(r.data()) / page * page; a < end; a += kPiece) {
      pieces.emplace_back(a, std::min(end, a + kPiece));
    }
  }
  auto body = [&](int64_t i) {
    const auto [a, b] = pieces[static_cast<size_t>(i)];
    populate_piece(a, b, page);
  };
  pool.for_each(static_cast<int64_t>(pieces.size()), body);
}

void populate_tensor_data(const GgufFile& file, WorkerPool& pool) {
  const uint8_t* lo = nullptr;
  const uint8_t* hi = nullptr;
  for (const GgufTensorInfo& t : file.tensors()) {
    const std::span<const uint8_t> d = file.tensor_data(t);
    if (d.empty()) continue;
    lo = lo == nullptr ? d.data() : std::min(lo, d.data());
    hi = hi == nullptr ? d.data() + d.size() : std::max(hi, d.data() + d.size());
  }
  if (lo == nullptr) return;
  const std::span<const uint8_t> all[1] = {{lo, static_cast<size_t>(hi - lo)}};
  populate_ranges(all, pool);
}

}  // namespace kestrel::cpu
