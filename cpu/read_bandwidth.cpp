// measure_read_bandwidth (read_bandwidth.h).
#include "cpu/read_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace kestrel::cpu {
namespace {

constexpr uint64_t kBlock = uint64_t{1} << 20;

}  // namespace

Expected<double> measure_read_bandwidth(WorkerPool& pool, uint64_t bytes, int repeats) {
  if (bytes < kBlock || repeats < 1) {
    return make_error(ErrorCode::kInvalidArgument, "read bandwidth: needs at least 1 MiB and one pass (got " +
                                                       std::to_string(bytes) + " bytes, " + std::to_string(repeats) +
                                                       " passes)");
  }
  const int64_t n_blocks = static_cast<int64_t>(bytes / kBlock);
  std::unique_ptr<uint64_t[]> words(new (std::nothrow) uint64_t[static_cast<size_t>(n_blocks) * kBlock / 8]);
  if (!words) {
    return make_error(ErrorCode::kResourceExhausted,
                      "read bandwidth: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  std::vector<uint64_t> sink(static_cast<size_t>(n_blocks));
  uint64_t* base = words.get();
  constexpr uint64_t kWords = kBlock / 8;
  auto fill = [&](int64_t b) {  // each block written by the thread that reads it (first touch on its node)
    uint64_t* p = base + static_cast<uint64_t>(b) * kWords;
    for (uint64_t i = 0; i < kWords; ++i) p[i] = i * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(b);
  };
  pool.for_each(n_blocks, fill);
  auto sum = [&](int64_t b) {
    const uint64_t* p = base + static_cast<uint64_t>(b) * kWords;
    uint64_t acc[4] = {0, 0, 0, 0};
    for (uint64_t i = 0; i < kWords; i += 4) {
      acc[0] += p[i];
      acc[1] += p[i + 1];
      acc[2] += p[i + 2];
      acc[3] += p[i + 3];
    }
    sink[static_cast<size_t>(b)] = acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
  };
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.for_each(n_blocks, sum);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sec > 0) best = std::max(best, static_cast<double>(n_blocks) * static_cast<double>(kBlock) / sec);
  }
  // The sums go to a volatile so the compiler cannot drop the reads.
  uint64_t all = 0;
  for (uint64_t s : sink) all ^= s;
  volatile uint64_t observed = all;
  (void)observed;
  return best;
}

}  // namespace kestrel::cpu
