// OpenAiApi: the routes of kestreld's HTTP server (docs/http.md), over the same Service as the gRPC and shared-memory
// transports:
//
//   GET  /health                 200 {"status": "ok"}; 503 {"status": "loading" | "draining"}
//   GET  /metrics                the Prometheus text page (metrics_page.h)
//   GET  /v1/models              the model served; GET /v1/models/{id} that one model
//   POST /v1/completions         a completion (openai_request.h → Service::generate → completion_call.h)
//   POST /v1/chat/completions    a chat completion, the conversation rendered with the GGUF's chat template
//                                (core/chat/chat_template.h, parsed at attach; a model without a template, or with
//                                one the renderer refuses, answers 501 with the reason, logged once at attach)
//
// With an API key configured, every /v1/ route needs `Authorization: Bearer <key>` (401 otherwise); /health and
// /metrics never do. At most max_concurrent_requests completions run at once over HTTP (429 beyond). A completion
// runs in a temporary session whose context fits the prompt and max_tokens (at least default_n_ctx, at most
// max_session_ctx), closed when it ends, so an aborted stream frees its session.
//
// Threading: handle() runs on a connection's strand, for many connections at once; attach() once from any thread.
// Ownership: borrows the Service from attach() on, which must outlive every request in flight.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "daemon/engine/service.h"
#include "daemon/http/http_exchange.h"
#include "daemon/http/metrics_page.h"
#include "daemon/http/openai_request.h"

namespace kestrel::daemon::http {

// What the API says about the model: kestreld fills it in from the GGUF when the model is loaded.
struct ServedModel {
  std::string id;             // the `model` of /v1/models and of every response
  int64_t created = 0;        // unix seconds: when kestreld loaded it
  std::string chat_template;  // tokenizer.chat_template; "" = none (chat completions are then refused)
  std::string bos_token;      // texts of the model's BOS and EOS tokens, for the template ("" = none)
  std::string eos_token;
};

struct ApiOptions {
  std::string api_key;  // "" = no key required
  uint32_t max_concurrent_requests = 64;
  RequestLimits request_limits;
  // The largest response body: an echoed prompt is sized before anything is built (400 response_too_large when it
  // would not fit), a response that is not streamed as its chunks arrive (completion_call.h).
  size_t max_response_bytes = size_t{16} << 20;
};

class OpenAiApi {
 public:
  explicit OpenAiApi(ApiOptions options);
  ~OpenAiApi();
  OpenAiApi(const OpenAiApi&) = delete;
  OpenAiApi& operator=(const OpenAiApi&) = delete;

  // Connects the Service once it exists (until then every /v1/ route answers 503 "loading"). At most once.
  void attach(Service& service, ServedModel model);

  // Answers `request` through `exchange`: at once, or (completions) from work posted to the exchange's strand.
  void handle(HttpRequest request, const std::shared_ptr<Exchange>& exchange);

  HttpCounters& counters() { return counters_; }

 private:
  struct Attached;
  const Attached* ready() const { return attached_.load(std::memory_order_acquire); }

  void completion(ApiKind kind, const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
  bool authorized(const HttpRequest& request) const;

  ApiOptions options_;
  HttpCounters counters_;
  std::unique_ptr<Attached> attached_owner_;  // written once, by attach()
  std::atomic<const Attached*> attached_{nullptr};
  std::atomic<uint32_t> in_flight_{0};  // completions answering now
};

}  // namespace kestrel::daemon::http
