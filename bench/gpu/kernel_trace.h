// KernelTrace: every kernel's GPU time while a trace is on, from CUPTI's activity records (the start and end
// timestamps the driver takes around each kernel, those replayed inside CUDA graphs included), summed by kernel name.
// Nsight Compute replays each kernel alone with its own clocks and cache state and put a ~200 us floor under the
// engine's small kernels; these records are the kernels as they ran in the pass. With programmatic launches a kernel
// may start before the one before it ends, so the sums can exceed the wall time between the first start and the last
// end (both are printed). For the benchmark programs alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/expected.h"

namespace kestrel::gpu::bench {

struct KernelTime {
  std::string name;  // demangled, without template arguments or parameters
  int64_t calls = 0;
  double total_us = 0;
};

struct KernelTraceResult {
  std::vector<KernelTime> kernels;  // by descending total time
  double span_us = 0;               // first kernel start to last kernel end
  double sum_us = 0;                // Σ total_us
};

// True when this build has CUPTI (bench_engine's --kernels needs it).
bool kernel_trace_available();

// Starts recording kernels (one trace at a time in a process). kUnsupported without CUPTI.
Status kernel_trace_start();

// Waits for the device, flushes the records and stops; the kernels recorded since kernel_trace_start.
Expected<KernelTraceResult> kernel_trace_stop();

// The table: each kernel's calls, total ms divided by `per` (e.g. the number of passes traced), mean us a call, and
// its share of the sum; the `top` largest, then the rest as one line ("no kernels recorded" when there are none).
std::string kernel_trace_table(const KernelTraceResult& r, double per, int top);

}  // namespace kestrel::gpu::bench
