// MatmulRunner (matmul.h): a flat table of (task, row block) items handed to the pool as one job.
#include "cpu/matmul.h"

#include <algorithm>

#include "cpu/tick.h"

namespace kestrel::cpu {

int64_t row_block_rows(uint64_t row_bytes) {
  constexpr uint64_t kItemBytes = 16 * 1024;
  const uint64_t rows = row_bytes == 0 ? 64 : kItemBytes / row_bytes;
  return static_cast<int64_t>(std::clamp<uint64_t>(rows, 1, 64));
}

void MatmulRunner::run(std::span<const GemvTask> tasks) {
  tasks_.assign(tasks.begin(), tasks.end());
  fns_.clear();
  items_.clear();
  for (const GemvTask& task : tasks_) fns_.push_back(gemv_kernel(isa_, task.type));
  for (uint32_t t = 0; t < tasks_.size(); ++t) {
    const GemvTask& task = tasks_[t];
    if (task.n_vec <= 0 || task.n_out <= 0) continue;
    const int64_t block = row_block_rows(task.row_bytes);
    for (int64_t r = 0; r < task.n_out; r += block) items_.push_back({t, r, std::min(task.n_out, r + block)});
  }
  auto body = [this](int64_t i) {
    const Item& it = items_[static_cast<size_t>(i)];
    const GemvTask& task = tasks_[it.task];
    fns_[it.task](task, it.row_begin, it.row_end);
  };
  pool_.for_each(static_cast<int64_t>(items_.size()), body);
}

GemvTask task_of(const ref::QuantMatrix& w, const float* x, int64_t n_vec, float* y) {
  GemvTask t;
  t.type = w.type;
  t.w = w.data;
  t.row_bytes = *ggml_row_bytes(w.type, w.n_in);  // checked when the engine was made
  t.n_in = static_cast<int64_t>(w.n_in);
  t.n_out = static_cast<int64_t>(w.n_out);
  t.x = x;
  t.n_vec = n_vec;
  t.y = y;
  return t;
}

}  // namespace kestrel::cpu
