// Helpers the CPU micro-benchmarks (bench_gemv, bench_expert_backend) share: one pinned worker pool per thread
// count, kept for the process; the process's CPU time; the median of a run's samples.
#pragma once

#include <time.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "cpu/worker_pool.h"

namespace kestrel::cpu::bench {

// The pool of `threads` threads (the caller's included), made on first use.
inline WorkerPool& pool_for(int threads) {
  static std::map<int, std::unique_ptr<WorkerPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::move(*WorkerPool::create(threads - 1, /*pin=*/true));
  return *p;
}

inline double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace kestrel::cpu::bench
