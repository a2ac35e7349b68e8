// ServiceMetrics: what the Service measures about the Step and Generate requests it serves, kept per transport (gRPC,
// shared memory, HTTP) and rendered by GET /metrics in the Prometheus text format (daemon/http/metrics_page.h,
// docs/http.md "Metrics"). The names follow vLLM's: request, prompt-token and generation-token counters,
// time-to-first-token, inter-token, end-to-end and queue-time histograms, running and waiting requests.
//
// When each value moves (all times on the Service's steady clock, from admission):
//   admitted   a request passed every admission check and was queued: waiting + 1
//   scheduled  the engine loop gave it tokens for the first time: waiting - 1, running + 1, queue time observed
//   token      a token was sampled: generation tokens + 1; the first one observes time to first token (and adds the
//              request's prompt tokens, now processed), later ones the time since the previous token
//   ended      its last callback: running - 1 (or waiting - 1 when never scheduled); success by finish reason with
//              its end-to-end time, or failure by error code
// A request refused at admission is only a failure (it was never waiting).
//
// Threading: every method may be called from any thread. Recording is lock-free (relaxed atomics), so the engine
// loop never waits for a scrape; a snapshot reads each value once, so the values of one snapshot may be a few events
// apart (as with any Prometheus client library).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/base/expected.h"

namespace kestrel::daemon {

// Where a request came from (its `transport` label).
enum class Transport : uint8_t { kGrpc = 0, kShm = 1, kHttp = 2 };
inline constexpr size_t kTransportCount = 3;
// "grpc", "shm", "http".
const char* transport_name(Transport transport);

// How a successful request ended (the `finished_reason` label): "stop" (an end-of-generation or stop token, a stop
// string), "length" (max_tokens, a full context), "abort" (Abort, a closed session, shutdown), "step" (a Step).
enum class FinishClass : uint8_t { kStop = 0, kLength = 1, kAbort = 2, kStep = 3 };
inline constexpr size_t kFinishClassCount = 4;
const char* finish_class_name(FinishClass finish);

inline constexpr size_t kErrorCodeCount = static_cast<size_t>(ErrorCode::kInternal) + 1;
// The `code` label of a failure: "invalid_argument", "resource_exhausted", ... (error_code_name with underscores).
const char* error_code_label(ErrorCode code);

// A histogram with fixed upper bounds (seconds), Prometheus-style: observe() adds to the first bucket whose bound is
// >= the value (the last, implicit bucket is +Inf) and to the sum.
class Histogram {
 public:
  explicit Histogram(std::span<const double> upper_bounds);
  void observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;  // ascending, without +Inf
    std::vector<uint64_t> counts;      // per bucket, NOT cumulative; size upper_bounds.size() + 1 (the last: +Inf)
    double sum = 0.0;
    uint64_t count = 0;  // sum of counts
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

// The histogram bounds of each latency (seconds).
std::span<const double> ttft_buckets();
std::span<const double> inter_token_buckets();
std::span<const double> e2e_buckets();
std::span<const double> queue_time_buckets();

class ServiceMetrics {
 public:
  ServiceMetrics();

  void admitted(Transport t);
  void scheduled(Transport t, double queue_seconds);
  void first_token(Transport t, double seconds_since_admission, uint64_t prompt_tokens);
  void next_token(Transport t, double seconds_since_previous);
  void succeeded(Transport t, bool was_scheduled, FinishClass finish, double e2e_seconds);
  // was_admitted: false for a refusal at admission (then it was never counted as waiting).
  void failed(Transport t, bool was_admitted, bool was_scheduled, ErrorCode code);

  struct PerTransport {
    std::array<uint64_t, kFinishClassCount> success{};
    std::array<uint64_t, kErrorCodeCount> failure{};
    uint64_t prompt_tokens = 0, generation_tokens = 0;
    int64_t running = 0, waiting = 0;
    Histogram::Snapshot ttft, inter_token, e2e, queue_time;
  };
  struct Snapshot {
    std::array<PerTransport, kTransportCount> transports;
  };
  Snapshot snapshot() const;

 private:
  struct Slot {
    Slot();
    std::array<std::atomic<uint64_t>, kFinishClassCount> success{};
    std::array<std::atomic<uint64_t>, kErrorCodeCount> failure{};
    std::atomic<uint64_t> prompt_tokens{0}, generation_tokens{0};
    std::atomic<int64_t> running{0}, waiting{0};
    Histogram ttft, inter_token, e2e, queue_time;
  };
  Slot& at(Transport t) { return *slots_[static_cast<size_t>(t)]; }
  void leave(Slot& s, bool was_scheduled);

  std::array<std::unique_ptr<Slot>, kTransportCount> slots_;
};

}  // namespace kestrel::daemon
