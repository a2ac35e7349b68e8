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

uint32_t MatmulRunner::quantized(const GemvTask& t, GemvInput form) {
  const int64_t rows = t.x_rows != nullptr ? t.x_count : t.n_vec;
  uint32_t index = 0;
  while (index < quantized_.size()) {
    const Quantized& q = quantized_[index];
    if (q.x == t.x && q.n_vec == rows && q.n_in == t.n_in) break;
    ++index;
  }
  if (index == quantized_.size()) quantized_.push_back({t.x, rows, t.n_in, ActQ8Forms{false, false}, ActQ8View{}});
  (form == GemvInput::kQ8K ? quantized_[index].forms.block256 : quantized_[index].forms.block32) = true;
  return index;
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
  task_input_.clear();
  for (GemvTask& task : tasks_) {
    const GemvKernel k = gemv_kernel(isa_, task.type, act_);
    fns_.push_back(k.fn);
    const bool int8 = k.input != GemvInput::kF32 && task.n_vec > 0 && task.n_out > 0;
    task_input_.push_back(int8 ? static_cast<int64_t>(quantized(task, k.input)) : -1);
  }
  // Storage for every input in the forms its kernels read, then the views into the tasks.
  for (uint32_t i = 0; i < quantized_.size(); ++i) {
    Quantized& q = quantized_[i];
    if (buffers_.size() <= i) buffers_.push_back(std::make_unique<ActQ8Buffer>());
    q.view = buffers_[i]->reserve(q.n_vec, q.n_in, q.forms);
    for (int64_t v = 0; v < q.n_vec; ++v) quant_items_.emplace_back(i, v);
    quant_elements_ += q.n_vec * q.n_in * ((q.forms.block32 ? 1 : 0) + (q.forms.block256 ? 1 : 0));
  }
  for (size_t t = 0; t < tasks_.size(); ++t) {
    if (task_input_[t] >= 0) tasks_[t].xq = quantized_[static_cast<size_t>(task_input_[t])].view;
  }
  // Quantize the inputs: inline for a few vectors (a decode step: a pool job costs more than quantizing them), over
  // the pool for a prompt's many.
  auto quantize = [this](int64_t i) {
    const auto [index, v] = quant_items_[static_cast<size_t>(i)];
    const Quantized& q = quantized_[index];
    if (q.forms.block32) act_q8_quantize(q.x, q.n_in, v, v + 1, *buffers_[index], isa_);
    if (q.forms.block256) act_q8k_quantize(q.x, q.n_in, v, v + 1, *buffers_[index], isa_);
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
