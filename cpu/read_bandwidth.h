// The plain read bandwidth of host memory as a pool of worker threads sees it: the limit the CPU engine's weight
// streaming is judged against (benchmarking.md) and the host figure the placement planner's cost model takes.
//
// A buffer of `bytes` (choose it far larger than the last-level cache) is filled once, then summed as 64-bit words
// in 1 MiB blocks spread over the pool, `repeats` times; the best pass counts.
//
// Threading: runs jobs on `pool` (its submit/wait contract: no other job may be in flight). Allocates the buffer for
// the call.
#pragma once

#include <cstdint>

#include "core/base/expected.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {

// Bytes per second. kInvalidArgument for bytes < 1 MiB or repeats < 1; kResourceExhausted when the buffer cannot be
// allocated.
Expected<double> measure_read_bandwidth(WorkerPool& pool, uint64_t bytes, int repeats);

}  // namespace kestrel::cpu
