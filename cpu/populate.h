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
// Page size: before populating, each range is marked MADV_HUGEPAGE, so pages read from disk here come into the page
// cache as 2 MiB folios mapped by one page-table entry each, where the kernel has transparent huge pages and the file
// system caches files in large folios (the development VM's ext4 on Linux 6.18 does). That matters to the experts: a
// MoE layer reads a few random 0.6 MB matrices out of gigabytes, and in 4 KiB pages every one of their ~150 pages is
// its own TLB miss — on the development VM the experts took about twice the CPU time from a file cached in 4 KiB
// pages (measured 2026-12-05; git log of docs/benchmarks.md). Pages already in the page cache keep their size (a file
// written or copied shortly before is often cached in 4 KiB pages); tensor_data_huge_page_share says how much of the
// mapping is in 2 MiB pages.
//
// Threading: call from the pool's owner (it runs pool jobs).
#pragma once

#include <cstdint>
#include <istream>
#include <span>

#include "core/gguf/gguf_reader.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {

void populate_tensor_data(const GgufFile& file, WorkerPool& pool);

// Every page of every range (ranges may be in any order and share pages).
void populate_ranges(std::span<const std::span<const uint8_t>> ranges, WorkerPool& pool);

// The share of the tensor data's resident pages that are mapped as 2 MiB pages (FilePmdMapped over Rss of the file
// mappings that hold it, from /proc/self/smaps), in [0, 1]; −1 where that is not known (no smaps, or a kernel
// without the field).
double tensor_data_huge_page_share(const GgufFile& file);

// The same over the mappings of an smaps listing (proc(5)) that overlap [start, end).
double huge_page_share_from_smaps(std::istream& smaps, uintptr_t start, uintptr_t end);

}  // namespace kestrel::cpu
