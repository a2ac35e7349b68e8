// The threading contract of the CPU ExpertBackend (core/engine/expert_backend.h) with callers that are not the
// backend's threads and not the one that made it, as the CUDA engine's hand-off thread (gpu/engine/host_expert_link.h)
// calls it: run() on two foreign threads in turn, each call ordered after the previous one by a hand-off between
// them, batch after batch into one reused output buffer with new inputs each time; the results must be the bits of
// run() on the making thread. Small on purpose: `ctest --preset tsan` runs it under ThreadSanitizer, which checks the
// publication of each batch to the pool's workers and of the output back to each caller.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/expert_backend.h"
#include "core/model/model.h"
#include "cpu/expert_backend.h"
#include "tests/core/engine/engine_test_util.h"

namespace kestrel::cpu {
namespace {

constexpr int kTokens = 4;
constexpr int kBatches = 12;

struct Rows {
  std::vector<float> x;               // f32 [kTokens, H]
  std::vector<ExpertChoice> choices;  // [kTokens, k]
};

Rows random_rows(std::mt19937& rng, int32_t k, int32_t E, int32_t H) {
  Rows r{std::vector<float>(static_cast<size_t>(kTokens * H)),
         std::vector<ExpertChoice>(static_cast<size_t>(kTokens * k))};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : r.x) v = normal(rng);
  for (int32_t t = 0; t < kTokens; ++t) {
    const int32_t first = static_cast<int32_t>(rng() % static_cast<uint32_t>(E));
    for (int32_t j = 0; j < k; ++j) {  // k distinct experts: a random first, then consecutive ids
      r.choices[static_cast<size_t>(t * k + j)] = ExpertChoice{(first + j) % E, 1.0f / static_cast<float>(k)};
    }
  }
  return r;
}

TEST(ExpertBackendThreads, RunOnForeignThreadsInTurn) {
  auto m = Model::open(test::fixture_model_path("golden-qwen35moe"));
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  const ModelHparams& hp = (*m)->hparams();
  const int32_t H = static_cast<int32_t>(hp.n_embd), E = static_cast<int32_t>(hp.n_expert);
  const int32_t k = static_cast<int32_t>(hp.n_expert_used);
  CpuExpertBackendOptions o;
  o.threads = 2;
  o.pin = false;
  auto made = make_cpu_expert_backend(**m, ExpertSet::all(hp), o);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  CpuExpertBackend& be = **made;

  // The batches and run()'s outputs for them on this thread.
  std::mt19937 rng(7);
  std::vector<Rows> rows;
  std::vector<std::vector<float>> expected;
  for (int i = 0; i < kBatches; ++i) {
    rows.push_back(random_rows(rng, k, E, H));
    std::vector<float> y(rows.back().x.size());
    const int32_t layer = i % static_cast<int32_t>(hp.n_layer);
    const Status s =
        be.run(ExpertBatch{layer, kTokens, H, k, rows.back().x.data(), rows.back().choices.data(), y.data()});
    ASSERT_TRUE(s) << s.error().to_string();
    expected.push_back(std::move(y));
  }

  // Threads A and B take the batches in turn (A the even ones, B the odd ones): each runs its batch into one reused
  // output buffer, checks the output and hands over to the other.
  std::vector<float> y(expected[0].size());
  std::binary_semaphore a_turn(1), b_turn(0);
  std::atomic<int> mismatches{0}, failures{0};
  auto serve = [&](int first, std::binary_semaphore& mine, std::binary_semaphore& other) {
    for (int i = first; i < kBatches; i += 2) {
      mine.acquire();
      const int32_t layer = i % static_cast<int32_t>(hp.n_layer);
      if (!be.run(ExpertBatch{layer, kTokens, H, k, rows[static_cast<size_t>(i)].x.data(),
                              rows[static_cast<size_t>(i)].choices.data(), y.data()})) {
        failures.fetch_add(1);
      }
      if (y != expected[static_cast<size_t>(i)]) mismatches.fetch_add(1);
      other.release();
    }
  };
  std::thread a([&] { serve(0, a_turn, b_turn); });
  std::thread b([&] { serve(1, b_turn, a_turn); });
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0) << "batches whose output differs from run()'s on the making thread";

  // Back on the making thread after the foreign ones.
  std::fill(y.begin(), y.end(), 0.0f);
  ASSERT_TRUE(be.run(ExpertBatch{0, kTokens, H, k, rows[0].x.data(), rows[0].choices.data(), y.data()}));
  EXPECT_EQ(y, expected[0]);
}

}  // namespace
}  // namespace kestrel::cpu
