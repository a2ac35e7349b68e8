// Truncation stages: hand-made examples with known answers, and randomized comparisons with a brute-force
// reference (full sort, cumulative sums) that exercise the partial-sort paths on larger vocabularies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "core/sampler/candidates.h"

namespace kestrel {
namespace {

std::set<int32_t> ids(const CandidateSet& set) {
  std::set<int32_t> out;
  for (const Candidate& c : set.items) out.insert(c.id);
  return out;
}

// logits = log(probabilities), placed at the given ids of a vocabulary (other ids masked with -inf).
std::vector<float> from_probs(const std::vector<double>& probs, const std::vector<int32_t>& at, size_t n_vocab) {
  std::vector<float> logits(n_vocab, -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < probs.size(); ++i) logits[static_cast<size_t>(at[i])] = static_cast<float>(std::log(probs[i]));
  return logits;
}

std::vector<float> random_logits(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);  // test data only; the sampler's own stream is Rng
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float& v : out) v = dist(gen);
  for (size_t i = 0; i + 7 < n; i += 7) out[i + 3] = out[i];  // some exact ties
  return out;
}

// Reference ordering: full sort, higher logit first, then lower id.
std::vector<Candidate> sorted_reference(const std::vector<float>& logits) {
  std::vector<Candidate> all;
  for (size_t i = 0; i < logits.size(); ++i) all.push_back({logits[i], static_cast<int32_t>(i)});
  std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  });
  return all;
}

TEST(Candidates, FillSkipsMaskedAndKeepsIdOrder) {
  CandidateSet set;
  const std::vector<float> logits = {1.0f, -std::numeric_limits<float>::infinity(), 3.0f,
                                     std::numeric_limits<float>::quiet_NaN(), -2.0f};
  candidates_fill(logits, 0, &set);
  ASSERT_EQ(set.items.size(), 3u);
  EXPECT_EQ(set.items[0].id, 0);
  EXPECT_EQ(set.items[1].id, 2);
  EXPECT_EQ(set.items[2].id, 4);
  EXPECT_EQ(set.max_logit, 3.0f);
  EXPECT_FALSE(set.sorted);
}

TEST(Candidates, TopKKeepsExactlyKBestWithTiesByLowerId) {
  CandidateSet set;
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, 2.0f, -1.0f, 1.0f, 3.0f};
  candidates_fill(logits, 3, &set);
  ASSERT_EQ(set.items.size(), 3u);
  EXPECT_TRUE(set.sorted);
  EXPECT_EQ(set.items[0].id, 6);
  EXPECT_EQ(set.items[1].id, 1);  // 2.0 at ids 1 and 3: lower id first
  EXPECT_EQ(set.items[2].id, 3);
  EXPECT_EQ(set.max_logit, 3.0f);
  candidates_fill(logits, 0, &set);  // off
  EXPECT_EQ(set.items.size(), 7u);
  EXPECT_FALSE(set.sorted);
  candidates_fill(logits, 10, &set);  // more than there are: off
  EXPECT_EQ(set.items.size(), 7u);
}

TEST(Candidates, TopKMatchesFullSortOnLargeVocab) {
  const auto logits = random_logits(50000, 1, 3.0f);
  const auto ref = sorted_reference(logits);
  // Small k takes the heap path, large k the nth_element path.
  for (int32_t k : {1, 2, 40, 1000, 3124, 3125, 20000, 49999}) {
    CandidateSet set;
    candidates_fill(logits, k, &set);
    ASSERT_TRUE(set.sorted);
    ASSERT_EQ(set.items.size(), static_cast<size_t>(k));
    for (int32_t i = 0; i < k; ++i) ASSERT_EQ(set.items[i].id, ref[i].id) << "k=" << k << " i=" << i;
  }
}

TEST(Candidates, TopPKeepsSmallestPrefixReachingP) {
  // Probabilities 0.1, 0.4, 0.05, 0.3, 0.15 at ids 0..4: best-first 1 (0.4), 3 (0.3), 4 (0.15), 0 (0.1), 2 (0.05).
  const std::vector<double> probs = {0.1, 0.4, 0.05, 0.3, 0.15};
  const auto logits = from_probs(probs, {0, 1, 2, 3, 4}, 5);
  auto run = [&](float p) {
    CandidateSet set;
    candidates_fill(logits, 0, &set);
    candidates_top_p(&set, p);
    return ids(set);
  };
  EXPECT_EQ(run(0.3f), (std::set<int32_t>{1}));           // 0.4 >= 0.3
  EXPECT_EQ(run(0.5f), (std::set<int32_t>{1, 3}));        // 0.7 >= 0.5 > 0.4
  EXPECT_EQ(run(0.8f), (std::set<int32_t>{1, 3, 4}));     // 0.85 >= 0.8 > 0.7
  EXPECT_EQ(run(0.9f), (std::set<int32_t>{1, 3, 4, 0}));  // 0.95 >= 0.9 > 0.85
  EXPECT_EQ(run(0.99f), (std::set<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(run(1.0f), (std::set<int32_t>{0, 1, 2, 3, 4}));  // off
  EXPECT_EQ(run(0.01f), (std::set<int32_t>{1}));             // always at least one
}

TEST(Candidates, TopPAfterTopKRenormalizesOverTheKept) {
  // After top-k = 2 the kept mass is 0.4 + 0.3; renormalized: 0.571, 0.429. p = 0.6 needs both.
  const auto logits = from_probs({0.1, 0.4, 0.05, 0.3, 0.15}, {0, 1, 2, 3, 4}, 5);
  CandidateSet set;
  candidates_fill(logits, 2, &set);
  candidates_top_p(&set, 0.6f);
  EXPECT_EQ(ids(set), (std::set<int32_t>{1, 3}));
  CandidateSet set2;
  candidates_fill(logits, 2, &set2);
  candidates_top_p(&set2, 0.55f);
  EXPECT_EQ(ids(set2), (std::set<int32_t>{1}));
}

TEST(Candidates, TopPMatchesBruteForceOnLargeVocab) {
  // Flat-ish logits put the cut far past the first 64 sorted entries, so the growing prefix is exercised.
  for (float scale : {0.5f, 2.0f, 6.0f}) {
    const auto logits = random_logits(20000, 7, scale);
    const auto ref = sorted_reference(logits);
    const double max_logit = ref.front().logit;
    double total = 0.0;
    for (const Candidate& c : ref) total += std::exp(static_cast<double>(c.logit) - max_logit);
    for (float p : {0.05f, 0.5f, 0.9f, 0.95f, 0.999f}) {
      size_t want = 0;
      double mass = 0.0;
      while (want < ref.size()) {
        mass += std::exp(static_cast<double>(ref[want].logit) - max_logit);
        ++want;
        if (mass >= p * total) break;
      }
      // The reference sums in another order with std::exp: the cut may differ by one token when the boundary
      // mass is within rounding. Both the histogram path (id order) and the prefix path (after top-k) are checked.
      for (bool via_top_k : {false, true}) {
        CandidateSet set;
        candidates_fill(logits, via_top_k ? static_cast<int32_t>(logits.size() - 1) : 0, &set);
        candidates_top_p(&set, p);
        ASSERT_EQ(set.sorted, via_top_k);
        ASSERT_NEAR(static_cast<double>(set.items.size()), static_cast<double>(want), 1.0) << scale << " " << p;
        std::vector<Candidate> kept = set.items;
        std::sort(kept.begin(), kept.end(), candidate_before);
        for (size_t i = 0; i < kept.size(); ++i) ASSERT_EQ(kept[i].id, ref[i].id) << scale << " " << p;
        for (size_t i = 1; i < kept.size() && !via_top_k; ++i) ASSERT_LT(set.items[i - 1].id, set.items[i].id);
      }
    }
  }
}

TEST(Candidates, MinPKeepsTokensAboveFractionOfMax) {
  // p = 0.5, 0.3, 0.1, 0.06, 0.04 at ids 4, 0, 3, 1, 2. min_p = 0.15 → threshold 0.075: keeps 0.5, 0.3, 0.1.
  const auto logits = from_probs({0.5, 0.3, 0.1, 0.06, 0.04}, {4, 0, 3, 1, 2}, 5);
  CandidateSet set;
  candidates_fill(logits, 0, &set);
  candidates_min_p(&set, 0.15f);
  EXPECT_EQ(ids(set), (std::set<int32_t>{4, 0, 3}));
  EXPECT_FALSE(set.sorted);
  EXPECT_EQ(set.items[0].id, 0);  // id order preserved
  // Same answer on a best-first set (the prefix path).
  CandidateSet sorted;
  candidates_fill(logits, 4, &sorted);
  ASSERT_TRUE(sorted.sorted);
  candidates_min_p(&sorted, 0.15f);
  EXPECT_EQ(ids(sorted), (std::set<int32_t>{4, 0, 3}));
  // min_p = 1 keeps only the maximum, min_p = 0 is off.
  CandidateSet one;
  candidates_fill(logits, 0, &one);
  candidates_min_p(&one, 1.0f);
  EXPECT_EQ(ids(one), (std::set<int32_t>{4}));
  CandidateSet off;
  candidates_fill(logits, 0, &off);
  candidates_min_p(&off, 0.0f);
  EXPECT_EQ(off.items.size(), 5u);
}

TEST(Candidates, DrawWalksCumulativeWeights) {
  // Weights at T = 1: 1, 1, 2 (logits log 1, log 1, log 2) → boundaries at 0.25, 0.5.
  const std::vector<float> logits = {0.0f, 0.0f, static_cast<float>(std::log(2.0))};
  CandidateSet set;
  candidates_fill(logits, 0, &set);
  EXPECT_EQ(candidates_draw(&set, 1.0, 0.0), 0);
  EXPECT_EQ(candidates_draw(&set, 1.0, 0.2499), 0);
  EXPECT_EQ(candidates_draw(&set, 1.0, 0.2501), 1);
  EXPECT_EQ(candidates_draw(&set, 1.0, 0.4999), 1);
  EXPECT_EQ(candidates_draw(&set, 1.0, 0.5001), 2);
  EXPECT_EQ(candidates_draw(&set, 1.0, std::nextafter(1.0, 0.0)), 2);
  // Temperature 0.5 squares the weights: 1, 1, 4 → boundaries at 1/6, 2/6.
  EXPECT_EQ(candidates_draw(&set, 0.5, 0.16), 0);
  EXPECT_EQ(candidates_draw(&set, 0.5, 0.17), 1);
  EXPECT_EQ(candidates_draw(&set, 0.5, 0.34), 2);
}

}  // namespace
}  // namespace kestrel
