// Sampler: turns one session's logits into its next token (docs/sampling.md).
//
// Chain (llama.cpp's default order, minus the stages Kestrel does not offer):
//   penalties → [temperature 0: argmax] → top-k → top-p → min-p → temperature → draw
// plus, when n_logprobs > 0, log-probabilities of the penalized, untruncated, temperature-1 distribution.
// One Sampler per session: it owns the session's Rng (xoshiro256**, portable, so one seed gives one token sequence
// on every platform) and vocabulary-sized scratch (about 20 bytes per vocabulary entry, 5 MiB for 248k), so a
// step allocates nothing beyond the short top-logprob lists. The window the penalties see is read from the caller's
// history on each call.
//
// Thread-safety: none; a Sampler is used by one thread at a time (the engine loop for its session). Different
// Samplers are independent. Move-only; clone() is the explicit copy used when a session forks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/base/expected.h"
#include "core/sampler/candidates.h"
#include "core/sampler/logit_scan.h"
#include "core/sampler/logprobs.h"
#include "core/sampler/penalties.h"
#include "core/sampler/rng.h"
#include "core/sampler/sampling_params.h"

namespace kestrel {

struct SampleResult {
  int32_t token = -1;
  // Set only when params.n_logprobs > 0 (has_logprobs); see logprobs.h for the distribution they describe.
  bool has_logprobs = false;
  float logprob = 0.0f;           // log P(token)
  std::vector<TokenLogprob> top;  // [<= n_logprobs], logprob descending, ties by lower id
};

class Sampler {
 public:
  // kInvalidArgument when params.validate() fails or n_vocab <= 0. The Rng is seeded from params.seed.
  static Expected<Sampler> create(const SamplingParams& params, int32_t n_vocab);

  Sampler(Sampler&&) noexcept = default;
  Sampler& operator=(Sampler&&) noexcept = default;
  ~Sampler() = default;

  // An independent Sampler with the same params and the same Rng state: fed the same logits and history, the
  // fork and the original draw the same tokens.
  Sampler clone() const;

  // Replaces the params (validated; on error nothing changes). The Rng stream continues; call reseed() to
  // restart it from a seed.
  Status set_params(const SamplingParams& params);
  void reseed(uint64_t seed) { rng_ = Rng(seed); }
  // Session snapshot / restore of the stream position.
  const Rng::State& rng_state() const { return rng_.state(); }
  Status restore_rng_state(const Rng::State& state);

  const SamplingParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }

  // Checked entry point: kInvalidArgument when logits.size() != n_vocab, a logit is NaN or +inf, every logit is
  // -inf, or a token of the penalty window is outside the vocabulary. Otherwise the same as sample().
  // logits: f32 [n_vocab], borrowed for the call. history: the session's tokens, oldest first, borrowed.
  // out: optional (may be null), filled when given.
  Expected<int32_t> sample_checked(std::span<const float> logits, std::span<const int32_t> history, SampleResult* out);

  // Hot path without input checks. Preconditions (asserted in debug builds; sample_checked verifies them):
  // logits.size() == n_vocab, no NaN or +inf, at least one logit > -inf, window ids inside the vocabulary.
  // Greedy (temperature 0) consumes no random numbers; every other call consumes exactly one next_u64().
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, SampleResult* out);

 private:
  Sampler(const SamplingParams& params, int32_t n_vocab);

  SamplingParams params_;
  int32_t n_vocab_;
  Rng rng_;
  // Scratch, reused across calls; contents meaningless between calls.
  PenaltyCounter penalty_counter_;
  std::vector<float> penalized_;  // f32 [n_vocab], the logits after penalties
  CandidateSet candidates_;       // [<= n_vocab]
};

}  // namespace kestrel
