// bench_tiled_matrix: host-side re-tiling of Q4_0 / Q4_K / Q5_K / Q6_K / Q8_0 weights for GEMV v4 (gpu/tiled_matrix),
// which the weight pool runs on every such tensor at start-up. Each figure is the best of 3 runs over the same bytes,
// printed beside a plain copy of those bytes with the same number of threads measured in the same run (the host's
// memory limit for a pass that reads and writes every byte once). Shapes: the 35B-A3B preset's expert gate stack (256 ×
// {2048, 512}) and its lm_head ({2048, 248320}).
//
//   bench_tiled_matrix            # no arguments; a few seconds
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/memory/tiled_matrix.h"

namespace {

using kestrel::GgmlType;

double best_seconds(const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// memcpy of n bytes split over `threads` threads (contiguous ranges), as tile_matrix_stack splits its row groups.
void copy_on(int threads, const uint8_t* src, uint8_t* dst, size_t n) {
  if (threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    const size_t a = n * static_cast<size_t>(i) / static_cast<size_t>(threads);
    const size_t b = n * static_cast<size_t>(i + 1) / static_cast<size_t>(threads);
    pool.emplace_back([=] { std::memcpy(dst + a, src + a, b - a); });
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace

int main() {
  struct Case {
    const char* name;
    int64_t n_cols, n_rows, n_slices;
  };
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("host threads: %d\n\n%-16s %-5s %8s %10s %9s %9s %9s\n", hw, "case", "type", "threads", "bytes", "GB/s",
              "copy GB/s", "%copy");
  for (const Case& c : {Case{"expert.gate x256", 2048, 512, 256}, Case{"lm_head", 2048, 248320, 1}}) {
    for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_0}) {
      const uint64_t bytes = kestrel::gpu::tiled_bytes(t, c.n_cols, c.n_rows) * static_cast<uint64_t>(c.n_slices);
      std::vector<uint8_t> raw(bytes), out(bytes);
      std::mt19937 rng(1);
      for (auto& b : raw) b = static_cast<uint8_t>(rng());
      for (int threads : {1, hw}) {
        kestrel::Status st = kestrel::ok_status();
        const double s = best_seconds(
            [&] { st = kestrel::gpu::tile_matrix_stack(t, raw.data(), c.n_cols, c.n_rows, c.n_slices, out, threads); });
        if (!st) {
          std::fprintf(stderr, "bench_tiled_matrix: %s\n", st.error().to_string().c_str());
          return 1;
        }
        const double cs = best_seconds([&] { copy_on(threads, raw.data(), out.data(), bytes); });
        std::printf("%-16s %-5s %8d %10llu %9.2f %9.2f %8.1f%%\n", c.name,
                    std::string(kestrel::ggml_type_name(t)).c_str(), threads, static_cast<unsigned long long>(bytes),
                    bytes / s / 1e9, bytes / cs / 1e9, 100.0 * cs / s);
        if (hw == 1) break;
      }
    }
  }
  return 0;
}
