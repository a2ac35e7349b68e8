// populate_tensor_data (populate.h): the span of all tensor data, page-aligned, in 64 MiB pool items.
#include "cpu/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace kestrel::cpu {

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
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(lo) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(hi);
  constexpr uintptr_t kPiece = 64u << 20;
  const int64_t n = static_cast<int64_t>((end - start + kPiece - 1) / kPiece);
  auto body = [&](int64_t i) {
    const uintptr_t a = start + static_cast<uintptr_t>(i) * kPiece;
    const uintptr_t b = std::min(end, a + kPiece);
#ifdef MADV_POPULATE_READ
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the mapping's own addresses
    if (madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_READ) == 0) return;
#endif
    volatile uint8_t sink = 0;  // older kernels: fault each page in by reading it
    for (uintptr_t p = a; p < b; p += page) sink = sink + *reinterpret_cast<const volatile uint8_t*>(p);
  };
  pool.for_each(n, body);
}

}  // namespace kestrel::cpu
