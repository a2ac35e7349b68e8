// The reference Engine: logits equal ref::forward's, prefill cut into chunks gives bit-identical logits, per-item
// errors leave the other items and the failing slot alone, clone forks exactly, placement adds up.
#include <gtest/gtest.h>

#include "core/engine/reference_engine.h"
#include "tests/core/engine/engine_test_util.h"

namespace kestrel {
namespace {

using test::iota_tokens;
using test::open_fixture;

std::vector<float> ref_logits(const Model& m, const std::vector<int32_t>& tokens, int n_ctx) {
  return test::RefSession(m, n_ctx).feed(tokens).logits;
}

class ReferenceEngineTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ReferenceEngineTest, MatchesForwardAndIsChunkingIndependent) {
  auto model = open_fixture(GetParam());
  ASSERT_TRUE(model);
  auto engine = make_reference_engine(*model, 4);
  ASSERT_TRUE(engine.has_value());
  Engine& e = **engine;
  const std::vector<int32_t> prompt = iota_tokens(21);
  const std::vector<float> expect = ref_logits(*model, prompt, 64);

  auto a = e.slot_alloc(64);
  auto b = e.slot_alloc(64);
  ASSERT_TRUE(a && b);
  // Slot a: whole prompt. Slot b: chunks of 5, 9, 7 sharing ticks with slot a's work.
  test::TickResult out =
      test::run_tick(e, {{*a, std::span<const int32_t>(prompt)}, {*b, std::span<const int32_t>(prompt).first(5)}});
  ASSERT_TRUE(out.status[0] && out.status[1]);
  EXPECT_EQ(out.logits[0], expect);
  test::run_one(e, *b, std::span<const int32_t>(prompt).subspan(5, 9));
  EXPECT_EQ(test::run_one(e, *b, std::span<const int32_t>(prompt).subspan(14)), expect)
      << "chunked prefill must be bit-identical to one prefill";
  EXPECT_EQ(e.slot_n_past(*b), 21);
}

TEST_P(ReferenceEngineTest, PerItemErrorsAndClone) {
  auto model = open_fixture(GetParam());
  ASSERT_TRUE(model);
  auto engine = make_reference_engine(*model, 3);
  ASSERT_TRUE(engine.has_value());
  Engine& e = **engine;
  auto a = e.slot_alloc(8);
  auto b = e.slot_alloc(8);
  ASSERT_TRUE(a && b);
  const std::vector<int32_t> good = {1, 2, 3};
  const std::vector<int32_t> bad = {1, static_cast<int32_t>(model->hparams().n_vocab)};
  test::TickResult out = test::run_tick(e, {{*a, good}, {*b, bad}});
  EXPECT_TRUE(out.status[0]);
  ASSERT_FALSE(out.status[1]);
  EXPECT_EQ(out.status[1].error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(e.slot_n_past(*b), 0) << "a failed item leaves its slot unchanged";
  const std::vector<int32_t> too_long = iota_tokens(6);
  EngineStepItem over[1] = {{*a, too_long}};
  EXPECT_EQ(e.check(over[0]).error().code, ErrorCode::kOutOfRange);

  // Clone into a larger slot, then both continue identically.
  auto c = e.slot_alloc(16);
  ASSERT_TRUE(c);
  ASSERT_TRUE(e.slot_clone(*a, *c));
  EXPECT_EQ(e.slot_n_past(*c), 3);
  const std::vector<int32_t> next = {9};
  out = test::run_tick(e, {{*a, next}, {*c, next}});
  ASSERT_TRUE(out.status[0] && out.status[1]);
  EXPECT_EQ(out.logits[0], out.logits[1]);

  // Snapshot, run on, restore: the continuation repeats bit for bit.
  auto snap = e.slot_snapshot(*a);
  ASSERT_TRUE(snap.has_value());
  const std::vector<float> after = test::run_one(e, *a, next);
  ASSERT_TRUE(e.slot_restore(*a, *snap));
  EXPECT_EQ(e.slot_n_past(*a), 4);
  EXPECT_EQ(test::run_one(e, *a, next), after);
  std::vector<uint8_t> broken = *snap;
  broken.resize(broken.size() / 2);
  EXPECT_FALSE(e.slot_restore(*a, broken));
  EXPECT_EQ(e.slot_n_past(*a), 5) << "a refused restore leaves the slot as it was";
  EXPECT_EQ(e.slot_alloc(8).error().code, ErrorCode::kResourceExhausted);
  e.slot_free(*b);
  EXPECT_TRUE(e.slot_alloc(8).has_value());
  EXPECT_EQ(e.slot_alloc(static_cast<int32_t>(model->hparams().n_ctx_train) + 1).error().code, ErrorCode::kOutOfRange);
}

TEST_P(ReferenceEngineTest, PlacementAddsUpToCatalog) {
  auto model = open_fixture(GetParam());
  ASSERT_TRUE(model);
  auto engine = make_reference_engine(*model, 1);
  ASSERT_TRUE(engine.has_value());
  const auto placement = (*engine)->placement().entries;
  EXPECT_EQ((*engine)->placement().device, "cpu");
  ASSERT_EQ(placement.size(), 6u);
  uint64_t sum = 0;
  for (const auto& p : placement) {
    EXPECT_EQ(p.device, "cpu");
    sum += p.bytes;
  }
  EXPECT_EQ(sum, model->catalog().total_bytes());
  EXPECT_GT(placement[0].bytes, 0u);  // embeddings
  EXPECT_GT(placement[1].bytes, 0u);  // gdn layers
  EXPECT_GT(placement[2].bytes, 0u);  // attention layers
  EXPECT_EQ(placement[3].bytes, model->catalog().bytes_in(PlacementClass::kRoutedExperts));
  EXPECT_EQ(make_reference_engine(*model, 0).error().code, ErrorCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceEngineTest,
                         ::testing::Values("golden-qwen35moe", "golden-qwen35", "golden-qwen3next"));

}  // namespace
}  // namespace kestrel
