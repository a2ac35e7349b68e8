// ServiceMetrics and Histogram (service_metrics.h).
#include "daemon/engine/service_metrics.h"

#include <algorithm>

namespace kestrel::daemon {
namespace {

// Bounds in seconds. Decode runs from about 2 ms a token (a GPU at batch 1) to seconds (the scalar reference on a
// large model), so the token latencies start at 1 ms; the request-level ones reach into hours like vLLM's.
constexpr double kTtft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,  0.75,
                            1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160., 640., 2560.};
constexpr double kInterToken[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,
                                  0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
constexpr double kE2e[] = {0.01, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,
                           15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120., 240.0, 480.0, 960.0, 1920., 7680.};
constexpr double kQueue[] = {0.0001, 0.0005, 0.001, 0.005, 0.01,  0.05,  0.1,   0.3,  0.5,  0.8,
                             1.0,    1.5,    2.0,   2.5,   5.0,   10.0,  15.0,  20.0, 30.0, 40.0,
                             50.0,   60.0,   120.,  240.0, 480.0, 960.0, 1920., 7680.};

template <class T>
T load(const std::atomic<T>& v) {
  return v.load(std::memory_order_relaxed);
}

}  // namespace

const char* transport_name(Transport transport) {
  switch (transport) {
    case Transport::kGrpc: return "grpc";
    case Transport::kShm: return "shm";
    case Transport::kHttp: return "http";
  }
  return "unknown";
}

const char* finish_class_name(FinishClass finish) {
  switch (finish) {
    case FinishClass::kStop: return "stop";
    case FinishClass::kLength: return "length";
    case FinishClass::kAbort: return "abort";
    case FinishClass::kStep: return "step";
  }
  return "unknown";
}

const char* error_code_label(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kOutOfRange: return "out_of_range";
    case ErrorCode::kDataLoss: return "data_loss";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kResourceExhausted: return "resource_exhausted";
    case ErrorCode::kFailedPrecondition: return "failed_precondition";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kDeadlineExceeded: return "deadline_exceeded";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

std::span<const double> ttft_buckets() { return kTtft; }
std::span<const double> inter_token_buckets() { return kInterToken; }
std::span<const double> e2e_buckets() { return kE2e; }
std::span<const double> queue_time_buckets() { return kQueue; }

Histogram::Histogram(std::span<const double> upper_bounds)
    : bounds_(upper_bounds.begin(), upper_bounds.end()),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double value) {
  const size_t bucket = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = load(counts_[i]);
    s.count += s.counts[i];
  }
  s.sum = load(sum_);
  return s;
}

ServiceMetrics::Slot::Slot() : ttft(kTtft), inter_token(kInterToken), e2e(kE2e), queue_time(kQueue) {}

ServiceMetrics::ServiceMetrics() {
  for (auto& s : slots_) s = std::make_unique<Slot>();
}

void ServiceMetrics::admitted(Transport t) { at(t).waiting.fetch_add(1, std::memory_order_relaxed); }

void ServiceMetrics::scheduled(Transport t, double queue_seconds) {
  Slot& s = at(t);
  s.waiting.fetch_sub(1, std::memory_order_relaxed);
  s.running.fetch_add(1, std::memory_order_relaxed);
  s.queue_time.observe(queue_seconds);
}

void ServiceMetrics::first_token(Transport t, double seconds_since_admission, uint64_t prompt_tokens) {
  Slot& s = at(t);
  s.ttft.observe(seconds_since_admission);
  s.prompt_tokens.fetch_add(prompt_tokens, std::memory_order_relaxed);
  s.generation_tokens.fetch_add(1, std::memory_order_relaxed);
}

void ServiceMetrics::next_token(Transport t, double seconds_since_previous) {
  Slot& s = at(t);
  s.inter_token.observe(seconds_since_previous);
  s.generation_tokens.fetch_add(1, std::memory_order_relaxed);
}

void ServiceMetrics::leave(Slot& s, bool was_scheduled) {
  (was_scheduled ? s.running : s.waiting).fetch_sub(1, std::memory_order_relaxed);
}

void ServiceMetrics::succeeded(Transport t, bool was_scheduled, FinishClass finish, double e2e_seconds) {
  Slot& s = at(t);
  leave(s, was_scheduled);
  s.success[static_cast<size_t>(finish)].fetch_add(1, std::memory_order_relaxed);
  s.e2e.observe(e2e_seconds);
}

void ServiceMetrics::failed(Transport t, bool was_admitted, bool was_scheduled, ErrorCode code) {
  Slot& s = at(t);
  if (was_admitted) leave(s, was_scheduled);
  s.failure[static_cast<size_t>(code)].fetch_add(1, std::memory_order_relaxed);
}

ServiceMetrics::Snapshot ServiceMetrics::snapshot() const {
  Snapshot out;
  for (size_t i = 0; i < kTransportCount; ++i) {
    const Slot& s = *slots_[i];
    PerTransport& p = out.transports[i];
    for (size_t k = 0; k < kFinishClassCount; ++k) p.success[k] = load(s.success[k]);
    for (size_t k = 0; k < kErrorCodeCount; ++k) p.failure[k] = load(s.failure[k]);
    p.prompt_tokens = load(s.prompt_tokens);
    p.generation_tokens = load(s.generation_tokens);
    p.running = load(s.running);
    p.waiting = load(s.waiting);
    p.ttft = s.ttft.snapshot();
    p.inter_token = s.inter_token.snapshot();
    p.e2e = s.e2e.snapshot();
    p.queue_time = s.queue_time.snapshot();
  }
  return out;
}

}  // namespace kestrel::daemon
