// WorkerPool: every item runs exactly once per job, across many back-to-back jobs (the spin path) and after idle
// pauses (the sleep path); submit()/wait() from a thread that is not a worker; run() with no workers; a matmul
// through the pool gives the same bits at 1, 2 and hardware_concurrency threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "core/quant/quant.h"
#include "cpu/gemv.h"
#include "cpu/matmul.h"
#include "cpu/tick.h"
#include "cpu/worker_pool.h"

namespace kestrel::cpu {
namespace {

TEST(WorkerPool, EveryItemOncePerJob) {
  auto pool = WorkerPool::create(3, /*pin=*/true);
  ASSERT_TRUE(pool.has_value());
  std::vector<std::atomic<int>> hits(1000);
  for (int job = 0; job < 200; ++job) {
    const int64_t n = 1 + (job * 37) % 1000;
    auto body = [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed); };
    (*pool)->for_each(n, body);
    for (int64_t i = 0; i < 1000; ++i) {
      ASSERT_EQ(hits[static_cast<size_t>(i)].exchange(0), i < n ? 1 : 0) << "job " << job << " item " << i;
    }
    if (job % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // workers go to sleep
  }
}

// Many more workers than cores and many tiny jobs, so workers wake late for a job that has already finished while
// the next one is being submitted: no item may run twice or under the wrong job, and no job may end early.
TEST(WorkerPool, LateWorkersNeverRunItemsOfTheNextJob) {
  auto pool = WorkerPool::create(15, /*pin=*/false);
  ASSERT_TRUE(pool.has_value());
  constexpr int kMaxItems = 24;
  std::vector<std::atomic<int>> hits(kMaxItems);
  std::atomic<int> job_id{0};
  std::atomic<int> wrong_job{0};
  for (int job = 0; job < 20000; ++job) {
    const int64_t n = 1 + (job * 7) % kMaxItems;
    job_id.store(job, std::memory_order_relaxed);
    auto body = [&, job](int64_t i) {
      if (job_id.load(std::memory_order_relaxed) != job) wrong_job.fetch_add(1);
      hits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    };
    (*pool)->for_each(n, body);
    for (int64_t i = 0; i < kMaxItems; ++i) {
      ASSERT_EQ(hits[static_cast<size_t>(i)].exchange(0), i < n ? 1 : 0) << "job " << job << " item " << i;
    }
  }
  EXPECT_EQ(wrong_job.load(), 0);
}

// Each participant starts on its own share of the items; a share whose owner is busy is finished by the others.
// Item 0 (the first of the calling thread's share) waits until every other item has run, so the rest of its share
// must be taken by the workers.
TEST(WorkerPool, BusyParticipantsShareIsTakenByOthers) {
  auto pool = WorkerPool::create(3, /*pin=*/false);
  ASSERT_TRUE(pool.has_value());
  constexpr int64_t kItems = 64;
  for (int job = 0; job < 20; ++job) {
    std::atomic<int64_t> others{0};
    std::atomic<bool> gave_up{false};
    auto body = [&](int64_t i) {
      if (i != 0) {
        others.fetch_add(1, std::memory_order_acq_rel);
        return;
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (others.load(std::memory_order_acquire) < kItems - 1) {
        if (std::chrono::steady_clock::now() > deadline) {
          gave_up.store(true);
          return;
        }
        std::this_thread::yield();
      }
    };
    (*pool)->for_each(kItems, body);
    ASSERT_FALSE(gave_up.load()) << "job " << job << ": items of a busy thread's share were left waiting";
    EXPECT_EQ(others.load(), kItems - 1);
  }
}

TEST(WorkerPool, SubmitAndWaitFromAnotherThread) {
  auto pool = WorkerPool::create(2, /*pin=*/false);
  ASSERT_TRUE(pool.has_value());
  std::atomic<int64_t> sum{0};
  struct Ctx {
    std::atomic<int64_t>* sum;
  } ctx{&sum};
  Job job;
  job.fn = [](void* c, int64_t i) { static_cast<Ctx*>(c)->sum->fetch_add(i + 1); };
  job.ctx = &ctx;
  job.n_items = 100;
  std::thread caller([&] {
    for (int k = 0; k < 10; ++k) {
      (*pool)->submit(job);
      (*pool)->wait();
    }
  });
  caller.join();
  EXPECT_EQ(sum.load(), 10 * 5050);
}

TEST(WorkerPool, NoWorkersRunsOnTheCaller) {
  auto pool = WorkerPool::create(0, /*pin=*/false);
  ASSERT_TRUE(pool.has_value());
  int count = 0;
  auto body = [&](int64_t) { ++count; };
  (*pool)->for_each(17, body);
  EXPECT_EQ(count, 17);
  EXPECT_EQ(WorkerPool::create(-1, false).error().code, ErrorCode::kInvalidArgument);
  EXPECT_FALSE(physical_core_cpus().empty());
}

// Threads beyond the core count go to the cores' other hyper-threads before two share a CPU: one CPU per core first,
// whatever the sibling numbering, then the rest; the machine's own order is a permutation of its allowed CPUs that
// starts with physical_core_cpus().
TEST(WorkerPool, PinOrderTakesEachCoreBeforeItsSiblings) {
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(pin_order_of(eight, {0, 1, 2, 3, 0, 1, 2, 3}), eight);  // siblings n apart (c, c + 4)
  EXPECT_EQ(pin_order_of(eight, {0, 0, 2, 2, 4, 4, 6, 6}), (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));  // adjacent
  EXPECT_EQ(pin_order_of(eight, eight), eight);                                                          // no SMT
  EXPECT_EQ(pin_order_of({2, 3, 6, 7}, {2, 3, 2, 3}), (std::vector<int>{2, 3, 6, 7}));  // an affinity mask's subset
  EXPECT_EQ(pin_order_of(eight, {0, 1}), eight);  // no topology: the allowed CPUs as they are
  const std::vector<int> order = pin_order(), cores = physical_core_cpus();
  ASSERT_GE(order.size(), cores.size());
  EXPECT_TRUE(std::equal(cores.begin(), cores.end(), order.begin()));
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "a CPU twice";
}

TEST(WorkerPool, MatmulBitsDoNotDependOnThreadCount) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t n_in = 320, n_out = 1031, n_vec = 5;
  std::vector<float> w(static_cast<size_t>(n_in * n_out)), x(static_cast<size_t>(n_in * n_vec));
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  // An F32 matrix and a Q4_0 one (int8 activations where the level has them, quantized over the pool: n_vec > 4).
  const ref::QuantMatrix m = ref::f32_matrix(w.data(), static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out));
  std::vector<uint8_t> q4(*ggml_row_bytes(GgmlType::kQ4_0, n_in) * n_out);
  ASSERT_TRUE(quantize_row(GgmlType::kQ4_0, w.data(), q4.data(), n_in * n_out));
  const ref::QuantMatrix m4{GgmlType::kQ4_0, q4.data(), static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)};
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<float> first;
  for (int threads : {1, 2, hw}) {
    auto pool = WorkerPool::create(threads - 1, /*pin=*/true);
    ASSERT_TRUE(pool.has_value());
    MatmulRunner mm(**pool, isa_selected(), GemvInput::kQ8);
    std::vector<float> y(static_cast<size_t>(2 * n_out * n_vec));
    const GemvTask t[2] = {task_of(m, x.data(), n_vec, y.data()),
                           task_of(m4, x.data(), n_vec, y.data() + n_out * n_vec)};
    mm.run(t);
    if (first.empty()) first = y;
    EXPECT_EQ(y, first) << threads << " threads";
  }
}

}  // namespace
}  // namespace kestrel::cpu
