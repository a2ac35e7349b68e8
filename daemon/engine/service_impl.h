// ServiceImpl: the Service (service.h) over one Engine — sessions table, admission limits and the engine loop.
//
// Locks: mu_ guards the sessions table, the incoming queue, the counters and the draining/stop flags; engine_mu_ is
// held around every Engine call (engine.h). When both are needed, mu_ is taken first (clone_session,
// reset_session); the engine loop never holds engine_mu_ while taking mu_. No callback runs with either held.
// The engine loop thread (engine_loop, scheduler.cpp) is the only one that calls Engine::step().
//
// Public methods are in service_impl.cpp; the loop and its tick in scheduler.cpp.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/model.h"
#include "daemon/engine/scheduler.h"
#include "daemon/engine/service.h"
#include "daemon/engine/session_table.h"

namespace kestrel::daemon {

class ServiceImpl final : public Service {
 public:
  ServiceImpl(const Model& model, Engine& engine, const ServiceLimits& limits);
  ~ServiceImpl() override;

  ModelInfo model_info() const override { return info_; }
  ServiceStats stats() const override;
  ServiceLimits limits() const override { return limits_; }
  const ServiceMetrics& metrics() const override { return metrics_; }

  Expected<std::vector<int32_t>> tokenize(const std::string& text, bool parse_special) const override;
  Expected<std::string> detokenize(const std::vector<int32_t>& tokens, size_t max_bytes) const override;

  Expected<SessionInfo> create_session(const SessionOptions& options) override;
  Expected<SessionInfo> clone_session(SessionId id, uint64_t owner) override;
  Expected<SessionInfo> reset_session(SessionId id) override;
  Status close_session(SessionId id) override;
  uint32_t close_owned_by(uint64_t owner) override;

  void step(StepRequest request, std::function<void(Expected<StepResult>)> done) override;
  void generate(GenerateRequest request, std::shared_ptr<GenerateSink> sink) override;
  Expected<bool> abort(SessionId id) override;

  void drain(Clock::time_point deadline) override;

  // Starts the engine loop thread (make_service calls it once).
  void start();

 private:
  // What one tick decided for one request, delivered after the locks are released (scheduler.cpp).
  struct Outcome {
    std::shared_ptr<Request> request;
    std::vector<GenerateChunk> chunks;
    bool finished = false;
    std::optional<Expected<StepResult>> step_result;
    std::optional<Expected<GenerateSummary>> generate_result;
  };

  // service_impl.cpp
  Expected<std::shared_ptr<Session>> new_session(int32_t n_ctx, const SamplingOverrides& sampling,
                                                 std::chrono::seconds idle_ttl, uint64_t owner, bool temporary);
  Status admit(const std::shared_ptr<Request>& request, SessionId id, const SamplingOverrides& sampling,
               int32_t top_logprobs);
  Status close_locked(SessionId id, std::vector<SlotId>* slots_to_free);
  void free_slots(const std::vector<SlotId>& slots);
  Status check_tokens(const std::vector<int32_t>& tokens, const char* what) const;

  // scheduler.cpp
  void engine_loop();
  void tick(std::vector<Outcome>* outcomes);
  // Samples the request's next token from the logits, or takes `greedy` (>= 0: the engine's argmax for a greedy
  // request without penalties or log-probabilities, where sampling would give exactly that token). `now`: when the
  // tick's forward pass ended (the token's time in the metrics).
  void sample_and_advance(Request& r, std::span<const float> logits, int32_t greedy, Clock::time_point now,
                          Outcome* out);
  // Records a sampled token in the metrics: the request's first (with its prompt) or the next one.
  void record_token(Request& r, Clock::time_point now);
  void end_request(Request& r);
  void finish(std::vector<Outcome>* outcomes);
  // Records how a request ended (its last callback is about to run).
  void record_end(const Request& r, const Outcome& o);

  const Model& model_;
  Engine& engine_;
  ServiceLimits limits_;
  ModelInfo info_;
  std::vector<int32_t> eos_ids_;

  mutable std::mutex mu_;
  std::condition_variable wake_;  // the engine loop waits here for work
  std::condition_variable idle_;  // drain() waits here for queued_ to reach 0
  SessionTable table_;
  std::deque<std::shared_ptr<Request>> incoming_;
  uint32_t queued_ = 0;    // admitted requests not yet finished
  uint32_t reserved_ = 0;  // sessions being created (counted against max_sessions)
  // Engine slots allocated and not yet freed: a closed session holds its slot a little longer than its table entry
  // (until its request ends, or until the closer frees it), so admission counts slots rather than table entries;
  // with Engine::max_slots() >= max_sessions the engine then never runs out of slots.
  uint32_t slots_held_ = 0;
  bool draining_ = false;
  bool stop_ = false;
  Clock::duration drain_time_{0};  // from drain()'s call to its deadline (for the shutdown messages)

  std::mutex engine_mu_;

  std::mutex drain_mu_;  // one drain() at a time; joins the thread once
  std::thread thread_;
  std::thread::id loop_id_;

  // Engine loop thread only.
  std::vector<std::shared_ptr<Request>> active_;
  Clock::duration stop_drain_time_{0};  // drain_time_, read with stop_
  uint64_t rotation_ = 0;
  std::vector<float> tick_logits_;  // f32 [items, n_vocab]: every item's logits of the current tick, reused

  std::atomic<bool> serving_{false};
  std::atomic<uint64_t> ticks_{0}, tokens_processed_{0}, tokens_generated_{0};
  ServiceMetrics metrics_;
};

}  // namespace kestrel::daemon
