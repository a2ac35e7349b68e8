// A small daemon::Service for the shm server tests: byte-level "tokenizer" (token = byte), sessions with owner tags,
// and an engine thread that answers steps (next token = last token + 1 mod vocab) and streams generations one token
// per tick, polling cancellation between ticks — the threading contract of service.h without a model.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "daemon/engine/service.h"

namespace kestrel::daemon::testing {

class FakeService final : public Service {
 public:
  static constexpr int32_t kVocab = 256;

  FakeService() {
    engine_ = std::thread([this] { engine_loop(); });
  }
  ~FakeService() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    engine_.join();
  }

  std::atomic<int> tick_ms{0};  // pause between generation ticks
  // Time between a generation's cancellation check and its chunk, as the real engine's forward pass sits between its
  // tick's checks and the chunks it delivers: a stream cancelled meanwhile still gets that chunk.
  std::atomic<int> forward_us{0};

  ModelInfo model_info() const override {
    ModelInfo m;
    m.architecture = "fake";
    m.name = "fake-model";
    m.engine = "fake";
    m.n_vocab = kVocab;
    m.n_ctx_train = 1024;
    m.max_session_ctx = 1024;
    m.eos_token_ids = {0};
    return m;
  }
  ServiceStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    ServiceStats s;
    s.serving = true;
    s.sessions = static_cast<uint32_t>(sessions_.size());
    return s;
  }
  ServiceLimits limits() const override { return ServiceLimits{}; }
  const ServiceMetrics& metrics() const override { return metrics_; }

  Expected<std::vector<int32_t>> tokenize(const std::string& text, bool) const override {
    return std::vector<int32_t>(text.begin(), text.end());
  }
  Expected<std::string> detokenize(const std::vector<int32_t>& tokens, size_t max_bytes) const override {
    if (tokens.size() > max_bytes) {
      return make_error(ErrorCode::kResourceExhausted,
                        std::to_string(tokens.size()) + " bytes, more than " + std::to_string(max_bytes));
    }
    std::string s;
    for (int32_t t : tokens) {
      if (t < 0 || t >= kVocab) return make_error(ErrorCode::kInvalidArgument, "token " + std::to_string(t));
      s.push_back(static_cast<char>(t));
    }
    return s;
  }

  Expected<SessionInfo> create_session(const SessionOptions& options) override {
    std::lock_guard<std::mutex> lock(mu_);
    const SessionId id = next_id_++;
    sessions_[id] = Session{options.owner, 0};
    return SessionInfo{id, 1024, 0};
  }
  Expected<SessionInfo> clone_session(SessionId id, uint64_t owner) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return not_found(id);
    const SessionId nid = next_id_++;
    sessions_[nid] = Session{owner, it->second.n_past};
    return SessionInfo{nid, 1024, it->second.n_past};
  }
  Expected<SessionInfo> reset_session(SessionId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return not_found(id);
    it->second.n_past = 0;
    return SessionInfo{id, 1024, 0};
  }
  Status close_session(SessionId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (sessions_.erase(id) == 0) return not_found(id);
    return ok_status();
  }
  uint32_t close_owned_by(uint64_t owner) override {
    std::lock_guard<std::mutex> lock(mu_);
    close_owned_calls_.fetch_add(1);
    uint32_t n = 0;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second.owner == owner) {
        it = sessions_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }

  void step(StepRequest request, std::function<void(Expected<StepResult>)> done) override {
    post([this, request = std::move(request), done = std::move(done)]() -> bool {
      int64_t n_past = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sessions_.find(request.session);
        if (it == sessions_.end()) {
          done(not_found(request.session));
          return false;
        }
        it->second.n_past += static_cast<int64_t>(request.tokens.size());
        n_past = it->second.n_past;
      }
      StepResult r;
      r.token = (request.tokens.back() + 1) % kVocab;
      r.logprob = -0.5f;
      r.n_past = n_past;
      done(std::move(r));
      return false;
    });
  }

  void generate(GenerateRequest request, std::shared_ptr<GenerateSink> sink) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (request.session != 0 && !sessions_.contains(request.session)) {
        sink->on_done(not_found(request.session));
        return;
      }
    }
    auto state = std::make_shared<int32_t>(0);
    post([this, request = std::move(request), sink, state]() -> bool {
      if (sink->cancelled()) {
        sink->on_done(make_error(ErrorCode::kCancelled, "generation cancelled"));
        return false;
      }
      if (*state >= request.max_tokens) {
        GenerateSummary s;
        s.reason = FinishReason::kMaxTokens;
        s.prompt_tokens = static_cast<uint32_t>(request.prompt.size());
        s.completion_tokens = static_cast<uint32_t>(*state);
        s.session = request.session;
        sink->on_done(s);
        return false;
      }
      if (forward_us.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(forward_us.load()));
      GenerateChunk c;
      const int32_t token = 'a' + (request.prompt.back() + *state) % 26;
      c.tokens = {token};
      c.text = std::string(1, static_cast<char>(token));
      c.session = request.session;
      sink->on_chunk(std::move(c));
      ++*state;
      return true;  // run again next tick
    });
  }

  Expected<bool> abort(SessionId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sessions_.contains(id)) return not_found(id);
    return false;
  }
  void drain(Clock::time_point) override {}

  uint32_t close_owned_calls() const { return close_owned_calls_.load(); }

 private:
  struct Session {
    uint64_t owner = 0;
    int64_t n_past = 0;
  };
  static Error not_found(SessionId id) {
    return make_error(ErrorCode::kNotFound, "session " + std::to_string(id) + " does not exist");
  }
  // Queues work for the engine thread; a task returning true runs again on the next tick.
  void post(std::function<bool()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  void engine_loop() {
    for (;;) {
      std::deque<std::function<bool()>> batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (stop_) return;
        batch.swap(tasks_);
      }
      std::deque<std::function<bool()>> again;
      for (auto& t : batch) {
        if (t()) again.push_back(std::move(t));
      }
      if (!again.empty()) {
        if (tick_ms.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(tick_ms.load()));
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& t : again) tasks_.push_back(std::move(t));
      }
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<bool()>> tasks_;
  std::map<SessionId, Session> sessions_;
  SessionId next_id_ = 1;
  bool stop_ = false;
  std::atomic<uint32_t> close_owned_calls_{0};
  std::thread engine_;
  ServiceMetrics metrics_;
};

}  // namespace kestrel::daemon::testing
