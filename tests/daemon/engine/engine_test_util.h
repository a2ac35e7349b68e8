// Helpers of the daemon/engine tests: the golden fixture models, a reference engine + Service over them, a
// GenerateSink that records everything, and synchronous wrappers of Service::step / generate.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/reference_engine.h"
#include "core/model/model.h"
#include "daemon/engine/service.h"
#include "tests/core/engine/engine_test_util.h"

namespace kestrel::daemon::test {

using kestrel::test::fixture_model_path;
using kestrel::test::iota_tokens;
using kestrel::test::open_fixture;

// Limits for tests: greedy by default, generous queues, small contexts.
inline ServiceLimits test_limits() {
  ServiceLimits l;
  l.max_sessions = 32;
  l.max_queued_steps = 64;
  l.default_n_ctx = 256;
  l.max_session_ctx = 512;
  l.max_batch_tokens = 64;
  l.default_sampling.temperature = 0.0f;
  l.random_seed_by_default = false;
  return l;
}

struct ServiceFixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Service> service;

  static ServiceFixture make(const std::string& name, const ServiceLimits& limits, int32_t slots = 40) {
    ServiceFixture f;
    f.model = open_fixture(name);
    if (!f.model) return f;
    auto e = make_reference_engine(*f.model, slots);
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().to_string());
    if (!e) return f;
    f.engine = std::move(*e);
    auto s = make_service(*f.model, *f.engine, limits);
    EXPECT_TRUE(s.has_value()) << (s ? "" : s.error().to_string());
    if (s) f.service = std::move(*s);
    return f;
  }
};

// Records chunks and the final result; wait() blocks the test thread until on_done.
class RecordingSink : public GenerateSink {
 public:
  void on_chunk(GenerateChunk chunk) override {
    std::lock_guard<std::mutex> lk(mu_);
    EXPECT_FALSE(done_.has_value()) << "on_chunk after on_done";
    chunks_.push_back(std::move(chunk));
  }
  void on_done(Expected<GenerateSummary> result) override {
    std::lock_guard<std::mutex> lk(mu_);
    EXPECT_FALSE(done_.has_value()) << "on_done called twice";
    done_.emplace(std::move(result));
    cv_.notify_all();
  }
  bool cancelled() const override { return cancel_.load(); }

  void cancel() { cancel_ = true; }
  // Waits (up to `timeout`) for on_done; false on timeout.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return done_.has_value(); });
  }
  bool done() const {
    std::lock_guard<std::mutex> lk(mu_);
    return done_.has_value();
  }
  size_t n_chunks() const {
    std::lock_guard<std::mutex> lk(mu_);
    return chunks_.size();
  }
  // Valid after wait() returned true.
  const Expected<GenerateSummary>& result() const { return *done_; }
  const std::vector<GenerateChunk>& chunks() const { return chunks_; }
  std::vector<int32_t> tokens() const {
    std::vector<int32_t> t;
    for (const GenerateChunk& c : chunks_) t.insert(t.end(), c.tokens.begin(), c.tokens.end());
    return t;
  }
  std::string text() const {
    std::string s;
    for (const GenerateChunk& c : chunks_) s += c.text;
    return s;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<GenerateChunk> chunks_;
  std::optional<Expected<GenerateSummary>> done_;
  std::atomic<bool> cancel_{false};
};

inline Expected<StepResult> step_sync(Service& s, StepRequest req) {
  auto p = std::make_shared<std::promise<Expected<StepResult>>>();
  auto f = p->get_future();
  s.step(std::move(req), [p](Expected<StepResult> r) { p->set_value(std::move(r)); });
  return f.get();
}

inline Expected<StepResult> step_tokens(Service& s, SessionId id, std::vector<int32_t> tokens) {
  StepRequest req;
  req.session = id;
  req.tokens = std::move(tokens);
  return step_sync(s, std::move(req));
}

inline std::shared_ptr<RecordingSink> generate_sync(Service& s, GenerateRequest req) {
  auto sink = std::make_shared<RecordingSink>();
  s.generate(std::move(req), sink);
  EXPECT_TRUE(sink->wait()) << "generate did not finish";
  return sink;
}

inline GenerateRequest gen_request(SessionId id, std::vector<int32_t> prompt, int max_tokens) {
  GenerateRequest r;
  r.session = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

}  // namespace kestrel::daemon::test
