// Parallel GEMV over the worker pool: several products (GemvTask, gemv.h) of one step run as one pool job, each
// product cut into blocks of rows whose size depends only on the matrix (row_block_rows), one block per work item.
// Every output row is computed by one thread with the kernel's fixed order, so results are bit-identical whatever
// the thread count and whatever else is in the job.
//
// Tasks whose kernel reads int8 activations (GemvInput::kQ8 or kQ8K) get them here: each distinct input of a run()
// (x, its rows, n_in) is quantized once into each form its kernels read (act_q8.h), inline when small, over the pool
// when large, before the products start.
// A task with w_up is a SwiGLU pair: each item computes its rows of W x and W_up x and writes silu(W x) · (W_up x)
// (ref::swiglu_forward's activation), so gate and up need no second pass and no buffer of their own.
//
// Ownership: a MatmulRunner borrows the pool; its scratch (the item table, the quantized activations) grows to the
// largest job seen and is reused, so a steady-state step allocates nothing here. Threading: one thread calls run()
// at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cpu/gemv.h"
#include "cpu/isa.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {

// Rows per work item for a matrix with rows of `row_bytes`: about 16 KiB of weights per item, 1..64 rows, a multiple
// of 4 from 4 rows up (the int8 kernels' row tiles).
int64_t row_block_rows(uint64_t row_bytes);

class MatmulRunner {
 public:
  // `act`: the activation form to prefer (gemv_kernel); kQ8 where the level has such a kernel for a type.
  MatmulRunner(WorkerPool& pool, Isa isa, GemvInput act) : pool_(pool), isa_(isa), act_(act) {}

  Isa isa() const { return isa_; }
  GemvInput activations() const { return act_; }
  WorkerPool& pool() { return pool_; }

  // Runs every task (each made by gemv_task, so its type has a kernel) to completion. Tasks with n_vec == 0 or no
  // rows are skipped.
  void run(std::span<const GemvTask> tasks);

 private:
  struct Item {
    uint32_t task;
    int64_t row_begin, row_end;
  };
  struct Quantized {  // one input of this run in int8 form
    const float* x;
    int64_t n_vec, n_in;
    ActQ8Forms forms;  // the forms its tasks' kernels read
    ActQ8View view;
  };
  // The index in quantized_ of task t's input, adding it when this run has not seen it, with `form` marked.
  uint32_t quantized(const GemvTask& t, GemvInput form);
  // Rows [row_begin, row_end) of a SwiGLU pair task.
  static void run_pair(const GemvTask& task, GemvRowsFn fn, int64_t row_begin, int64_t row_end);

  static constexpr int64_t kInlineQuantElements = 32 * 1024;  // quantized on the calling thread up to this

  WorkerPool& pool_;
  Isa isa_;
  GemvInput act_;
  std::vector<GemvTask> tasks_;
  std::vector<GemvRowsFn> fns_;
  std::vector<int64_t> task_input_;  // per task: its index in quantized_, or −1 for f32 activations
  std::vector<Item> items_;
  std::vector<Quantized> quantized_;
  std::vector<std::unique_ptr<ActQ8Buffer>> buffers_;      // buffers_[i] holds quantized_[i]
  std::vector<std::pair<uint32_t, int64_t>> quant_items_;  // (quantized_ index, vector) still to quantize
  int64_t quant_elements_ = 0;                             // their elements
};

}  // namespace kestrel::cpu
