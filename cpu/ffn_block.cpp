// FfnBlock (ffn_block.h): batched router, rows packed by expert, expert products as two pool jobs.
#include "cpu/ffn_block.h"

#include <algorithm>
#include <optional>

#include "core/reference/activations.h"

namespace kestrel::cpu {
namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

// The view of expert e's matrix inside a 3-D expert tensor (ref::expert_matrix without the error path: e < E).
ref::QuantMatrix expert(const ref::QuantExperts& w, size_t e) {
  const uint64_t row_bytes = *ggml_row_bytes(w.type, w.n_in);
  return ref::QuantMatrix{w.type, w.data + e * w.n_out * row_bytes, w.n_in, w.n_out};
}

}  // namespace

void FfnBlock::route(const float* logits, size_t E, size_t k, int32_t* ids, float* weights) {
  // ref::moe_route's operations in its order, over member buffers instead of the ones it allocates.
  probs_.assign(logits, logits + E);
  ref::softmax(probs_.data(), static_cast<int>(E));
  taken_.assign(E, 0);
  float sum = 0.0f;
  for (size_t j = 0; j < k; ++j) {
    size_t best = E;
    for (size_t e = 0; e < E; ++e) {  // strict '>' keeps the lowest index among equals
      if (taken_[e] == 0 && (best == E || probs_[e] > probs_[best])) best = e;
    }
    taken_[best] = 1;
    ids[j] = static_cast<int32_t>(best);
    weights[j] = probs_[best];
    sum += weights[j];
  }
  const float denom = std::max(sum, ref::kMoeWeightSumMin);
  for (size_t j = 0; j < k; ++j) weights[j] = weights[j] / denom;
}

void FfnBlock::run_moe(const Pass& pass, const ref::MoeWeights& w, const float* x, float* out) {
  const size_t R = sz(pass.n_rows), H = sz(static_cast<int64_t>(w.router.n_in));
  const size_t E = sz(static_cast<int64_t>(w.router.n_out)), k = sz(w.n_expert_used);
  const size_t I = sz(static_cast<int64_t>(w.gate_exps.n_out));
  const bool shared = w.has_shared_expert();
  const size_t Is = shared ? sz(static_cast<int64_t>(w.gate_shexp.n_out)) : 0;
  const int n = pass.n_rows;

  std::optional<SectionTimer> timer(std::in_place, pass.profile, StepSection::kMoeRouter);
  float* logits = grow(logits_, R * E);
  float* sgate = grow(sgate_, R);
  tasks_.clear();
  tasks_.push_back(task_of(w.router, x, n, logits));
  if (shared) tasks_.push_back(task_of(w.shared_gate_inp, x, n, sgate));
  pass.mm->run(tasks_);

  if (ids_.size() < R * k) ids_.resize(R * k);
  if (slot_.size() < R * k) slot_.resize(R * k);
  if (packed_.size() < R * k) packed_.resize(R * k);
  float* wts = grow(wts_, R * k);
  for (size_t r = 0; r < R; ++r) route(logits + r * E, E, k, ids_.data() + r * k, wts + r * k);

  // Pack the rows by expert (ascending), rows of one expert in batch order.
  start_.assign(E + 1, 0);
  fill_.assign(E, 0);
  for (size_t i = 0; i < R * k; ++i) ++start_[sz(ids_[i]) + 1];
  for (size_t e = 0; e < E; ++e) start_[e + 1] += start_[e];
  for (size_t r = 0; r < R; ++r) {
    for (size_t j = 0; j < k; ++j) {
      const size_t e = sz(ids_[r * k + j]);
      const int32_t p = start_[e] + fill_[e]++;
      packed_[sz(p)] = static_cast<int32_t>(r);
      slot_[r * k + j] = p;
    }
  }
  const size_t P = R * k;
  float* ge = grow(ge_, P * I);  // f32 [P, I]: silu(gate) · up of each packed row
  float* ye = grow(ye_, P * H);  // f32 [P, H]: its expert's output
  if (iota_.size() < P) {
    iota_.resize(P);
    for (size_t p = 0; p < P; ++p) iota_[p] = static_cast<int32_t>(p);
  }

  timer.emplace(pass.profile, StepSection::kMoeExperts);
  // Gate and up of every used expert and of the shared expert as SwiGLU pairs over the batch rows in place (each
  // expert reads its rows of x through packed_; one quantization of x serves them all): one job.
  float* sg = grow(sg_, R * Is);
  float* sy = grow(sy_, R * H);
  tasks_.clear();
  for (size_t e = 0; e < E; ++e) {
    const int64_t rows = start_[e + 1] - start_[e];
    if (rows == 0) continue;
    const size_t p0 = sz(start_[e]);
    GemvTask t = task_of(expert(w.gate_exps, e), x, rows, ge + p0 * I);
    t.w_up = expert(w.up_exps, e).data;
    t.x_rows = packed_.data() + p0;
    t.x_count = n;
    tasks_.push_back(t);
  }
  if (shared) {
    GemvTask t = task_of(w.gate_shexp, x, n, sg);
    t.w_up = w.up_shexp.data;
    tasks_.push_back(t);
  }
  pass.mm->run(tasks_);

  // Down of every used expert (reading the packed rows of ge, quantized once) and of the shared expert: one job.
  tasks_.clear();
  for (size_t e = 0; e < E; ++e) {
    const int64_t rows = start_[e + 1] - start_[e];
    if (rows == 0) continue;
    const size_t p0 = sz(start_[e]);
    GemvTask t = task_of(expert(w.down_exps, e), ge, rows, ye + p0 * H);
    t.x_rows = iota_.data() + p0;
    t.x_count = static_cast<int64_t>(P);
    tasks_.push_back(t);
  }
  if (shared) tasks_.push_back(task_of(w.down_shexp, sg, n, sy));
  pass.mm->run(tasks_);

  timer.emplace(pass.profile, StepSection::kMoeCombine);
  // Per row: experts in ascending id (the reference's order), then the gated shared expert.
  for (size_t r = 0; r < R; ++r) {
    float* y = out + r * H;
    std::fill(y, y + H, 0.0f);
    size_t order[64];  // the row's k choices sorted by expert id (k <= 64 is checked when the engine is made)
    for (size_t j = 0; j < k; ++j) order[j] = j;
    std::sort(order, order + k, [&](size_t a, size_t b) { return ids_[r * k + a] < ids_[r * k + b]; });
    for (size_t jj = 0; jj < k; ++jj) {
      const size_t j = order[jj];
      const float* src = ye + sz(slot_[r * k + j]) * H;
      const float wt = wts[r * k + j];
      for (size_t i = 0; i < H; ++i) y[i] += src[i] * wt;
    }
    if (shared) {
      const float s = ref::sigmoid(sgate[r]);
      for (size_t i = 0; i < H; ++i) y[i] += s * sy[r * H + i];
    }
  }
}

void FfnBlock::run_dense(const Pass& pass, const ref::DenseFfnWeights& w, const float* x, float* out) {
  const size_t R = sz(pass.n_rows), I = sz(static_cast<int64_t>(w.gate.n_out));
  float* g = grow(ge_, R * I);  // f32 [R, I]: silu(gate) · up
  tasks_.clear();
  GemvTask t = task_of(w.gate, x, pass.n_rows, g);
  t.w_up = w.up.data;
  tasks_.push_back(t);
  pass.mm->run(tasks_);
  tasks_.clear();
  tasks_.push_back(task_of(w.down, g, pass.n_rows, out));
  pass.mm->run(tasks_);
}

}  // namespace kestrel::cpu
