// Mapping a model's weights into the process before the first step. The CPU engine reads the weights in place from
// the file mapping; left alone, every 4 KiB page costs a page fault on its first read — inside a decode step, and
// on a mixture-of-experts model for as long as tokens keep routing to experts not yet touched (on the 35B-A3B file
// the faults took a fifth of the first decode steps' time on the development VM). populate_tensor_data maps them
// all up front: madvise(MADV_POPULATE_READ) over the tensor data in 64 MiB pieces spread over the pool (Linux 5.14+;
// elsewhere one read per page). Pages not in the page cache are read from disk here, so this takes as long as
// reading the file once when it is not cached.
//
// populate_ranges does the same for chosen byte ranges of a mapping (the experts a CPU ExpertBackend holds).
//
// Threading: call from the pool's owner (it runs pool jobs).
#pragma once

#include <cstdint>
#include <span>

#include "core/gguf/gguf_reader.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {

void populate_tensor_data(const GgufFile& file, WorkerPool& pool);

// Every page of every range (ranges may be in any order and share pages).
void populate_ranges(std::span<const std::span<const uint8_t>> ranges, WorkerPool& pool);

}  // namespace kestrel::cpu
