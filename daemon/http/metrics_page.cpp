// GET /metrics (metrics_page.h).
#include "daemon/http/metrics_page.h"

#include <string_view>

#include "daemon/http/prometheus_text.h"

namespace kestrel::daemon::http {
namespace {

constexpr std::array<Transport, kTransportCount> kTransports = {Transport::kGrpc, Transport::kShm, Transport::kHttp};

MetricLabels transport_label(Transport t) { return {{"transport", transport_name(t)}}; }

void request_families(PrometheusText& p, const ServiceMetrics::Snapshot& m) {
  auto per_transport = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
    p.family(name, type, help);
    for (Transport t : kTransports) {
      p.sample(name, transport_label(t), static_cast<double>(value(m.transports[static_cast<size_t>(t)])));
    }
  };
  auto histogram = [&](std::string_view name, std::string_view help, auto pick) {
    p.family(name, "histogram", help);
    for (Transport t : kTransports) p.histogram(name, transport_label(t), pick(m.transports[static_cast<size_t>(t)]));
  };
  using PT = ServiceMetrics::PerTransport;

  constexpr std::string_view kSuccess = "kestrel:request_success_total";
  p.family(kSuccess, "counter",
           "Step and Generate requests that ended normally, by how: stop (an end-of-generation or stop token or a "
           "stop string), length (max_tokens or a full context), abort (Abort, a closed session, shutdown), step");
  for (Transport t : kTransports) {
    for (size_t k = 0; k < kFinishClassCount; ++k) {
      MetricLabels labels = transport_label(t);
      labels.emplace_back("finished_reason", finish_class_name(static_cast<FinishClass>(k)));
      p.sample(kSuccess, labels, static_cast<double>(m.transports[static_cast<size_t>(t)].success[k]));
    }
  }
  constexpr std::string_view kFailure = "kestrel:request_failure_total";
  p.family(kFailure, "counter",
           "Step and Generate requests that ended with an error (refused at admission included), by error code");
  for (Transport t : kTransports) {
    for (size_t k = 0; k < kErrorCodeCount; ++k) {
      MetricLabels labels = transport_label(t);
      labels.emplace_back("code", error_code_label(static_cast<ErrorCode>(k)));
      p.sample(kFailure, labels, static_cast<double>(m.transports[static_cast<size_t>(t)].failure[k]));
    }
  }
  per_transport("kestrel:prompt_tokens_total", "counter", "Prompt tokens processed (a Step's tokens included)",
                [](const PT& x) { return x.prompt_tokens; });
  per_transport("kestrel:generation_tokens_total", "counter", "Tokens sampled (a Step's sampled token included)",
                [](const PT& x) { return x.generation_tokens; });
  histogram("kestrel:time_to_first_token_seconds", "Seconds from admission to the first sampled token",
            [](const PT& x) -> const Histogram::Snapshot& { return x.ttft; });
  histogram("kestrel:inter_token_latency_seconds", "Seconds between two sampled tokens of one generation",
            [](const PT& x) -> const Histogram::Snapshot& { return x.inter_token; });
  histogram("kestrel:e2e_request_latency_seconds", "Seconds from admission to the end of a successful request",
            [](const PT& x) -> const Histogram::Snapshot& { return x.e2e; });
  histogram("kestrel:request_queue_time_seconds",
            "Seconds from admission until the engine loop first gave the request tokens",
            [](const PT& x) -> const Histogram::Snapshot& { return x.queue_time; });
  per_transport("kestrel:num_requests_running", "gauge", "Requests the engine loop is running",
                [](const PT& x) { return x.running; });
  per_transport("kestrel:num_requests_waiting", "gauge", "Requests admitted and waiting for their first tokens",
                [](const PT& x) { return x.waiting; });
}

void gauge(PrometheusText& p, std::string_view name, std::string_view type, std::string_view help, double value) {
  p.family(name, type, help);
  p.sample(name, {}, value);
}

}  // namespace

std::string render_metrics(const Service* service, const HttpCounters& http) {
  PrometheusText p;
  if (service != nullptr) {
    request_families(p, service->metrics().snapshot());
    const ServiceStats stats = service->stats();
    const ServiceLimits limits = service->limits();
    gauge(p, "kestrel:num_sessions", "gauge", "Open sessions", stats.sessions);
    gauge(p, "kestrel:state_slots_used", "gauge", "Engine state slots held (one per session)", stats.slots_held);
    gauge(p, "kestrel:state_slots_total", "gauge", "Engine state slots available (max_sessions)", limits.max_sessions);
    gauge(p, "kestrel:state_slot_usage_perc", "gauge", "Fraction of the state slots held (0 to 1)",
          limits.max_sessions > 0 ? static_cast<double>(stats.slots_held) / limits.max_sessions : 0.0);
    if (stats.cache.tokens_total > 0) {
      gauge(p, "kestrel:kv_cache_tokens_total", "gauge", "Positions the engine's shared KV cache pool holds",
            static_cast<double>(stats.cache.tokens_total));
      gauge(p, "kestrel:kv_cache_tokens_used", "gauge", "Positions of the KV pages the sessions hold",
            static_cast<double>(stats.cache.tokens_held));
      gauge(p, "kestrel:kv_cache_usage_perc", "gauge", "Fraction of the KV cache pool held (0 to 1)",
            static_cast<double>(stats.cache.tokens_held) / static_cast<double>(stats.cache.tokens_total));
    }
    gauge(p, "kestrel:engine_ticks_total", "counter", "Batched forward passes of the engine loop",
          static_cast<double>(stats.ticks));
    gauge(p, "kestrel:tokens_processed_total", "counter", "Tokens fed through the model",
          static_cast<double>(stats.tokens_processed));
    gauge(p, "kestrel:serving", "gauge", "1 while the model is loaded and kestreld is not draining",
          stats.serving ? 1.0 : 0.0);
  } else {
    gauge(p, "kestrel:serving", "gauge", "1 while the model is loaded and kestreld is not draining", 0.0);
  }
  gauge(p, "kestrel:http_connections", "gauge", "Open HTTP connections",
        static_cast<double>(http.connections.load(std::memory_order_relaxed)));
  constexpr std::string_view kResponses = "kestrel:http_responses_total";
  p.family(kResponses, "counter", "HTTP responses sent, by status code (a stream counts when its headers go out)");
  for (size_t status = 100; status < http.responses_by_status.size(); ++status) {
    const uint64_t n = http.responses_by_status[status].load(std::memory_order_relaxed);
    if (n > 0) p.sample(kResponses, {{"code", std::to_string(status)}}, static_cast<double>(n));
  }
  return p.text();
}

}  // namespace kestrel::daemon::http
