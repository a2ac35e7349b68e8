// SamplingParams: the per-request knobs of the sampler (docs/sampling.md), and their validation.
//
// A plain value type. Every knob has an "off" value, and the defaults are all "off" except temperature 1: plain
// sampling from softmax(logits). Kestrel's own defaults (llama.cpp's 0.8 / 40 / 0.95 / 0.05), where kestreld's
// [sampling] and `kestrel run` start, are kestrel_default_sampling(). validate() is the only check; Sampler refuses
// params that fail it.
#pragma once

#include <cstdint>

#include "core/base/expected.h"

namespace kestrel {

struct SamplingParams {
  static constexpr int32_t kMaxLogprobs = 20;

  float temperature = 1.0f;         // >= 0; 0 = greedy (argmax of the penalized logits, lowest id on ties)
  int32_t top_k = 0;                // >= 0; 0 = off; larger than the vocabulary = off
  float top_p = 1.0f;               // (0, 1]; 1 = off
  float min_p = 0.0f;               // [0, 1]; 0 = off; keeps p_i >= min_p * p_max
  float repetition_penalty = 1.0f;  // > 0; 1 = off; CTRL / llama.cpp: logit > 0 → logit / rp, else logit * rp
  float presence_penalty = 0.0f;    // finite; 0 = off; subtracted once from every token in the window
  float frequency_penalty = 0.0f;   // finite; 0 = off; subtracted once per occurrence in the window
  int32_t penalty_last_n = 64;      // >= -1; how many recent tokens the penalties see; -1 = whole history; 0 = off
  uint64_t seed = 0;                // seeds the session's xoshiro256** stream (splitmix64 expansion)
  int32_t n_logprobs = 0;           // 0..20: how many top (id, logprob) pairs to return; 0 = no log-probabilities

  // kInvalidArgument naming the first bad field and its value: negative or non-finite temperature, top_k < 0,
  // top_p outside (0, 1], min_p outside [0, 1], repetition_penalty <= 0, non-finite presence/frequency penalty,
  // penalty_last_n < -1, n_logprobs outside [0, 20]. NaN is rejected everywhere.
  Status validate() const;

  // True when the penalty stage changes anything (a window and at least one penalty that is not "off").
  bool penalties_active() const;
};

// Kestrel's default sampling: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05 (llama.cpp's), penalties off with a
// 64-token window, seed 0 — which kestreld and `kestrel run` replace by a random seed unless one is given.
SamplingParams kestrel_default_sampling();

}  // namespace kestrel
