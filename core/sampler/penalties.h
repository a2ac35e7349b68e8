// Repetition, presence and frequency penalties over a window of the session's recent tokens (docs/sampling.md §2).
//
// For every distinct token t in the window, with c = its count there (llama.cpp's penalties sampler, CTRL's
// repetition penalty with the usual sign fix):
//   logit[t] = logit[t] > 0 ? logit[t] / repetition_penalty : logit[t] * repetition_penalty
//   logit[t] -= c * frequency_penalty + presence_penalty
// in f32, in that order. A finite logit stays finite (results are clamped to ±FLT_MAX); -inf stays -inf.
// The window is the last penalty_last_n entries of `history` (all of it for -1, none for 0). The history is the
// session's token list (prompt and generated tokens, oldest first) that the caller already keeps for its KV cache;
// the sampler reads the window from it on every call instead of keeping a second copy that could drift from it
// when a session is rewound or forked.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/base/expected.h"
#include "core/sampler/sampling_params.h"

namespace kestrel {

// The last `last_n` entries of history (-1: all, 0: none).
std::span<const int32_t> penalty_window(std::span<const int32_t> history, int32_t last_n);

// Counts tokens of a window in a vocabulary-sized table; O(window) per use, zero again after apply.
// Owned by one Sampler; not thread-safe.
class PenaltyCounter {
 public:
  explicit PenaltyCounter(int32_t n_vocab);

  int32_t n_vocab() const { return static_cast<int32_t>(counts_.size()); }

  // Applies the penalties of `params` for the tokens of `window` to `logits` (f32 [n_vocab], in place).
  // Precondition: every id in window is in [0, n_vocab) (apply_penalties checks it); out-of-range ids are skipped.
  void apply(const SamplingParams& params, std::span<const int32_t> window, std::span<float> logits);

 private:
  std::vector<uint32_t> counts_;   // u32 [n_vocab], all zero between calls
  std::vector<int32_t> distinct_;  // ids with counts_[id] > 0, in first-seen order
};

// Checked form: kInvalidArgument when logits.size() != counter->n_vocab() or a window id is outside the
// vocabulary; otherwise applies params' penalties for the window of `history` to `logits` in place.
Status apply_penalties(const SamplingParams& params, std::span<const int32_t> history, std::span<float> logits,
                       PenaltyCounter* counter);

}  // namespace kestrel
