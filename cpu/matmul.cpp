// MatmulRunner (matmul.h): a flat table of (task, row block) items handed to the pool as one job.
#include "cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "core/reference/activations.h"
#include "cpu/tick.h"

namespace kestrel::cpu {

int64_t row_block_rows(uint64_t row_bytes) {
  constexpr uint64_t kItemBytes = 16 * 1024;
  const uint64_t rows = std::clamp<uint64_t>(row_bytes == 0 ? 64 : kItemBytes / row_bytes, 1, 64);
  return static_cast<int64_t>(rows >= 4 ? rows / 4 * 4 : rows);  // whole 4-row tiles (gemv_q8_avx512.h)
}

ActQ8View MatmulRunner::quantized(const GemvTask& t) {
  const int64_t rows = t.x_rows != nullptr ? t.x_count : t.n_vec;
  for (const Quantized& q : quantized_) {
    if (q.x == t.x && q.n_vec == rows && q.n_in == t.n_in) return q.view;
  }
  const uint32_t index = static_cast<uint32_t>(quantized_.size());
  if (buffers_.size() <= index) buffers_.push_back(std::make_unique<ActQ8Buffer>());
  quantized_.push_back({t.x, rows, t.n_in, buffers_[index]->reserve(rows, t.n_in)});
  for (int64_t v = 0; v < rows; ++v) quant_items_.emplace_back(index, v);
  quant_elements_ += rows * t.n_in;
  return quantized_.back().view;
}

void MatmulRunner::run_pair(const GemvTask& task, GemvRowsFn fn, int64_t row_begin, int64_t row_end) {
  // Rows [row_begin, row_end) of W and of W_up into per-thread scratch laid out [n_vec, rows] (the kernel's y
  // indexing with n_out = rows), then y = silu(g) · u, the reference's SwiGLU.
  const int64_t rows = row_end - row_begin;
  thread_local std::vector<float> scratch;
  const size_t n = static_cast<size_t>(task.n_vec * rows);
  if (scratch.size() < 2 * n) scratch.resize(2 * n);
  GemvTask part = task;
  part.n_out = rows;
  part.w = task.w + static_cast<uint64_t>(row_begin) * task.row_bytes;
  part.y = scratch.data();
  fn(part, 0, rows);
  part.w = task.w_up + static_cast<uint64_t>(row_begin) * task.row_bytes;
  part.y = scratch.data() + n;
  fn(part, 0, rows);
  for (int64_t v = 0; v < task.n_vec; ++v) {
    const float* g = scratch.data() + v * rows;
    const float* u = g + n;
    float* y = task.y + v * task.n_out + row_begin;
    for (int64_t o = 0; o < rows; ++o) y[o] = ref::silu(g[o]) * u[o];
  }
}

void MatmulRunner::run(std::span<const GemvTask> tasks) {
  tasks_.assign(tasks.begin(), tasks.end());
  fns_.clear();
  items_.clear();
  quantized_.clear();
  quant_items_.clear();
  quant_elements_ = 0;
  for (GemvTask& task : tasks_) {
    const GemvKernel k = gemv_kernel(isa_, task.type, act_);
    fns_.push_back(k.fn);
    if (k.input == GemvInput::kQ8 && task.n_vec > 0 && task.n_out > 0) task.xq = quantized(task);
  }
  // Quantize the inputs: inline for a few vectors (a decode step: a pool job costs more than quantizing them), over
  // the pool for a prompt's many.
  auto quantize = [this](int64_t i) {
    const auto [index, v] = quant_items_[static_cast<size_t>(i)];
    const Quantized& q = quantized_[index];
    act_q8_quantize(q.x, q.n_in, v, v + 1, *buffers_[index]);
  };
  const int64_t n_quant = static_cast<int64_t>(quant_items_.size());
  if (quant_elements_ > kInlineQuantElements) {
    pool_.for_each(n_quant, quantize);
  } else {
    for (int64_t i = 0; i < n_quant; ++i) quantize(i);
  }
  for (uint32_t t = 0; t < tasks_.size(); ++t) {
    const GemvTask& task = tasks_[t];
    if (task.n_vec <= 0 || task.n_out <= 0) continue;
    const int64_t block = row_block_rows(task.row_bytes);
    for (int64_t r = 0; r < task.n_out; r += block) items_.push_back({t, r, std::min(task.n_out, r + block)});
  }
  auto body = [this](int64_t i) {
    const Item& it = items_[static_cast<size_t>(i)];
    const GemvTask& task = tasks_[it.task];
    if (task.w_up != nullptr) {
      run_pair(task, fns_[it.task], it.row_begin, it.row_end);
    } else {
      fns_[it.task](task, it.row_begin, it.row_end);
    }
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
