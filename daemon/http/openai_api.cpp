// OpenAiApi: routing, authorization and the completion path (openai_api.h).
#include "daemon/http/openai_api.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/chat/chat_template.h"
#include "daemon/http/chat_context.h"
#include "daemon/http/completion_call.h"
#include "daemon/http/openai_encode.h"

namespace kestrel::daemon::http {
namespace {

Response json_response(int status, std::string body) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

Response error_response(const ApiError& e) {
  Response r = json_response(e.status, error_body(e));
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

Response loading_response() {
  return error_response(ApiError::from_error(
      make_error(ErrorCode::kUnavailable, "kestreld is still loading its model; retry when GET /health answers 200")));
}

// Compares without an early exit, so the time taken does not tell how much of a guessed key was right.
bool same_secret(std::string_view a, std::string_view b) {
  if (b.empty()) return a.empty();
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % b.size()]);
  return diff == 0;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct OpenAiApi::Attached {
  Service* service;
  ServedModel model;
  ServiceLimits limits;
  std::optional<chat::ChatTemplate> chat_template;  // parsed at attach; when empty, chat completions are refused
  std::string no_chat_template;                     // with this reason
};

OpenAiApi::OpenAiApi(ApiOptions options) : options_(std::move(options)) {}

OpenAiApi::~OpenAiApi() = default;

void OpenAiApi::attach(Service& service, ServedModel model) {
  if (attached_owner_ != nullptr) return;
  auto a = std::make_unique<Attached>(Attached{&service, std::move(model), service.limits(), std::nullopt, ""});
  if (a->model.chat_template.empty()) {
    a->no_chat_template =
        "the model has no chat template (tokenizer.chat_template), so kestreld cannot render "
        "conversations for it; use /v1/completions with a prompt in the model's format";
  } else if (Expected<chat::ChatTemplate> t = chat::ChatTemplate::parse(a->model.chat_template); t) {
    a->chat_template = std::move(t).value();
  } else {
    a->no_chat_template =
        "the model's chat template (tokenizer.chat_template) cannot be rendered by kestreld: " + t.error().message +
        "; use /v1/completions with a prompt in the model's format";
  }
  if (!a->no_chat_template.empty()) spdlog::warn("http: /v1/chat/completions is off: {}", a->no_chat_template);
  attached_owner_ = std::move(a);
  attached_.store(attached_owner_.get(), std::memory_order_release);
}

bool OpenAiApi::authorized(const HttpRequest& request) const {
  if (options_.api_key.empty()) return true;
  constexpr std::string_view kBearer = "Bearer ";
  const std::string_view auth = request.authorization;
  if (!auth.starts_with(kBearer)) return false;
  return same_secret(auth.substr(kBearer.size()), options_.api_key);
}

void OpenAiApi::handle(HttpRequest request, const std::shared_ptr<Exchange>& exchange) {
  std::string_view path = request.target;
  if (const size_t q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  auto wrong_method = [&](const char* allow) {
    Response r = error_response(ApiError{
        405, "method " + request.method + " is not allowed on " + std::string(path) + " (allowed: " + allow + ")",
        "invalid_request_error", "", "method_not_allowed"});
    r.headers.emplace_back("Allow", allow);
    exchange->respond(std::move(r));
  };
  const Attached* a = ready();

  if (path == "/health") {
    if (!get) return wrong_method("GET");
    const char* status = a == nullptr ? "loading" : a->service->stats().serving ? "ok" : "draining";
    const bool ok = std::string_view(status) == "ok";
    return exchange->respond(json_response(ok ? 200 : 503, std::string("{\"status\":\"") + status + "\"}"));
  }
  if (path == "/metrics") {
    if (!get) return wrong_method("GET");
    Response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = render_metrics(a == nullptr ? nullptr : a->service, counters_);
    return exchange->respond(std::move(r));
  }
  const bool models = path == "/v1/models" || path.starts_with("/v1/models/");
  const bool chat = path == "/v1/chat/completions";
  const bool completions = chat || path == "/v1/completions";
  if (!models && !completions) {
    return exchange->respond(error_response(ApiError{404,
                                                     "no route for " + request.method + " " + std::string(path) +
                                                         " (kestreld serves /v1/models, /v1/completions, "
                                                         "/v1/chat/completions, /health and /metrics)",
                                                     "not_found_error", "", "not_found"}));
  }
  if ((models && !get) || (completions && !post)) return wrong_method(models ? "GET" : "POST");
  if (!authorized(request)) {
    return exchange->respond(error_response(
        ApiError{401,
                 request.authorization.empty()
                     ? "You didn't provide an API key: send it as the header 'Authorization: Bearer <key>'"
                     : "Incorrect API key provided",
                 "invalid_request_error", "", "invalid_api_key"}));
  }
  if (a == nullptr) return exchange->respond(loading_response());
  if (models) {
    if (path == "/v1/models") return exchange->respond(json_response(200, models_body(a->model.id, a->model.created)));
    const std::string_view id = path.substr(std::string_view("/v1/models/").size());
    if (id != a->model.id) {
      return exchange->respond(error_response(
          ApiError{404, "The model '" + std::string(id) + "' does not exist; kestreld serves '" + a->model.id + "'",
                   "invalid_request_error", "model", "model_not_found"}));
    }
    return exchange->respond(json_response(200, model_body(a->model.id, a->model.created)));
  }
  completion(chat ? ApiKind::kChat : ApiKind::kCompletion, request, exchange);
}

void OpenAiApi::completion(ApiKind kind, const HttpRequest& http_request, const std::shared_ptr<Exchange>& exchange) {
  const Attached& a = *ready();
  auto refuse = [&](const ApiError& e) { exchange->respond(error_response(e)); };
  Json body;
  if (FieldError e = parse_body(http_request.body, &body)) return refuse(*e);
  CompletionRequest req;
  FieldError parsed = kind == ApiKind::kChat ? parse_chat_request(body, options_.request_limits, &req)
                                             : parse_completion_request(body, options_.request_limits, &req);
  if (parsed) return refuse(*parsed);
  if (!req.model.empty() && req.model != a.model.id) {
    return refuse(ApiError{
        404, "The model '" + req.model + "' does not exist; kestreld serves '" + a.model.id + "' (GET /v1/models)",
        "invalid_request_error", "model", "model_not_found"});
  }

  // The prompt's tokens (and, with echo, its text). A conversation is rendered with the model's chat template.
  std::vector<int32_t> prompt;
  std::string echo;
  if (kind == ApiKind::kChat) {
    if (!a.chat_template) return refuse(ApiError{501, a.no_chat_template, "server_error", "", "no_chat_template"});
    Expected<std::string> rendered =
        a.chat_template->render(template_context(req.chat_context, a.model.bos_token, a.model.eos_token));
    if (!rendered) {
      ApiError e = ApiError::from_error(rendered.error());
      e.message = "the model's chat template refused the conversation: " + e.message;
      e.param = "messages";
      return refuse(e);
    }
    req.prompt_text = std::move(rendered).value();
  }
  // An echoed prompt is the start of the response: sized before it is built, and refused when the response could
  // not hold it.
  auto echo_too_large = [&](const std::string& what) {
    return ApiError::invalid("echo",
                             what + ": the response would pass " + std::to_string(options_.max_response_bytes) +
                                 " bytes, the most kestreld answers; ask without echo",
                             "response_too_large");
  };
  if (!req.prompt_tokens.empty()) {
    prompt = std::move(req.prompt_tokens);
    if (req.echo && prompt.size() < static_cast<size_t>(a.limits.max_session_ctx)) {
      // The tokens' piece lengths are summed before any text is built (a longer prompt is refused below).
      Expected<std::string> text = a.service->detokenize(prompt, options_.max_response_bytes);
      if (!text && text.error().code == ErrorCode::kResourceExhausted) {
        return refuse(echo_too_large("the echoed prompt (" + text.error().message + ")"));
      }
      if (!text) return refuse(ApiError::from_error(text.error()));
      echo = std::move(text).value();
    }
  } else {
    // Special tokens in the text (<|im_start|>, ...) are recognised, as llama-server and vLLM do.
    Expected<std::vector<int32_t>> tokens = a.service->tokenize(req.prompt_text, /*parse_special=*/true);
    if (!tokens) return refuse(ApiError::from_error(tokens.error()));
    if (tokens->empty()) return refuse(ApiError::invalid("prompt", "the prompt tokenized to no tokens"));
    prompt = std::move(tokens).value();
    if (req.echo) echo = req.prompt_text;
  }
  if (!echo.empty()) {
    const ResponseEncoder sizes(kind, "", 0, a.model.id, false, false);
    // The id is not drawn yet: 32 bytes is more than any prefix and its 24 digits.
    if (sizes.body_size_bound(json_string_size(echo) + 32, 0) > options_.max_response_bytes) {
      return refuse(echo_too_large("the echoed prompt is " + std::to_string(echo.size()) + " bytes"));
    }
  }

  // The temporary session's context: the prompt and max_tokens, at least default_n_ctx, at most max_session_ctx.
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t max_ctx = a.limits.max_session_ctx;
  if (n_prompt >= max_ctx) {
    return refuse(
        ApiError{400,
                 "the prompt is " + std::to_string(n_prompt) + " tokens; the largest context a request may use is " +
                     std::to_string(max_ctx) + " tokens (max_session_ctx), which leaves no room to generate",
                 "invalid_request_error", kind == ApiKind::kChat ? "messages" : "prompt", "context_length_exceeded"});
  }
  const int64_t wanted = req.max_tokens ? *req.max_tokens : kind == ApiKind::kCompletion ? 16 : max_ctx;
  const int64_t n_ctx = std::min(max_ctx, std::max<int64_t>(a.limits.default_n_ctx, n_prompt + wanted));

  if (in_flight_.fetch_add(1) >= options_.max_concurrent_requests) {
    in_flight_.fetch_sub(1);
    return refuse(ApiError{429,
                           "too many concurrent requests: " + std::to_string(options_.max_concurrent_requests) +
                               " completions are running over HTTP (max_concurrent_requests); retry later",
                           "rate_limit_error", "", "rate_limit_exceeded"});
  }

  GenerateRequest g;
  g.prompt = std::move(prompt);
  g.max_tokens = static_cast<int32_t>(std::min<int64_t>(wanted, n_ctx - n_prompt));
  g.sampling = req.sampling;
  g.stop_strings = std::move(req.stop);
  g.ignore_eos = req.ignore_eos;
  // The sampler reports the sampled token's log-probability only with at least one alternative.
  g.top_logprobs = req.logprobs ? std::max(req.top_logprobs, 1) : 0;
  g.n_ctx = static_cast<int32_t>(n_ctx);
  g.transport = Transport::kHttp;

  CompletionCall::Setup setup;
  setup.kind = kind;
  setup.stream = req.stream;
  setup.include_usage = req.stream && req.include_usage;
  setup.logprobs = req.logprobs;
  setup.top_logprobs = req.top_logprobs;
  setup.echo = std::move(echo);
  setup.id = new_response_id(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
  setup.created = unix_now();
  setup.model = a.model.id;
  setup.max_response_bytes = options_.max_response_bytes;
  auto call =
      std::make_shared<CompletionCall>(std::move(setup), *a.service, exchange, [this] { in_flight_.fetch_sub(1); });
  a.service->generate(std::move(g), call);
  call->begin();
}

}  // namespace kestrel::daemon::http
