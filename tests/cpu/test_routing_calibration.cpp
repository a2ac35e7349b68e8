// Routing counts (core/engine/routing_counts.h) and the calibration prompt that produces them
// (cpu/routing_calibration.h), on tiny MoE presets of both MoE architectures:
//   - the CPU engine's counts: every MoE layer's row sums to tokens × n_expert_used, and the counts are the same
//     whether the prompt comes in one item or in items cut at 64 positions, on one thread or all (those cuts keep
//     every row's bits, so the same experts are chosen);
//   - calibrate_routing returns those counts for the same tokens; a dense model is refused;
//   - calibration_tokens repeats the text to the asked length and refuses a length below one;
//   - the counts file round-trips, and a file of other routers, another geometry, a truncated or foreign file is
//     refused with a message, a missing one with kNotFound.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/routing_counts.h"
#include "core/model/model.h"
#include "cpu/cpu_engine.h"
#include "cpu/routing_calibration.h"
#include "tests/core/engine/tiny_models.h"

namespace kestrel::cpu {
namespace {

std::unique_ptr<Model> open_model(const std::string& name) {
  const std::string path = test::model_path(name);
  EXPECT_FALSE(path.empty());
  auto m = Model::open(path);
  EXPECT_TRUE(m.has_value()) << (m ? "" : m.error().to_string());
  return m ? std::move(*m) : nullptr;
}

// The counts of a CPU engine of `threads` threads fed `tokens` in items of `cut` tokens.
std::vector<uint64_t> engine_counts(const Model& m, const std::vector<int32_t>& tokens, int threads, size_t cut) {
  CpuEngineOptions o;
  o.max_slots = 1;
  o.threads = threads;
  o.max_ctx = static_cast<int32_t>(tokens.size());
  o.count_routing = true;
  auto e = make_cpu_engine(m, o);
  EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().to_string());
  if (!e) return {};
  auto slot = (*e)->slot_alloc(static_cast<int32_t>(tokens.size()));
  EXPECT_TRUE(slot.has_value());
  for (size_t at = 0; at < tokens.size(); at += cut) {
    EngineStepItem item;
    item.slot = *slot;
    item.tokens = std::span<const int32_t>(tokens).subspan(at, std::min(cut, tokens.size() - at));
    item.argmax_only = true;
    EngineStepOutput out;
    (*e)->step(std::span<const EngineStepItem>(&item, 1), std::span<EngineStepOutput>(&out, 1));
    EXPECT_TRUE(out.status) << out.status.error().to_string();
  }
  return (*e)->routing_counts();
}

class RoutingCalibrationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RoutingCalibrationTest, CountsAreEveryChoiceWhateverTheCutAndThreads) {
  std::unique_ptr<Model> m = open_model(GetParam());
  ASSERT_TRUE(m);
  const ModelHparams& hp = m->hparams();
  auto tokens = calibration_tokens(*m, 100);
  ASSERT_TRUE(tokens.has_value()) << tokens.error().to_string();
  const std::vector<uint64_t> whole = engine_counts(*m, *tokens, 0, tokens->size());
  ASSERT_EQ(whole.size(), static_cast<size_t>(hp.n_layer) * hp.n_expert);
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    const auto row = whole.begin() + static_cast<std::ptrdiff_t>(l) * hp.n_expert;
    const uint64_t sum = std::accumulate(row, row + hp.n_expert, uint64_t{0});
    const bool moe = m->catalog().layer(l).ffn.is_moe();
    EXPECT_EQ(sum, moe ? tokens->size() * hp.n_expert_used : 0) << "layer " << l;
  }
  // Cuts at multiples of 64 positions keep every row's bits (test_cpu_engine), so the same experts are chosen.
  EXPECT_EQ(engine_counts(*m, *tokens, 1, 64), whole) << "items of 64 tokens, one thread";
  EXPECT_EQ(engine_counts(*m, *tokens, 2, 64), whole) << "items of 64 tokens, two threads";

  auto c = calibrate_routing(*m, *tokens, 0);
  ASSERT_TRUE(c.has_value()) << c.error().to_string();
  EXPECT_EQ(c->counts, whole);
  EXPECT_EQ(c->tokens, 100);
}

INSTANTIATE_TEST_SUITE_P(Models, RoutingCalibrationTest, ::testing::Values("tiny", "tiny-qwen3next", "tiny-q4_0"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n) ch = (ch == '-') ? '_' : ch;
                           return n;
                         });

TEST(RoutingCalibration, RefusesADenseModelAndAnEmptyPrompt) {
  std::unique_ptr<Model> m = open_model("tiny-qwen35");
  ASSERT_TRUE(m);
  auto tokens = calibration_tokens(*m, 8);
  ASSERT_TRUE(tokens.has_value());
  auto c = calibrate_routing(*m, *tokens, 1);
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_FALSE(calibration_tokens(*m, 0).has_value());
}

TEST(RoutingCalibration, TokensRepeatTheTextToTheAskedLength) {
  std::unique_ptr<Model> m = open_model("tiny");
  ASSERT_TRUE(m);
  const std::vector<int32_t> once = m->tokenizer().encode(calibration_text(), false);
  ASSERT_GT(once.size(), 100u);
  auto one = calibration_tokens(*m, 1);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(*one, std::vector<int32_t>{once[0]});
  const int32_t n = static_cast<int32_t>(2 * once.size() + 5);
  auto many = calibration_tokens(*m, n);
  ASSERT_TRUE(many.has_value());
  ASSERT_EQ(many->size(), static_cast<size_t>(n));
  for (size_t i = 0; i < many->size(); ++i) ASSERT_EQ((*many)[i], once[i % once.size()]) << i;
}

class RoutingCountsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kestrel-routing-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "made" / "counts.txt").string();  // save makes the missing directory
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(path_, std::ios::binary) << text; }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(RoutingCountsFileTest, RoundTripsAndRefusesWhatIsNotItsOwn) {
  RoutingCounts c;
  c.tokens = 256;
  for (uint64_t i = 0; i < 3 * 4; ++i) c.counts.push_back(i * i * 1000003ull);
  ASSERT_TRUE(save_routing_counts(path_, 0xABCDEF0123456789ull, 3, 4, c));
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
  auto back = load_routing_counts(path_, 0xABCDEF0123456789ull, 3, 4);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(back->counts, c.counts);
  EXPECT_EQ(back->tokens, 256);

  auto other_key = load_routing_counts(path_, 0xABCDEF0123456788ull, 3, 4);
  ASSERT_FALSE(other_key.has_value());
  EXPECT_EQ(other_key.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(other_key.error().message.find("other router weights"), std::string::npos) << other_key.error().message;
  auto other_shape = load_routing_counts(path_, 0xABCDEF0123456789ull, 4, 3);
  ASSERT_FALSE(other_shape.has_value());
  EXPECT_EQ(other_shape.error().code, ErrorCode::kInvalidArgument);

  EXPECT_FALSE(save_routing_counts(path_, 1, 3, 5, c).has_value()) << "12 counts are not 3 layers of 5";

  std::ifstream in(path_);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto code = [&] {
    auto r = load_routing_counts(path_, 0xABCDEF0123456789ull, 3, 4);
    return r ? std::optional<ErrorCode>() : std::optional<ErrorCode>(r.error().code);
  };
  write(text.substr(0, text.rfind('\n', text.size() - 2) + 1));  // the last layer's line gone
  EXPECT_EQ(code(), ErrorCode::kInvalidArgument);
  write(text + "7\n");
  EXPECT_EQ(code(), ErrorCode::kInvalidArgument);
  write("GGUF not counts");
  EXPECT_EQ(code(), ErrorCode::kInvalidArgument);
  std::filesystem::remove(path_);
  EXPECT_EQ(code(), ErrorCode::kNotFound);
}

TEST(RoutingKey, FollowsTheRouters) {
  // One key for a file however often it is opened; others for another quantization of the same weights (tiny-q4_0,
  // its f32 routers the same bytes as tiny's) and for another architecture with the same routers (the golden
  // qwen35moe and qwen3next fixtures).
  std::unique_ptr<Model> a = open_model("tiny");
  std::unique_ptr<Model> a2 = open_model("tiny");
  std::unique_ptr<Model> q = open_model("tiny-q4_0");
  std::unique_ptr<Model> g = open_model("golden-qwen35moe");
  std::unique_ptr<Model> n = open_model("golden-qwen3next");
  ASSERT_TRUE(a && a2 && q && g && n);
  EXPECT_EQ(routing_key(*a), routing_key(*a2));
  EXPECT_NE(routing_key(*a), routing_key(*q));
  EXPECT_NE(routing_key(*g), routing_key(*n));
}

}  // namespace
}  // namespace kestrel::cpu
