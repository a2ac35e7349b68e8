// CandidateSet and the truncation stages (top-k, top-p, min-p) and the draw (docs/sampling.md §3–4).
//
// A CandidateSet holds the (logit, id) pairs still in play: every token whose logit is > -inf, or with top-k only
// the k best of them. Each later stage removes tokens. Two orders are used and both are fully specified, so the
// kept set and the order the draw walks are the same on every platform:
//   - id order (candidates_fill without top-k; preserved by top-p's and min-p's stable filters), or
//   - "best first": higher logit first, equal logits by lower id (candidate_before; a strict total order, so no
//     std::sort / std::nth_element / heap implementation detail can leak into the result).
// Arithmetic is fixed too: weights w = exp_portable((logit - max_logit) * scale) in f32 (scale = 1 for top-p and
// min-p, 1/temperature in f32 for the draw), sums in f64 in a fixed order (blocks of 256 weights, each summed as
// four interleaved partial sums, block sums added in order), so the loops vectorize and still give the same bits
// everywhere. Probabilities inside the stages are softmax at temperature 1 over the current set, as in llama.cpp.
// Cost for n vocabulary entries: top-k is one pass against a k-entry heap that skips 16-entry blocks below the
// current k-th best (nth_element when k is a large share of n), plus a sort of the k kept; top-p is one exp pass
// with a 4097-bucket histogram of the mass and a sort of only the bucket where the cut falls; min-p is one compare
// pass (exp only within 1e-5 of the cut); the draw is one exp pass plus a walk by blocks. No stage sorts the
// vocabulary. Functions mutate the set they are given; a set is used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kestrel {

struct Candidate {
  // Left uninitialized on purpose: resizing a vocabulary-sized scratch vector must not zero 2 MB first.
  Candidate() noexcept {}  // not `= default`, which would zero-initialize in resize()
  Candidate(float l, int32_t i) noexcept : logit(l), id(i) {}
  float logit;
  int32_t id;
};

// Best-first order: higher logit, then lower id.
inline bool candidate_before(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

struct CandidateSet {
  std::vector<Candidate> items;  // [n_kept]
  bool sorted = false;           // items are in best-first order (otherwise in id order)
  float max_logit = 0.0f;        // the largest logit in items (the best token is never removed)
  // Scratch reused across calls; contents meaningless between calls.
  std::vector<float> weights;       // f32 [n_kept]
  std::vector<double> block_sums;   // f64 [ceil(n_kept / 256)]
  std::vector<double> bucket_mass;  // f64 [4097], top-p histogram
  std::vector<Candidate> boundary;  // the top-p bucket being sorted
};

// Every token with logit > -inf (NaN is skipped too) in id order; with 0 < top_k < that count, only the top_k best,
// best-first. `set` keeps its capacity between calls.
void candidates_fill(std::span<const float> logits, int32_t top_k, CandidateSet* set);
// Keeps the smallest best-first prefix whose probability mass is >= p (at least one token); keeps the set's order.
// p >= 1: no change.
void candidates_top_p(CandidateSet* set, float p);
// Keeps tokens with p_i >= min_p * p_max, i.e. exp_portable(logit - max_logit) >= min_p; keeps the set's order.
// min_p <= 0: no change.
void candidates_min_p(CandidateSet* set, float min_p);
// The token drawn from softmax(logit / temperature) over the set, given u uniform in [0, 1): walks the set in its
// current order and returns the first token whose running sum of weights exceeds u * total. temperature > 0; set
// non-empty.
int32_t candidates_draw(CandidateSet* set, float temperature, double u);

}  // namespace kestrel
