// Truncation stages and the draw over a CandidateSet; see candidates.h for the orders, the arithmetic and the costs.
#include "core/sampler/candidates.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "core/sampler/logit_scan.h"
#include "core/sampler/portable_exp.h"

namespace kestrel {
namespace {

using sampler_detail::exp_portable_inline;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr size_t kSumBlock = 256;

// Top-p histogram: bucket b holds the tokens with (max_logit - logit) * 128 in [b, b + 1); the last bucket holds
// everything further down (weights below e^-32 ≈ 1e-14 of the best).
constexpr int kBucketsPerNat = 128;
constexpr int kTopPBuckets = 32 * kBucketsPerNat + 1;

int top_p_bucket(float max_logit, float logit) {
  const float gap = (max_logit - logit) * static_cast<float>(kBucketsPerNat);  // >= 0
  return gap < static_cast<float>(kTopPBuckets - 1) ? static_cast<int>(gap) : kTopPBuckets - 1;
}

// w[i] = exp_portable((items[i].logit - max_logit) * scale), f32; a loop the compiler vectorizes.
void compute_weights(std::span<const Candidate> items, float max_logit, float scale, std::vector<float>* w) {
  w->resize(items.size());
  float* out = w->data();
  for (size_t i = 0; i < items.size(); ++i) out[i] = exp_portable_inline((items[i].logit - max_logit) * scale);
}

// The fixed-order f64 sum of w (see candidates.h): fills one sum per 256-entry block and returns their total.
double sum_by_blocks(std::span<const float> w, std::vector<double>* block_sums) {
  block_sums->resize((w.size() + kSumBlock - 1) / kSumBlock);
  double total = 0.0;
  for (size_t b = 0; b < block_sums->size(); ++b) {
    const size_t begin = b * kSumBlock;
    const size_t end = std::min(w.size(), begin + kSumBlock);
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = begin;
    for (; i + 4 <= end; i += 4) {
      s0 += static_cast<double>(w[i]);
      s1 += static_cast<double>(w[i + 1]);
      s2 += static_cast<double>(w[i + 2]);
      s3 += static_cast<double>(w[i + 3]);
    }
    for (; i < end; ++i) s0 += static_cast<double>(w[i]);
    (*block_sums)[b] = (s0 + s1) + (s2 + s3);
    total += (*block_sums)[b];
  }
  return total;
}

void fill_all(std::span<const float> logits, CandidateSet* set) {
  auto& items = set->items;
  items.resize(logits.size());
  size_t kept = 0;
  for (size_t i = 0; i < logits.size(); ++i) {  // branch-free compaction
    const float l = logits[i];
    items[kept] = Candidate(l, static_cast<int32_t>(i));
    kept += l > kNegInf ? 1 : 0;  // drops -inf (masked) and NaN
  }
  items.resize(kept);
}

// The k best by a heap whose front is the worst kept. Logits arrive in id order, so a later token enters only with
// a strictly larger logit than that worst one, and a 16-entry block whose maximum is not larger is skipped whole.
void fill_top_k_heap(std::span<const float> logits, size_t k, CandidateSet* set) {
  auto& heap = set->items;
  auto offer = [&](size_t i) {
    const Candidate c(logits[i], static_cast<int32_t>(i));
    if (!(c.logit > kNegInf)) return;
    if (heap.size() < k) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), candidate_before);
    } else if (c.logit > heap.front().logit) {
      std::pop_heap(heap.begin(), heap.end(), candidate_before);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), candidate_before);
    }
  };
  constexpr size_t kBlock = 16;
  size_t i = 0;
  for (; i < logits.size() && heap.size() < k; ++i) offer(i);
  for (; i + kBlock <= logits.size(); i += kBlock) {
    float block_max = kNegInf;
    for (size_t j = 0; j < kBlock; ++j) block_max = logits[i + j] > block_max ? logits[i + j] : block_max;
    if (!(block_max > heap.front().logit)) continue;
    for (size_t j = 0; j < kBlock; ++j) offer(i + j);
  }
  for (; i < logits.size(); ++i) offer(i);
}

}  // namespace

void candidates_fill(std::span<const float> logits, int32_t top_k, CandidateSet* set) {
  auto& items = set->items;
  items.clear();
  set->sorted = false;
  const size_t k = top_k > 0 ? static_cast<size_t>(top_k) : 0;
  if (k > 0 && k < logits.size() / 16) {
    fill_top_k_heap(logits, k, set);  // with fewer than k finite logits: all of them, best-first all the same
    std::sort(items.begin(), items.end(), candidate_before);
    set->sorted = true;
    set->max_logit = items.empty() ? kNegInf : items.front().logit;
  } else {
    fill_all(logits, set);
    set->max_logit = max_logit_of(logits);  // the kept set's maximum too: top-k below keeps the best
    if (k > 0 && k < items.size()) {
      const auto kth = items.begin() + static_cast<std::ptrdiff_t>(k);
      std::nth_element(items.begin(), kth, items.end(), candidate_before);
      items.erase(kth, items.end());
      std::sort(items.begin(), items.end(), candidate_before);
      set->sorted = true;
    }
  }
}

void candidates_top_p(CandidateSet* set, float p) {
  auto& items = set->items;
  if (p >= 1.0f || items.size() <= 1) return;
  auto& w = set->weights;
  compute_weights(items, set->max_logit, 1.0f, &w);
  const double target = static_cast<double>(p) * sum_by_blocks(w, &set->block_sums);

  if (set->sorted) {  // best-first already: walk the prefix
    double mass = 0.0;
    for (size_t i = 0; i < items.size(); ++i) {
      mass += static_cast<double>(w[i]);
      if (mass >= target) {
        items.resize(i + 1);
        return;
      }
    }
    return;  // rounding left the whole set just short of p·total: keep it all
  }

  // Id order: histogram the mass by distance from the max, find the bucket where the running mass reaches the
  // target, sort only that bucket to find the last kept token, then filter in place (id order kept). Buckets are
  // monotone in the logit, so "best-first up to the last kept token" is exactly the kept set.
  auto& mass_of = set->bucket_mass;
  mass_of.assign(kTopPBuckets, 0.0);
  for (size_t i = 0; i < items.size(); ++i) {
    mass_of[static_cast<size_t>(top_p_bucket(set->max_logit, items[i].logit))] += static_cast<double>(w[i]);
  }
  double before = 0.0;  // mass of the buckets above the crossing one
  int cut_bucket = -1;
  for (int b = 0; b < kTopPBuckets; ++b) {
    if (before + mass_of[static_cast<size_t>(b)] >= target) {
      cut_bucket = b;
      break;
    }
    before += mass_of[static_cast<size_t>(b)];
  }
  if (cut_bucket < 0) return;  // rounding left the whole set just short of p·total: keep it all
  auto& boundary = set->boundary;
  boundary.clear();
  for (const Candidate& c : items) {
    if (top_p_bucket(set->max_logit, c.logit) == cut_bucket) boundary.push_back(c);
  }
  assert(!boundary.empty());  // a bucket only reaches the target by adding mass
  std::sort(boundary.begin(), boundary.end(), candidate_before);
  Candidate last = boundary.back();  // when rounding never reaches the target, the whole bucket is kept
  double mass = before;
  for (const Candidate& c : boundary) {
    mass += static_cast<double>(exp_portable_inline(c.logit - set->max_logit));
    if (mass >= target) {
      last = c;
      break;
    }
  }
  items.erase(std::remove_if(items.begin(), items.end(), [&](const Candidate& c) { return candidate_before(last, c); }),
              items.end());
}

void candidates_min_p(CandidateSet* set, float min_p) {
  if (min_p <= 0.0f) return;
  const float max_logit = set->max_logit;
  // The rule is exp_portable(logit - max) >= min_p. std::log (not bit-portable) only brackets it: outside
  // ±1e-5 of log(min_p) the answer is certain whatever the libm (exp_portable is within 1.2e-7 relative), inside
  // it exp_portable decides.
  const double log_min_p = std::log(static_cast<double>(min_p));
  auto keep = [&](const Candidate& c) {
    const float d = c.logit - max_logit;
    if (static_cast<double>(d) > log_min_p + 1e-5) return true;
    if (static_cast<double>(d) < log_min_p - 1e-5) return false;
    return exp_portable_inline(d) >= min_p;
  };
  auto& items = set->items;
  if (set->sorted) {
    items.erase(std::find_if_not(items.begin(), items.end(), keep), items.end());  // kept tokens are a prefix
  } else {
    items.erase(std::remove_if(items.begin(), items.end(), [&](const Candidate& c) { return !keep(c); }), items.end());
  }
  assert(!items.empty());  // the max has weight 1 >= min_p
}

int32_t candidates_draw(CandidateSet* set, float temperature, double u) {
  const auto& items = set->items;
  assert(!items.empty() && temperature > 0.0f);
  auto& w = set->weights;
  compute_weights(items, set->max_logit, 1.0f / temperature, &w);
  const auto& block_sums = set->block_sums;
  const double target = u * sum_by_blocks(w, &set->block_sums);
  // Whole blocks first, then the block where the running sum passes the target.
  double before = 0.0;
  for (size_t b = 0; b < block_sums.size(); ++b) {
    if (before + block_sums[b] > target) {
      double running = before;
      const size_t end = std::min(items.size(), (b + 1) * kSumBlock);
      for (size_t i = b * kSumBlock; i < end; ++i) {
        running += static_cast<double>(w[i]);
        if (w[i] > 0.0f && target < running) return items[i].id;
      }
    }
    before += block_sums[b];
  }
  // u * total rounded up to the total: the last token with any weight (the max has weight 1, so one exists).
  for (size_t i = items.size(); i-- > 0;) {
    if (w[i] > 0.0f) return items[i].id;
  }
  return items.front().id;
}

}  // namespace kestrel
