// GET /metrics: the Service's request metrics (service_metrics.h) and state, and the HTTP server's own counters, as
// one Prometheus text page with vLLM-style names (docs/http.md "Metrics" lists every family):
//
//   kestrel:request_success_total{transport,finished_reason}   kestrel:request_failure_total{transport,code}
//   kestrel:prompt_tokens_total{transport}                      kestrel:generation_tokens_total{transport}
//   kestrel:time_to_first_token_seconds{transport}              kestrel:inter_token_latency_seconds{transport}
//   kestrel:e2e_request_latency_seconds{transport}              kestrel:request_queue_time_seconds{transport}
//   kestrel:num_requests_running{transport}                     kestrel:num_requests_waiting{transport}
//   kestrel:num_sessions   kestrel:state_slots_used   kestrel:state_slots_total   kestrel:state_slot_usage_perc
//   kestrel:engine_ticks_total   kestrel:tokens_processed_total   kestrel:serving
//   kestrel:http_connections   kestrel:http_responses_total{code}
//
// Pure functions; thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "daemon/engine/service.h"

namespace kestrel::daemon::http {

// The HTTP server's counters (updated by its connections, read by the page). Thread-safe.
struct HttpCounters {
  std::atomic<int64_t> connections{0};
  std::array<std::atomic<uint64_t>, 600> responses_by_status{};  // index: the HTTP status (100..599)

  void count_response(int status) {
    if (status >= 100 && status < 600) responses_by_status[static_cast<size_t>(status)].fetch_add(1);
  }
};

// The page. `service` may be null (the model is still loading): then only the HTTP families and
// kestrel:serving 0 are written.
std::string render_metrics(const Service* service, const HttpCounters& http);

}  // namespace kestrel::daemon::http
