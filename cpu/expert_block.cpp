// ExpertBlock (expert_block.h): choices packed by expert, the expert products as two pool jobs, the weighted sums.
#include "cpu/expert_block.h"

#include <algorithm>
#include <optional>

#include "core/reference/activations.h"
#include "cpu/tick.h"

namespace kestrel::cpu {
namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

constexpr size_t kCombineColumns = 512;  // columns of one row per item of the weighted sums

// y[i] += x[i] · w for i < n, each element's multiply and add as written (no fusing): in runs of 16 with a constant
// trip count, which GCC's -O2 vectorizes (the unknown-length loop it leaves scalar), then the rest.
void scaled_add(float* __restrict y, const float* __restrict x, float w, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (size_t j = 0; j < 16; ++j) y[i + j] += x[i + j] * w;
  }
  for (; i < n; ++i) y[i] += x[i] * w;
}

// The view of expert e's matrix inside a 3-D expert tensor (ref::expert_matrix without the error path: e < E).
ref::QuantMatrix expert(const ref::QuantExperts& w, size_t e) {
  const uint64_t row_bytes = *ggml_row_bytes(w.type, w.n_in);
  return ref::QuantMatrix{w.type, w.data + e * w.n_out * row_bytes, w.n_in, w.n_out};
}

}  // namespace

void ExpertBlock::run(MatmulRunner& mm, const ref::MoeWeights& w, const float* x, int n_rows,
                      const ExpertChoice* choices, int k, const float* shared_logit, float* y, StepProfile* profile) {
  const size_t R = sz(n_rows), K = sz(k), H = sz(static_cast<int64_t>(w.gate_exps.n_in));
  const size_t E = sz(static_cast<int64_t>(w.gate_exps.n_expert)), I = sz(static_cast<int64_t>(w.gate_exps.n_out));
  const bool shared = shared_logit != nullptr;
  const size_t Is = shared ? sz(static_cast<int64_t>(w.gate_shexp.n_out)) : 0;
  std::optional<SectionTimer> timer(std::in_place, profile, StepSection::kMoeExperts);

  // Pack the (row, choice) pairs by expert (ascending), rows of one expert in batch order.
  if (packed_.size() < R * K) packed_.resize(R * K);
  if (slot_.size() < R * K) slot_.resize(R * K);
  start_.assign(E + 1, 0);
  fill_.assign(E, 0);
  for (size_t i = 0; i < R * K; ++i) {
    if (choices[i].expert != kExpertNotHere) ++start_[sz(choices[i].expert) + 1];
  }
  for (size_t e = 0; e < E; ++e) start_[e + 1] += start_[e];
  for (size_t r = 0; r < R; ++r) {
    for (size_t j = 0; j < K; ++j) {
      const int32_t id = choices[r * K + j].expert;
      if (id == kExpertNotHere) {
        slot_[r * K + j] = -1;
        continue;
      }
      const int32_t p = start_[sz(id)] + fill_[sz(id)]++;
      packed_[sz(p)] = static_cast<int32_t>(r);
      slot_[r * K + j] = p;
    }
  }
  const size_t P = sz(start_[E]);
  float* ge = grow(ge_, P * I);  // f32 [P, I]: silu(gate) · up of each packed row
  float* ye = grow(ye_, P * H);  // f32 [P, H]: its expert's output
  if (iota_.size() < P) {
    const size_t from = iota_.size();
    iota_.resize(P);
    for (size_t p = from; p < P; ++p) iota_[p] = static_cast<int32_t>(p);
  }

  // Gate and up of every used expert and of the shared expert as SwiGLU pairs over the batch rows in place (each
  // expert reads its rows of x through packed_; one quantization of x serves them all): one job.
  float* sg = grow(sg_, R * Is);
  float* sy = grow(sy_, R * (shared ? H : 0));
  tasks_.clear();
  for (size_t e = 0; e < E; ++e) {
    const int64_t rows = start_[e + 1] - start_[e];
    if (rows == 0) continue;
    const size_t p0 = sz(start_[e]);
    GemvTask t = task_of(expert(w.gate_exps, e), x, rows, ge + p0 * I);
    t.w_up = expert(w.up_exps, e).data;
    t.x_rows = packed_.data() + p0;
    t.x_count = n_rows;
    tasks_.push_back(t);
  }
  if (shared) {
    GemvTask t = task_of(w.gate_shexp, x, n_rows, sg);
    t.w_up = w.up_shexp.data;
    tasks_.push_back(t);
  }
  if (!tasks_.empty()) mm.run(tasks_);

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
  if (shared) tasks_.push_back(task_of(w.down_shexp, sg, n_rows, sy));
  if (!tasks_.empty()) mm.run(tasks_);

  timer.emplace(profile, StepSection::kMoeCombine);
  // Per row: 0, plus its experts in ascending id (the reference's order), plus the gated shared expert; over the pool
  // in blocks of kCombineColumns columns of one row (each element sees the same operations in the same order).
  const size_t n_blocks = (H + kCombineColumns - 1) / kCombineColumns;
  auto combine = [&](int64_t item) {
    const size_t r = sz(item) / n_blocks, c0 = (sz(item) % n_blocks) * kCombineColumns;
    const size_t c1 = std::min(H, c0 + kCombineColumns);
    float* yr = y + r * H;
    std::fill(yr + c0, yr + c1, 0.0f);
    size_t order[kMaxExpertChoices];  // the row's choices of this block, by expert id
    size_t n = 0;
    for (size_t j = 0; j < K; ++j) {
      if (slot_[r * K + j] >= 0) order[n++] = j;
    }
    std::sort(order, order + n,
              [&](size_t a, size_t b) { return choices[r * K + a].expert < choices[r * K + b].expert; });
    for (size_t jj = 0; jj < n; ++jj) {
      const size_t j = order[jj];
      scaled_add(yr + c0, ye + sz(slot_[r * K + j]) * H + c0, choices[r * K + j].weight, c1 - c0);
    }
    if (shared) scaled_add(yr + c0, sy + r * H + c0, ref::sigmoid(shared_logit[r]), c1 - c0);
  };
  mm.pool().for_each(static_cast<int64_t>(R * n_blocks), combine);
}

}  // namespace kestrel::cpu
