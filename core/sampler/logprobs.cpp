// log_sum_exp, log_softmax and top_logprobs over a full vocabulary of f32 logits, accumulated in f64.
#include "core/sampler/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/sampler/candidates.h"
#include "core/sampler/logit_scan.h"

namespace kestrel {

double log_sum_exp(std::span<const float> logits) {
  const float max_logit = max_logit_of(logits);
  if (!(max_logit > -std::numeric_limits<float>::infinity())) return -std::numeric_limits<double>::infinity();
  const double m = max_logit;
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - m);
  return m + std::log(sum);
}

std::vector<double> log_softmax(std::span<const float> logits) {
  const double lse = log_sum_exp(logits);
  std::vector<double> out(logits.size());  // f64 [n_vocab]
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

void top_logprobs(std::span<const float> logits, double lse, int32_t n, std::vector<TokenLogprob>* out) {
  out->clear();
  if (n <= 0) return;
  // Best-first insertion list of at most n candidates. Logits arrive in id order, so once the list is full a token
  // enters only with a logit strictly above the last entry's, and a 16-entry block whose maximum is not is skipped.
  std::vector<Candidate> best;  // [<= n], best-first
  best.reserve(static_cast<size_t>(n) + 1);
  auto offer = [&](size_t i) {
    const Candidate c(logits[i], static_cast<int32_t>(i));
    if (!(c.logit > -std::numeric_limits<float>::infinity())) return;
    if (best.size() == static_cast<size_t>(n) && !(c.logit > best.back().logit)) return;
    best.insert(std::upper_bound(best.begin(), best.end(), c, candidate_before), c);
    if (best.size() > static_cast<size_t>(n)) best.pop_back();
  };
  constexpr size_t kBlock = 16;
  size_t i = 0;
  for (; i < logits.size() && best.size() < static_cast<size_t>(n); ++i) offer(i);
  for (; i + kBlock <= logits.size(); i += kBlock) {
    if (!(max_logit_of(logits.subspan(i, kBlock)) > best.back().logit)) continue;
    for (size_t j = 0; j < kBlock; ++j) offer(i + j);
  }
  for (; i < logits.size(); ++i) offer(i);
  for (const Candidate& c : best) {
    out->push_back(TokenLogprob{c.id, static_cast<float>(static_cast<double>(c.logit) - lse)});
  }
  // Rounding to f32 can make two different logits report the same logprob: order those by lower id as promised.
  std::stable_sort(out->begin(), out->end(), [](const TokenLogprob& a, const TokenLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
  });
}

}  // namespace kestrel
