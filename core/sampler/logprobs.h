// Log-probabilities reported with a sampled token (docs/sampling.md §5).
//
// They describe the model's distribution after the penalties and before any truncation or temperature:
// log_softmax of the full vocabulary of penalized logits, accumulated in f64. That makes them comparable across
// requests whatever top-k / top-p / min-p / temperature each request uses (the quantities OpenAI-style APIs and
// perplexity measurements expect), and independent of which token the draw happened to pick. Masked (-inf)
// logits have logprob -inf and are never listed in a top-n. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kestrel {

struct TokenLogprob {
  int32_t id;
  float logprob;
};

// log(sum_i exp(logits[i])) in f64 (max-shifted). -inf when every logit is -inf.
double log_sum_exp(std::span<const float> logits);

// logits[i] - log_sum_exp(logits), f64 [n_vocab].
std::vector<double> log_softmax(std::span<const float> logits);

// The n tokens with the highest logprob (n <= logits.size(); masked tokens excluded, so fewer when fewer are
// finite), sorted by logprob descending, equal logprobs by lower id. `lse` is log_sum_exp(logits). Replaces *out;
// one pass over the vocabulary with an n-entry insertion list, no sort of the vocabulary.
void top_logprobs(std::span<const float> logits, double lse, int32_t n, std::vector<TokenLogprob>* out);

}  // namespace kestrel
