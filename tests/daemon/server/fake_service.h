// FakeService: a test double of daemon::Service for the server tests. It keeps sessions in a map, answers steps with
// "last token + 1", tokenizes one token per byte, and runs step/generate callbacks on its own "engine" thread, as the
// real Service does. Tests can make the next call fail with a chosen Error, slow generation down, and read back the
// last request the Service received (to check the conversion from kestrel.v1).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "daemon/engine/service.h"

namespace kestrel::daemon::testing {

class FakeService final : public Service {
 public:
  static constexpr int32_t kVocab = 1000;

  FakeService() : engine_([this] { run(); }) {}
  ~FakeService() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    engine_.join();
  }

  // The next call of the named kind fails with this error (once).
  void fail_next(Error e) {
    std::lock_guard lock(mu_);
    next_error_ = std::move(e);
  }
  // Delay between generated tokens (to leave time for a cancellation).
  std::chrono::milliseconds token_delay{0};
  std::atomic<bool> serving{true};
  // What stats() reports as the engine's shared KV pool (set before the calls).
  EngineCachePool cache;
  // How generate() ends a generation that ran to max_tokens (set before the call).
  FinishReason finish_reason = FinishReason::kMaxTokens;
  std::string finish_message;

  // What the last step()/generate()/create_session() received.
  std::optional<StepRequest> last_step;
  std::optional<GenerateRequest> last_generate;
  std::optional<SessionOptions> last_create;
  std::atomic<bool> generate_saw_cancel{false};
  std::atomic<int> generate_tokens_emitted{0};
  mutable std::atomic<size_t> last_detokenize_max_bytes{0};

  ModelInfo model_info() const override {
    ModelInfo m;
    m.architecture = "qwen35moe";
    m.name = "fake";
    m.engine = "fake";
    m.n_vocab = kVocab;
    m.n_ctx_train = 4096;
    m.max_session_ctx = 2048;
    m.eos_token_ids = {999};
    m.n_layer = 2;
    m.n_embd = 64;
    m.n_expert = 8;
    m.n_expert_used = 2;
    m.placement = {{"embeddings", "cpu", 1234}};
    m.file_bytes = 4321;
    m.chat_template = "{{ messages[0].content }}";
    return m;
  }
  ServiceStats stats() const override {
    std::lock_guard lock(mu_);
    ServiceStats s;
    s.serving = serving.load();
    s.sessions = static_cast<uint32_t>(sessions_.size());
    s.ticks = 7;
    s.cache = cache;
    return s;
  }
  ServiceLimits limits() const override { return ServiceLimits{}; }
  const ServiceMetrics& metrics() const override { return metrics_; }

  Expected<std::vector<int32_t>> tokenize(const std::string& text, bool /*parse_special*/) const override {
    if (auto e = take_error()) return *e;
    std::vector<int32_t> out;
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  Expected<std::string> detokenize(const std::vector<int32_t>& tokens, size_t max_bytes) const override {
    if (auto e = take_error()) return *e;
    last_detokenize_max_bytes = max_bytes;
    if (tokens.size() > max_bytes) {
      return make_error(ErrorCode::kResourceExhausted,
                        std::to_string(tokens.size()) + " bytes, more than " + std::to_string(max_bytes));
    }
    std::string out;
    for (int32_t t : tokens) out.push_back(static_cast<char>(t & 0xFF));
    return out;
  }

  Expected<SessionInfo> create_session(const SessionOptions& options) override {
    if (auto e = take_error()) return *e;
    std::lock_guard lock(mu_);
    last_create = options;
    const SessionId id = next_id_++;
    sessions_[id] = SessionInfo{id, options.n_ctx == 0 ? 4096 : options.n_ctx, 0};
    return sessions_[id];
  }
  Expected<SessionInfo> clone_session(SessionId id, uint64_t /*owner*/) override {
    if (auto e = take_error()) return *e;
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return not_found(id);
    const SessionId nid = next_id_++;
    sessions_[nid] = SessionInfo{nid, it->second.n_ctx, it->second.n_past};
    return sessions_[nid];
  }
  Expected<SessionInfo> reset_session(SessionId id) override {
    if (auto e = take_error()) return *e;
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return not_found(id);
    it->second.n_past = 0;
    return it->second;
  }
  Status close_session(SessionId id) override {
    if (auto e = take_error()) return *e;
    std::lock_guard lock(mu_);
    if (sessions_.erase(id) == 0) return not_found(id);
    return ok_status();
  }
  uint32_t close_owned_by(uint64_t /*owner*/) override { return 0; }

  void step(StepRequest request, std::function<void(Expected<StepResult>)> done) override {
    {
      std::lock_guard lock(mu_);
      last_step = request;
    }
    if (auto e = take_error()) {
      post([done, err = *e] { done(err); });
      return;
    }
    post([this, request = std::move(request), done = std::move(done)] {
      std::unique_lock lock(mu_);
      auto it = sessions_.find(request.session);
      if (it == sessions_.end()) {
        lock.unlock();
        done(not_found(request.session));
        return;
      }
      it->second.n_past += static_cast<int64_t>(request.tokens.size());
      StepResult r;
      r.token = (request.tokens.back() + 1) % kVocab;
      r.logprob = -0.5f;
      for (int32_t i = 0; i < request.top_logprobs; ++i) r.top.push_back({i, -1.0f - static_cast<float>(i)});
      r.n_past = it->second.n_past;
      lock.unlock();
      done(r);
    });
  }

  // Emits max_tokens chunks of one token each ('a', 'b', ...), then the summary; honours cancellation and deadline.
  void generate(GenerateRequest request, std::shared_ptr<GenerateSink> sink) override {
    {
      std::lock_guard lock(mu_);
      last_generate = request;
    }
    if (auto e = take_error()) {
      post([sink, err = *e] { sink->on_done(err); });
      return;
    }
    post([this, request = std::move(request), sink] {
      const SessionId sid = request.session == 0 ? 777 : request.session;
      for (int32_t i = 0; i < request.max_tokens; ++i) {
        if (token_delay.count() > 0) std::this_thread::sleep_for(token_delay);
        if (sink->cancelled()) {
          generate_saw_cancel = true;
          sink->on_done(make_error(ErrorCode::kCancelled, "generation cancelled: the client went away"));
          return;
        }
        if (request.deadline && Clock::now() > *request.deadline) {
          sink->on_done(
              make_error(ErrorCode::kDeadlineExceeded, "deadline passed after " + std::to_string(i) + " tokens"));
          return;
        }
        GenerateChunk c;
        c.tokens = {'a' + (i % 26)};
        c.text = std::string(1, static_cast<char>('a' + (i % 26)));
        if (request.top_logprobs > 0) {
          StepResult s;
          s.token = c.tokens[0];
          s.logprob = -0.25f;
          s.top = {{c.tokens[0], -0.25f}};
          c.logprobs.push_back(s);
        }
        c.session = sid;
        c.n_past = static_cast<int64_t>(request.prompt.size()) + i + 1;
        sink->on_chunk(std::move(c));
        ++generate_tokens_emitted;
      }
      GenerateSummary sum;
      sum.reason = finish_reason;
      sum.message = finish_message;
      sum.prompt_tokens = static_cast<uint32_t>(request.prompt.size());
      sum.completion_tokens = static_cast<uint32_t>(request.max_tokens);
      sum.session = sid;
      sum.n_past = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
      sink->on_done(sum);
    });
  }

  Expected<bool> abort(SessionId id) override {
    if (auto e = take_error()) return *e;
    std::lock_guard lock(mu_);
    if (!sessions_.contains(id)) return not_found(id);
    return false;
  }
  void drain(Clock::time_point /*deadline*/) override { serving = false; }

  // Blocks until the engine thread has run everything posted so far.
  void wait_idle() {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [this] { return tasks_.empty() && !busy_; });
  }

 private:
  static Error not_found(SessionId id) {
    return make_error(ErrorCode::kNotFound, "session " + std::to_string(id) + " does not exist");
  }

  std::optional<Error> take_error() const {
    std::lock_guard lock(mu_);
    std::optional<Error> e = std::move(next_error_);
    next_error_.reset();
    return e;
  }

  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
      lock.unlock();
      task();
      lock.lock();
      busy_ = false;
      idle_cv_.notify_all();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false, busy_ = false;
  mutable std::optional<Error> next_error_;
  std::map<SessionId, SessionInfo> sessions_;
  SessionId next_id_ = 1;
  std::thread engine_;  // last: started after every other member exists
  ServiceMetrics metrics_;
};

}  // namespace kestrel::daemon::testing
