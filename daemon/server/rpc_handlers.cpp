// RpcHandlers: kestrel.v1 ⇄ Service conversion and request validation for both transports (rpc_handlers.h).
#include "daemon/server/rpc_handlers.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/sampler/sampling_params.h"
#include "core/tokenizer/utf8.h"

namespace kestrel::daemon {
namespace {

RpcStatus invalid(std::string message) { return RpcStatus{rpc_code::kInvalidArgument, std::move(message)}; }

// Bytes of a protobuf varint holding v.
size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Bytes of a length-delimited field (string, bytes, packed repeated) with a one-byte tag and `payload` bytes.
size_t length_delimited_size(size_t payload) { return 1 + varint_size(payload) + payload; }

SamplingOverrides overrides_from(const v1::SamplingParams& p) {
  SamplingOverrides o;
  if (p.has_temperature()) o.temperature = p.temperature();
  if (p.has_top_k()) o.top_k = p.top_k();
  if (p.has_top_p()) o.top_p = p.top_p();
  if (p.has_min_p()) o.min_p = p.min_p();
  if (p.has_repetition_penalty()) o.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) o.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) o.frequency_penalty = p.frequency_penalty();
  if (p.has_penalty_last_n()) o.penalty_last_n = p.penalty_last_n();
  if (p.has_seed()) o.seed = p.seed();
  return o;
}

// Checks the set fields on their own: they are applied to the server's defaults, whose own values are valid, so a
// failure names a field the request set. (The Service validates again against the session's parameters.)
Status check_overrides(const SamplingOverrides& o, const SamplingParams& defaults) {
  SamplingParams p = o.apply_to(defaults);
  p.n_logprobs = 0;
  return p.validate();
}

Status check_top_logprobs(int32_t n) {
  if (n < 0 || n > SamplingParams::kMaxLogprobs) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "top_logprobs must be in [0, " + std::to_string(SamplingParams::kMaxLogprobs) + "], got " + std::to_string(n));
  }
  return ok_status();
}

Status check_session_id(uint64_t id) {
  if (id == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "session_id is 0, which is never a session; CreateSession returns the id to use");
  }
  return ok_status();
}

v1::FinishReason finish_to_v1(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStopToken: return v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kStopString: return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kMaxTokens: return v1::FINISH_REASON_MAX_TOKENS;
    case FinishReason::kContextFull: return v1::FINISH_REASON_CONTEXT_FULL;
    case FinishReason::kAborted: return v1::FINISH_REASON_ABORTED;
    case FinishReason::kShutdown: return v1::FINISH_REASON_SHUTDOWN;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void top_to_v1(const std::vector<TokenLogprob>& top, google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  out->Reserve(static_cast<int>(top.size()));
  for (const TokenLogprob& t : top) {
    v1::TokenLogprob* e = out->Add();
    e->set_token(t.id);
    e->set_logprob(t.logprob);
  }
}

void session_to_v1(const SessionInfo& s, v1::SessionInfo* out) {
  out->set_session_id(s.id);
  out->set_n_ctx(s.n_ctx);
  out->set_n_past(s.n_past);
}

v1::GenerateChunk chunk_to_v1(const GenerateChunk& c) {
  v1::GenerateChunk out;
  out.mutable_tokens()->Add(c.tokens.begin(), c.tokens.end());
  out.set_text(utf8_sanitize(c.text));  // the Service promises valid UTF-8; a bug there must not break the stream
  out.mutable_logprobs()->Reserve(static_cast<int>(c.logprobs.size()));
  for (const StepResult& s : c.logprobs) {
    v1::StepLogprobs* l = out.add_logprobs();
    l->set_logprob(s.logprob);
    top_to_v1(s.top, l->mutable_top());
  }
  out.set_session_id(c.session);
  out.set_n_past(c.n_past);
  return out;
}

// Adapts the transport's GenerateStream (v1 messages) to the Service's GenerateSink (daemon structs).
class StreamSink final : public GenerateSink {
 public:
  explicit StreamSink(std::shared_ptr<RpcHandlers::GenerateStream> stream) : stream_(std::move(stream)) {}

  void on_chunk(GenerateChunk chunk) override { stream_->on_chunk(chunk_to_v1(chunk)); }

  void on_done(Expected<GenerateSummary> result) override {
    if (!result) {
      stream_->on_done(to_rpc_status(result.error()), v1::GenerateChunk{});
      return;
    }
    v1::GenerateChunk last;
    last.set_finish_reason(finish_to_v1(result->reason));
    last.set_session_id(result->session);
    last.set_n_past(result->n_past);
    last.set_prompt_tokens(result->prompt_tokens);
    last.set_completion_tokens(result->completion_tokens);
    last.set_finish_message(utf8_sanitize(result->message));
    stream_->on_done(RpcStatus{}, std::move(last));
  }

  bool cancelled() const override { return stream_->cancelled(); }

 private:
  std::shared_ptr<RpcHandlers::GenerateStream> stream_;
};

}  // namespace

RpcStatus to_rpc_status(const Error& error) {
  int code = rpc_code::kInternal;
  switch (error.code) {
    case ErrorCode::kInvalidArgument: code = rpc_code::kInvalidArgument; break;
    case ErrorCode::kNotFound: code = rpc_code::kNotFound; break;
    case ErrorCode::kOutOfRange: code = rpc_code::kOutOfRange; break;
    case ErrorCode::kDataLoss: code = rpc_code::kDataLoss; break;
    case ErrorCode::kUnsupported: code = rpc_code::kUnimplemented; break;
    case ErrorCode::kIo: code = rpc_code::kInternal; break;
    case ErrorCode::kResourceExhausted: code = rpc_code::kResourceExhausted; break;
    case ErrorCode::kFailedPrecondition: code = rpc_code::kFailedPrecondition; break;
    case ErrorCode::kCancelled: code = rpc_code::kCancelled; break;
    case ErrorCode::kDeadlineExceeded: code = rpc_code::kDeadlineExceeded; break;
    case ErrorCode::kUnavailable: code = rpc_code::kUnavailable; break;
    case ErrorCode::kInternal: code = rpc_code::kInternal; break;
  }
  return RpcStatus{code, error.message};
}

size_t utf8_sanitized_size(std::string_view bytes) {
  size_t size = 0;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t len = utf8_sequence_length(bytes, pos);
    size += len == 0 ? 3 : len;  // U+FFFD is 3 bytes
    pos += len == 0 ? 1 : len;
  }
  return size;
}

std::string utf8_sanitize(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t len = utf8_sequence_length(bytes, pos);
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++pos;
    } else {
      out.append(bytes.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

RpcHandlers::RpcHandlers(Service& service, RpcLimits limits, ServerIdentity identity)
    : RpcHandlers(limits, std::move(identity)) {
  attach(service);
}

RpcHandlers::RpcHandlers(RpcLimits limits, ServerIdentity identity) : limits_(limits), identity_(std::move(identity)) {}

void RpcHandlers::attach(Service& service) {
  if (attached_owner_ != nullptr) return;  // once
  attached_owner_ = std::make_unique<Attached>(Attached{&service, service.model_info(), service.limits()});
  attached_.store(attached_owner_.get(), std::memory_order_release);
}

namespace {
RpcStatus loading_status() {
  return RpcStatus{rpc_code::kUnavailable,
                   "kestreld is still loading its model; retry when grpc.health.v1 reports SERVING"};
}
}  // namespace

Status RpcHandlers::check_tokens(const Attached& a, const google::protobuf::RepeatedField<int32_t>& tokens,
                                 const char* field) {
  for (int i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens.Get(i);
    if (t < 0 || (a.model.n_vocab > 0 && t >= a.model.n_vocab)) {
      return make_error(ErrorCode::kInvalidArgument,
                        std::string(field) + ": token id " + std::to_string(t) + " at index " + std::to_string(i) +
                            " is outside the vocabulary [0, " + std::to_string(a.model.n_vocab) + ")");
    }
  }
  return ok_status();
}

RpcStatus RpcHandlers::get_model_info(const v1::GetModelInfoRequest& /*request*/, v1::ModelInfo* out) const {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  const ModelInfo& m = a->model;
  out->set_architecture(m.architecture);
  out->set_name(utf8_sanitize(m.name));
  out->set_n_vocab(m.n_vocab);
  out->set_n_ctx_train(m.n_ctx_train);
  out->set_max_session_ctx(m.max_session_ctx);
  out->mutable_eos_token_ids()->Add(m.eos_token_ids.begin(), m.eos_token_ids.end());
  out->set_bos_token_id(m.bos_token_id);
  out->set_n_layer(m.n_layer);
  out->set_n_embd(m.n_embd);
  out->set_n_expert(m.n_expert);
  out->set_n_expert_used(m.n_expert_used);
  out->set_engine(m.engine);
  out->set_device(m.device);
  for (const PlacementEntry& p : m.placement) {
    v1::PlacementEntry* e = out->add_placement();
    e->set_component(p.component);
    e->set_device(p.device);
    e->set_bytes(p.bytes);
  }
  out->set_placement_summary(m.placement_summary);
  out->set_file_bytes(m.file_bytes);
  out->set_model_path(utf8_sanitize(m.model_path));
  out->set_chat_template(utf8_sanitize(m.chat_template));
  return {};
}

RpcStatus RpcHandlers::get_server_status(const v1::GetServerStatusRequest& /*request*/, v1::ServerStatus* out) const {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  const ServiceStats s = a->service->stats();
  out->set_version(identity_.version);
  out->set_serving(s.serving);
  out->set_sessions(s.sessions);
  out->set_max_sessions(a->limits.max_sessions);
  out->set_queued_steps(s.queued_steps);
  out->set_max_queued_steps(a->limits.max_queued_steps);
  out->set_ticks(s.ticks);
  out->set_tokens_processed(s.tokens_processed);
  out->set_tokens_generated(s.tokens_generated);
  out->set_uptime_s(std::chrono::duration<double>(Clock::now() - identity_.started).count());
  out->set_shm_clients(shm_clients_.load(std::memory_order_relaxed));
  out->set_kv_cache_tokens(static_cast<uint64_t>(s.cache.tokens_total));
  out->set_kv_cache_tokens_held(static_cast<uint64_t>(s.cache.tokens_held));
  out->set_kv_cache_bytes(s.cache.bytes);
  return {};
}

RpcStatus RpcHandlers::response_too_large(const char* call, const std::string& what, size_t transport_max_bytes) const {
  std::string message = std::string(call) + ": " + what + ", over the limit of ";
  if (transport_max_bytes < limits_.max_response_bytes) {
    message += std::to_string(transport_max_bytes) + " bytes per message on this transport (gRPC allows " +
               std::to_string(limits_.max_response_bytes) + ")";
  } else {
    message += std::to_string(limits_.max_response_bytes) + " bytes per response";
  }
  return RpcStatus{rpc_code::kResourceExhausted, std::move(message) + "; split the request"};
}

RpcStatus RpcHandlers::tokenize(const v1::TokenizeRequest& request, v1::TokenizeResponse* out,
                                size_t transport_max_bytes) const {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  const size_t limit = std::min(limits_.max_response_bytes, transport_max_bytes);
  Expected<std::vector<int32_t>> tokens = a->service->tokenize(request.text(), request.parse_special());
  if (!tokens) return to_rpc_status(tokens.error());
  // The ids are at most one per byte of the text (bounded by the request); the response is sized before it is
  // built: field tag, length, one varint per id.
  size_t payload = 0;
  for (const int32_t t : *tokens) payload += varint_size(static_cast<uint32_t>(t));
  const size_t bytes = length_delimited_size(payload);
  if (bytes > limit) {
    return response_too_large(
        "Tokenize", "the " + std::to_string(tokens->size()) + " tokens would take " + std::to_string(bytes) + " bytes",
        transport_max_bytes);
  }
  out->mutable_tokens()->Add(tokens->begin(), tokens->end());
  return {};
}

RpcStatus RpcHandlers::detokenize(const v1::DetokenizeRequest& request, v1::DetokenizeResponse* out,
                                  size_t transport_max_bytes) const {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  if (Status s = check_tokens(*a, request.tokens(), "tokens"); !s) return to_rpc_status(s.error());
  const size_t limit = std::min(limits_.max_response_bytes, transport_max_bytes);
  const std::vector<int32_t> ids(request.tokens().begin(), request.tokens().end());
  // The response holds the bytes twice (text is at least as long as raw), so raw may take at most half of it; the
  // Service checks the tokens' piece lengths against that before it builds anything.
  Expected<std::string> raw = a->service->detokenize(ids, limit / 2);
  if (!raw) {
    if (raw.error().code != ErrorCode::kResourceExhausted) return to_rpc_status(raw.error());
    return response_too_large("Detokenize", raw.error().message + " (the response carries them as text and raw)",
                              transport_max_bytes);
  }
  const size_t text_bytes = utf8_sanitized_size(*raw);
  const size_t bytes = length_delimited_size(text_bytes) + length_delimited_size(raw->size());
  if (bytes > limit) {
    return response_too_large("Detokenize",
                              "the response would be " + std::to_string(bytes) + " bytes (" +
                                  std::to_string(text_bytes) + " of text, " + std::to_string(raw->size()) + " raw)",
                              transport_max_bytes);
  }
  out->set_text(utf8_sanitize(*raw));
  out->set_raw(std::move(raw).value());
  return {};
}

RpcStatus RpcHandlers::create_session(const v1::CreateSessionRequest& request, uint64_t owner, v1::SessionInfo* out) {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  if (request.n_ctx() < 0) {
    return invalid("n_ctx must be >= 0 (0 = the daemon's default), got " + std::to_string(request.n_ctx()));
  }
  SessionOptions options;
  options.n_ctx = request.n_ctx();
  options.sampling = overrides_from(request.sampling());
  if (Status s = check_overrides(options.sampling, a->limits.default_sampling); !s) {
    return to_rpc_status(s.error());
  }
  options.idle_ttl = std::chrono::seconds(request.idle_ttl_s());
  options.owner = owner;
  Expected<SessionInfo> info = a->service->create_session(options);
  if (!info) return to_rpc_status(info.error());
  session_to_v1(*info, out);
  return {};
}

RpcStatus RpcHandlers::clone_session(const v1::CloneSessionRequest& request, uint64_t owner, v1::SessionInfo* out) {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  if (Status s = check_session_id(request.session_id()); !s) return to_rpc_status(s.error());
  Expected<SessionInfo> info = a->service->clone_session(request.session_id(), owner);
  if (!info) return to_rpc_status(info.error());
  session_to_v1(*info, out);
  return {};
}

RpcStatus RpcHandlers::reset_session(const v1::ResetSessionRequest& request, v1::SessionInfo* out) {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  if (Status s = check_session_id(request.session_id()); !s) return to_rpc_status(s.error());
  Expected<SessionInfo> info = a->service->reset_session(request.session_id());
  if (!info) return to_rpc_status(info.error());
  session_to_v1(*info, out);
  return {};
}

RpcStatus RpcHandlers::close_session(const v1::CloseSessionRequest& request, v1::CloseSessionResponse* /*out*/) {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  if (Status s = check_session_id(request.session_id()); !s) return to_rpc_status(s.error());
  if (Status s = a->service->close_session(request.session_id()); !s) return to_rpc_status(s.error());
  return {};
}

RpcStatus RpcHandlers::abort(const v1::AbortRequest& request, v1::AbortResponse* out) {
  const Attached* a = ready();
  if (a == nullptr) return loading_status();
  if (Status s = check_session_id(request.session_id()); !s) return to_rpc_status(s.error());
  Expected<bool> aborted = a->service->abort(request.session_id());
  if (!aborted) return to_rpc_status(aborted.error());
  out->set_aborted(*aborted);
  return {};
}

void RpcHandlers::step(const v1::StepRequest& request, Deadline deadline, StepDone done, Transport transport) {
  auto refuse = [&](const Error& e) { done(to_rpc_status(e), v1::StepResponse{}); };
  const Attached* a = ready();
  if (a == nullptr) return done(loading_status(), v1::StepResponse{});
  if (Status s = check_session_id(request.session_id()); !s) return refuse(s.error());
  if (request.tokens().empty()) {
    return refuse(make_error(ErrorCode::kInvalidArgument,
                             "tokens is empty; Step appends at least one token (the previous step's sampled token "
                             "is not appended for you)"));
  }
  if (Status s = check_tokens(*a, request.tokens(), "tokens"); !s) return refuse(s.error());
  if (Status s = check_top_logprobs(request.top_logprobs()); !s) return refuse(s.error());
  StepRequest req;
  req.session = request.session_id();
  req.tokens.assign(request.tokens().begin(), request.tokens().end());
  req.sampling = overrides_from(request.sampling());
  if (Status s = check_overrides(req.sampling, a->limits.default_sampling); !s) return refuse(s.error());
  req.top_logprobs = request.top_logprobs();
  req.deadline = deadline;
  req.transport = transport;
  a->service->step(std::move(req), [done = std::move(done)](Expected<StepResult> result) {
    if (!result) {
      done(to_rpc_status(result.error()), v1::StepResponse{});
      return;
    }
    v1::StepResponse response;
    response.set_token(result->token);
    response.set_logprob(result->logprob);
    top_to_v1(result->top, response.mutable_top_logprobs());
    response.set_n_past(result->n_past);
    done(RpcStatus{}, std::move(response));
  });
}

void RpcHandlers::generate(const v1::GenerateRequest& request, Deadline deadline, uint64_t owner,
                           std::shared_ptr<GenerateStream> stream, Transport transport) {
  auto refuse = [&](const Error& e) { stream->on_done(to_rpc_status(e), v1::GenerateChunk{}); };
  auto bad = [&](std::string message) { refuse(make_error(ErrorCode::kInvalidArgument, std::move(message))); };
  const Attached* a = ready();
  if (a == nullptr) return stream->on_done(loading_status(), v1::GenerateChunk{});

  GenerateRequest req;
  req.session = request.session_id();
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return bad("prompt text is empty; send at least one character or token");
      Expected<std::vector<int32_t>> tokens = a->service->tokenize(request.text(), request.parse_special());
      if (!tokens) return refuse(tokens.error());
      req.prompt = std::move(tokens).value();
      break;
    }
    case v1::GenerateRequest::kTokens:
      if (request.tokens().ids().empty()) return bad("prompt tokens is empty; send at least one token");
      if (Status s = check_tokens(*a, request.tokens().ids(), "prompt tokens"); !s) return refuse(s.error());
      req.prompt.assign(request.tokens().ids().begin(), request.tokens().ids().end());
      break;
    case v1::GenerateRequest::PROMPT_NOT_SET: return bad("the request has no prompt; set text or tokens");
  }
  if (req.prompt.empty()) return bad("the prompt tokenized to no tokens");
  if (request.max_tokens() <= 0) {
    return bad("max_tokens must be > 0, got " + std::to_string(request.max_tokens()));
  }
  req.max_tokens = request.max_tokens();
  if (request.n_ctx() < 0) {
    return bad("n_ctx must be >= 0 (0 = the daemon's default), got " + std::to_string(request.n_ctx()));
  }
  if (request.n_ctx() != 0 && request.session_id() != 0) {
    return bad("n_ctx applies to a temporary session (session_id 0) only; session " +
               std::to_string(request.session_id()) + " keeps the n_ctx it was created with");
  }
  req.n_ctx = request.n_ctx();
  if (request.stop_tokens_size() > limits_.max_stop_tokens) {
    return bad("at most " + std::to_string(limits_.max_stop_tokens) + " stop_tokens are allowed, got " +
               std::to_string(request.stop_tokens_size()));
  }
  if (Status s = check_tokens(*a, request.stop_tokens(), "stop_tokens"); !s) return refuse(s.error());
  req.stop_tokens.assign(request.stop_tokens().begin(), request.stop_tokens().end());
  if (request.stop_strings_size() > limits_.max_stop_strings) {
    return bad("at most " + std::to_string(limits_.max_stop_strings) + " stop_strings are allowed, got " +
               std::to_string(request.stop_strings_size()));
  }
  for (int i = 0; i < request.stop_strings_size(); ++i) {
    const std::string& s = request.stop_strings(i);
    if (s.empty()) return bad("stop_strings[" + std::to_string(i) + "] is empty");
    if (std::ssize(s) > limits_.max_stop_string_bytes) {
      return bad("stop_strings[" + std::to_string(i) + "] is " + std::to_string(s.size()) + " bytes; the limit is " +
                 std::to_string(limits_.max_stop_string_bytes));
    }
    req.stop_strings.push_back(s);
  }
  if (Status s = check_top_logprobs(request.top_logprobs()); !s) return refuse(s.error());
  req.top_logprobs = request.top_logprobs();
  req.sampling = overrides_from(request.sampling());
  if (Status s = check_overrides(req.sampling, a->limits.default_sampling); !s) return refuse(s.error());
  req.ignore_eos = request.ignore_eos();
  req.deadline = deadline;
  req.owner = owner;
  req.transport = transport;
  a->service->generate(std::move(req), std::make_shared<StreamSink>(std::move(stream)));
}

}  // namespace kestrel::daemon
