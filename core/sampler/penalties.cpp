// Penalties: count the window once, then change only the logits of tokens that occur in it.
#include "core/sampler/penalties.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <string>

namespace kestrel {

std::span<const int32_t> penalty_window(std::span<const int32_t> history, int32_t last_n) {
  if (last_n < 0 || static_cast<size_t>(last_n) >= history.size()) return history;
  return history.last(static_cast<size_t>(last_n));
}

PenaltyCounter::PenaltyCounter(int32_t n_vocab) : counts_(static_cast<size_t>(std::max(n_vocab, 0)), 0u) {}

void PenaltyCounter::apply(const SamplingParams& params, std::span<const int32_t> window, std::span<float> logits) {
  assert(logits.size() == counts_.size());
  for (int32_t id : window) {
    assert(id >= 0 && static_cast<size_t>(id) < counts_.size());
    if (id < 0 || static_cast<size_t>(id) >= counts_.size()) continue;
    if (counts_[static_cast<size_t>(id)]++ == 0) distinct_.push_back(id);
  }
  constexpr float kMax = std::numeric_limits<float>::max();
  const float rp = params.repetition_penalty;
  for (int32_t id : distinct_) {
    const auto i = static_cast<size_t>(id);
    const float count = static_cast<float>(counts_[i]);
    counts_[i] = 0;
    float logit = logits[i];
    if (std::isinf(logit) && logit < 0) continue;  // masked stays masked
    const bool was_finite = std::isfinite(logit);
    logit = logit > 0.0f ? logit / rp : logit * rp;
    logit -= count * params.frequency_penalty + params.presence_penalty;
    if (was_finite) logit = std::clamp(logit, -kMax, kMax);
    logits[i] = logit;
  }
  distinct_.clear();
}

Status apply_penalties(const SamplingParams& params, std::span<const int32_t> history, std::span<float> logits,
                       PenaltyCounter* counter) {
  if (logits.size() != static_cast<size_t>(counter->n_vocab())) {
    return make_error(ErrorCode::kInvalidArgument, "penalties: " + std::to_string(logits.size()) +
                                                       " logits for a vocabulary of " +
                                                       std::to_string(counter->n_vocab()));
  }
  if (!params.penalties_active()) return ok_status();
  const std::span<const int32_t> window = penalty_window(history, params.penalty_last_n);
  for (int32_t id : window) {
    if (id < 0 || id >= counter->n_vocab()) {
      return make_error(ErrorCode::kInvalidArgument, "penalties: history token " + std::to_string(id) +
                                                         " is outside the vocabulary [0, " +
                                                         std::to_string(counter->n_vocab()) + ")");
    }
  }
  counter->apply(params, window, logits);
  return ok_status();
}

}  // namespace kestrel
