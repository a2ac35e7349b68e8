// The submit()/wait() contract of the CPU ExpertBackend (core/engine/expert_backend.h) with callers that are not
// the backend's threads, as the hybrid engine's CUDA host functions call it: submit() on one foreign thread, wait()
// on another, ordered by a hand-off between them (as two host functions of one stream are), batch after batch, with
// new inputs each time; the results must be run()'s bits. Also: the destructor waits for a batch in flight, and
// wait() with nothing submitted returns at once. Small on purpose: `ctest --preset tsan` runs it under
// ThreadSanitizer, which checks the publication of the batch to the driver thread and of the output to the waiter.
#include <gtest/gtest.h>

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

TEST(ExpertBackendThreads, SubmitAndWaitOnForeignThreads) {
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
  EXPECT_TRUE(be.wait()) << "nothing submitted yet";

  // The batches and run()'s outputs for them.
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

  // Thread A submits batch i into one reused output buffer, then hands over to thread B, which waits, checks the
  // output and hands back.
  std::vector<float> y(expected[0].size());
  std::binary_semaphore submitted(0), checked(0);
  std::atomic<int> mismatches{0}, failures{0};
  std::thread a([&] {
    for (int i = 0; i < kBatches; ++i) {
      const int32_t layer = i % static_cast<int32_t>(hp.n_layer);
      if (!be.submit(ExpertBatch{layer, kTokens, H, k, rows[static_cast<size_t>(i)].x.data(),
                                 rows[static_cast<size_t>(i)].choices.data(), y.data()})) {
        failures.fetch_add(1);
      }
      submitted.release();
      checked.acquire();
    }
  });
  std::thread b([&] {
    for (int i = 0; i < kBatches; ++i) {
      submitted.acquire();
      if (!be.wait()) failures.fetch_add(1);
      if (y != expected[static_cast<size_t>(i)]) mismatches.fetch_add(1);
      checked.release();
    }
  });
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0) << "batches whose output differs from run()'s";

  // Destroying the backend with a batch in flight waits for it.
  std::fill(y.begin(), y.end(), 0.0f);
  std::thread([&] {
    EXPECT_TRUE(be.submit(ExpertBatch{0, kTokens, H, k, rows[0].x.data(), rows[0].choices.data(), y.data()}));
  }).join();
  made->reset();
  EXPECT_EQ(y, expected[0]);
}

}  // namespace
}  // namespace kestrel::cpu
