// Sampler: runs the chain of sampler.h over scratch it owns; the stages live in penalties/candidates/logprobs.
#include "core/sampler/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <string>

namespace kestrel {

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params),
      n_vocab_(n_vocab),
      rng_(params.seed),
      penalty_counter_(n_vocab),
      penalized_(static_cast<size_t>(n_vocab)) {
  candidates_.items.reserve(static_cast<size_t>(n_vocab));
}

Expected<Sampler> Sampler::create(const SamplingParams& params, int32_t n_vocab) {
  KESTREL_TRY(params.validate());
  if (n_vocab <= 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "sampler: vocabulary size must be > 0, got " + std::to_string(n_vocab));
  }
  return Sampler(params, n_vocab);
}

Sampler Sampler::clone() const {
  Sampler copy(params_, n_vocab_);
  copy.rng_ = rng_;
  return copy;
}

Status Sampler::set_params(const SamplingParams& params) {
  KESTREL_TRY(params.validate());
  params_ = params;
  return ok_status();
}

Status Sampler::restore_rng_state(const Rng::State& state) {
  KESTREL_TRY_ASSIGN(Rng rng, Rng::from_state(state));
  rng_ = rng;
  return ok_status();
}

Expected<int32_t> Sampler::sample_checked(std::span<const float> logits, std::span<const int32_t> history,
                                          SampleResult* out) {
  if (logits.size() != static_cast<size_t>(n_vocab_)) {
    return make_error(ErrorCode::kInvalidArgument, "sampler: got " + std::to_string(logits.size()) +
                                                       " logits for a vocabulary of " + std::to_string(n_vocab_));
  }
  const LogitScan scan = scan_logits(logits);  // one vectorized pass; the offending index only on failure
  if (scan.any_nan_or_pos_inf) {
    for (size_t i = 0; i < logits.size(); ++i) {
      const float l = logits[i];
      if (std::isnan(l) || l == std::numeric_limits<float>::infinity()) {
        return make_error(ErrorCode::kInvalidArgument, std::string("sampler: logit of token ") + std::to_string(i) +
                                                           " is " + (std::isnan(l) ? "NaN" : "+inf") +
                                                           " (the forward pass produced a non-finite value)");
      }
    }
  }
  if (!scan.any_unmasked) {
    return make_error(ErrorCode::kInvalidArgument, "sampler: every logit is -inf (all tokens are masked)");
  }
  if (params_.penalties_active()) {
    for (int32_t id : penalty_window(history, params_.penalty_last_n)) {
      if (id < 0 || id >= n_vocab_) {
        return make_error(ErrorCode::kInvalidArgument, "sampler: history token " + std::to_string(id) +
                                                           " is outside the vocabulary [0, " +
                                                           std::to_string(n_vocab_) + ")");
      }
    }
  }
  return sample(logits, history, out);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, SampleResult* out) {
  assert(logits.size() == static_cast<size_t>(n_vocab_));

  // 1. Penalties, on a copy (the caller's logits stay untouched).
  std::span<const float> effective = logits;  // f32 [n_vocab]
  if (params_.penalties_active()) {
    std::copy(logits.begin(), logits.end(), penalized_.begin());
    penalty_counter_.apply(params_, penalty_window(history, params_.penalty_last_n), penalized_);
    effective = penalized_;
  }

  int32_t token;
  if (params_.temperature == 0.0f) {
    // 2a. Greedy: truncation never removes the argmax and temperature does not move it, so skip them.
    token = argmax_lowest(effective);
  } else {
    // 2b. Truncate, then draw from softmax(logit / T) over what is left.
    candidates_fill(effective, params_.top_k, &candidates_);
    assert(!candidates_.items.empty());
    if (candidates_.items.empty()) {
      token = argmax_lowest(effective);  // precondition broken (no finite logit): a defined answer, no draw
    } else {
      candidates_top_p(&candidates_, params_.top_p);
      candidates_min_p(&candidates_, params_.min_p);
      token = candidates_draw(&candidates_, params_.temperature, rng_.next_double());
    }
  }

  if (out != nullptr) {
    out->token = token;
    out->has_logprobs = params_.n_logprobs > 0;
    out->top.clear();
    out->logprob = 0.0f;
    if (out->has_logprobs) {
      const double lse = log_sum_exp(effective);
      out->logprob = static_cast<float>(static_cast<double>(effective[static_cast<size_t>(token)]) - lse);
      top_logprobs(effective, lse, params_.n_logprobs, &out->top);
    }
  }
  return token;
}

}  // namespace kestrel
