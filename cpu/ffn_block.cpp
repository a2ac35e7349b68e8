// FfnBlock (ffn_block.h): batched router and routing, then the experts through ExpertBlock.
#include "cpu/ffn_block.h"

#include <algorithm>
#include <optional>

#include "core/reference/activations.h"

namespace kestrel::cpu {
namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void FfnBlock::route(const float* logits, size_t E, size_t k, ExpertChoice* choices) {
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
    choices[j].expert = static_cast<int32_t>(best);
    choices[j].weight = probs_[best];
    sum += choices[j].weight;
  }
  const float denom = std::max(sum, ref::kMoeWeightSumMin);
  for (size_t j = 0; j < k; ++j) choices[j].weight = choices[j].weight / denom;
}

void FfnBlock::run_moe(const Pass& pass, const ref::MoeWeights& w, const float* x, float* out,
                       uint64_t* expert_counts) {
  const size_t R = sz(pass.n_rows);
  const size_t E = sz(static_cast<int64_t>(w.router.n_out)), k = sz(w.n_expert_used);
  const bool shared = w.has_shared_expert();
  const int n = pass.n_rows;

  std::optional<SectionTimer> timer(std::in_place, pass.profile, StepSection::kMoeRouter);
  float* logits = grow(logits_, R * E);
  float* sgate = grow(sgate_, R);
  tasks_.clear();
  tasks_.push_back(task_of(w.router, x, n, logits));
  if (shared) tasks_.push_back(task_of(w.shared_gate_inp, x, n, sgate));
  pass.mm->run(tasks_);
  if (choices_.size() < R * k) choices_.resize(R * k);
  for (size_t r = 0; r < R; ++r) route(logits + r * E, E, k, choices_.data() + r * k);
  if (expert_counts != nullptr) {
    for (size_t i = 0; i < R * k; ++i) ++expert_counts[static_cast<size_t>(choices_[i].expert)];
  }
  timer.reset();

  experts_.run(*pass.mm, w, x, n, choices_.data(), static_cast<int>(k), shared ? sgate : nullptr, out, pass.profile);
}

void FfnBlock::run_dense(const Pass& pass, const ref::DenseFfnWeights& w, const float* x, float* out) {
  const size_t R = sz(pass.n_rows), I = sz(static_cast<int64_t>(w.gate.n_out));
  float* g = grow(dense_, R * I);  // f32 [R, I]: silu(gate) · up
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
