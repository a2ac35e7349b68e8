// Parallel GEMV over the worker pool: several products (GemvTask, gemv.h) of one step run as one pool job, each
// product cut into blocks of rows whose size depends only on the matrix (row_block_rows), one block per work item.
// Every output row is computed by one thread with the kernel's fixed order, so results are bit-identical whatever
// the thread count and whatever else is in the job.
//
// Ownership: a MatmulRunner borrows the pool; its scratch (the item table) grows to the largest job seen and is
// reused, so a steady-state step allocates nothing here. Threading: one thread calls run() at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cpu/gemv.h"
#include "cpu/isa.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {

// Rows per work item for a matrix with rows of `row_bytes`: about 16 KiB of weights per item, 1..64 rows.
int64_t row_block_rows(uint64_t row_bytes);

class MatmulRunner {
 public:
  MatmulRunner(WorkerPool& pool, Isa isa) : pool_(pool), isa_(isa) {}

  Isa isa() const { return isa_; }
  WorkerPool& pool() { return pool_; }

  // Runs every task (each made by gemv_task, so its type has a kernel) to completion. Tasks with n_vec == 0 or no
  // rows are skipped.
  void run(std::span<const GemvTask> tasks);

 private:
  struct Item {
    uint32_t task;
    int64_t row_begin, row_end;
  };
  WorkerPool& pool_;
  Isa isa_;
  std::vector<GemvTask> tasks_;
  std::vector<GemvRowsFn> fns_;
  std::vector<Item> items_;
};

}  // namespace kestrel::cpu
