// populate_ranges (populate.h): each range marked for 2 MiB pages, then page-aligned pieces of at most 64 MiB, one
// pool item each; populate_tensor_data is the one range spanning all tensor data; the huge-page share from smaps.
#include "cpu/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
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

// The bytes from the first tensor's data to the last one's end; empty when there is none.
std::span<const uint8_t> tensor_span(const GgufFile& file) {
  const uint8_t* lo = nullptr;
  const uint8_t* hi = nullptr;
  for (const GgufTensorInfo& t : file.tensors()) {
    const std::span<const uint8_t> d = file.tensor_data(t);
    if (d.empty()) continue;
    lo = lo == nullptr ? d.data() : std::min(lo, d.data());
    hi = hi == nullptr ? d.data() + d.size() : std::max(hi, d.data() + d.size());
  }
  if (lo == nullptr) return {};
  return {lo, static_cast<size_t>(hi - lo)};
}

}  // namespace

void populate_ranges(std::span<const std::span<const uint8_t>> ranges, WorkerPool& pool) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> pieces;  // page-aligned starts, in kPiece pieces
  for (const std::span<const uint8_t> r : ranges) {
    if (r.empty()) continue;
    const uintptr_t start = reinterpret_cast<uintptr_t>(r.data()) / page * page;
    const uintptr_t end = reinterpret_cast<uintptr_t>(r.data()) + r.size();
#ifdef MADV_HUGEPAGE
    // A hint, so its result is not checked (EINVAL where transparent huge pages are off).
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the mapping's own addresses
    madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
#endif
    for (uintptr_t a = start; a < end; a += kPiece) pieces.emplace_back(a, std::min(end, a + kPiece));
  }
  auto body = [&](int64_t i) {
    const auto [a, b] = pieces[static_cast<size_t>(i)];
    populate_piece(a, b, page);
  };
  pool.for_each(static_cast<int64_t>(pieces.size()), body);
}

void populate_tensor_data(const GgufFile& file, WorkerPool& pool) {
  const std::span<const uint8_t> all[1] = {tensor_span(file)};
  populate_ranges(all, pool);
}

double huge_page_share_from_smaps(std::istream& smaps, uintptr_t start, uintptr_t end) {
  // Each mapping's header line ("lo-hi perms offset dev inode path") is followed by its "Key:   N kB" fields; sum Rss
  // and FilePmdMapped over the mappings that overlap [start, end).
  uint64_t rss_kb = 0, pmd_kb = 0;
  bool inside = false, seen_pmd_field = false;
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
      inside = lo < end && hi > start;
      continue;
    }
    if (!inside) continue;
    unsigned long kb = 0;
    if (std::sscanf(line.c_str(), "Rss: %lu kB", &kb) == 1) rss_kb += kb;
    if (std::sscanf(line.c_str(), "FilePmdMapped: %lu kB", &kb) == 1) {
      pmd_kb += kb;
      seen_pmd_field = true;
    }
  }
  if (!seen_pmd_field || rss_kb == 0) return -1.0;
  return static_cast<double>(pmd_kb) / static_cast<double>(rss_kb);
}

double tensor_data_huge_page_share(const GgufFile& file) {
  const std::span<const uint8_t> span = tensor_span(file);
  if (span.empty()) return -1.0;
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1.0;
  const uintptr_t start = reinterpret_cast<uintptr_t>(span.data());
  return huge_page_share_from_smaps(smaps, start, start + span.size());
}

}  // namespace kestrel::cpu
