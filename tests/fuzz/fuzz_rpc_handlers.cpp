// Fuzz target for request validation (daemon/server/rpc_handlers.h): sequences of kestrel.v1 requests, as bytes off
// the wire, through RpcHandlers into a Service that checks everything RpcHandlers promises to have checked before it
// calls the Service (token ids in the vocabulary, a non-empty prompt, max_tokens > 0, stop strings and tokens within
// RpcLimits, top_logprobs in 0..20, sampling values that validate, session id 0 only for a temporary Generate, n_ctx
// only with it) and aborts when a request gets through without them.
//
// Input: records [op u8][length u16][payload], up to 32 per input; the op (mod 11) picks the RPC and the payload is
// parsed as its request message (bytes that do not parse are what both transports answer with INVALID_ARGUMENT).
// Sessions persist within one input, so a CreateSession can be followed by Steps on id 1, 2, ... Invariants beyond
// the Service's: every call answers exactly once, a failed call has a known status code and a message, and every
// string field of a response is valid UTF-8 (protobuf strings must be). Built as fuzz_rpc_handlers (libFuzzer) and
// fuzz_rpc_handlers_smoke.
#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tokenizer/utf8.h"
#include "daemon/server/rpc_handlers.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace kestrel;
using namespace kestrel::daemon;
using kestrel::fuzz::fuzz_check;

void check(bool ok, const char* what) { fuzz_check(ok, "fuzz_rpc_handlers", what); }

constexpr int32_t kVocab = 300;

bool valid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t n = utf8_sequence_length(s, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

void check_tokens(const std::vector<int32_t>& tokens) {
  for (const int32_t t : tokens) check(t >= 0 && t < kVocab, "token ids reach the Service inside the vocabulary");
}

void check_sampling(const SamplingOverrides& o) {
  SamplingParams p = o.apply_to(SamplingParams{});
  p.n_logprobs = 0;
  check(static_cast<bool>(p.validate()), "sampling overrides reach the Service valid");
}

// A Service that trusts nothing and answers synchronously: tokens are bytes, a step samples last + 1.
class StrictService final : public Service {
 public:
  ModelInfo model_info() const override {
    ModelInfo m;
    m.architecture = "fuzz";
    m.name = "strict\xFF";  // not UTF-8: GetModelInfo must clean it
    m.n_vocab = kVocab;
    m.max_session_ctx = 64;
    m.eos_token_ids = {0};
    return m;
  }
  ServiceStats stats() const override {
    ServiceStats s;
    s.serving = true;
    s.sessions = static_cast<uint32_t>(sessions_.size());
    return s;
  }
  ServiceLimits limits() const override { return ServiceLimits{}; }
  const ServiceMetrics& metrics() const override { return metrics_; }

  Expected<std::vector<int32_t>> tokenize(const std::string& text, bool /*parse_special*/) const override {
    std::vector<int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  Expected<std::string> detokenize(const std::vector<int32_t>& tokens, size_t max_bytes) const override {
    check_tokens(tokens);
    if (tokens.size() > max_bytes) return make_error(ErrorCode::kResourceExhausted, "over max_bytes");
    std::string s;
    for (const int32_t t : tokens) s.push_back(static_cast<char>(t));
    return s;
  }
  Expected<SessionInfo> create_session(const SessionOptions& o) override {
    check(o.n_ctx >= 0, "n_ctx reaches the Service non-negative");
    check_sampling(o.sampling);
    if (sessions_.size() >= 8) return make_error(ErrorCode::kResourceExhausted, "8 sessions are open");
    const SessionId id = next_id_++;
    sessions_[id] = 0;
    return SessionInfo{id, o.n_ctx == 0 ? 64 : o.n_ctx, 0};
  }
  Expected<SessionInfo> clone_session(SessionId id, uint64_t /*owner*/) override {
    KESTREL_TRY(find(id));
    return create_session(SessionOptions{});
  }
  Expected<SessionInfo> reset_session(SessionId id) override {
    KESTREL_TRY(find(id));
    sessions_[id] = 0;
    return SessionInfo{id, 64, 0};
  }
  Status close_session(SessionId id) override {
    KESTREL_TRY(find(id));
    sessions_.erase(id);
    return ok_status();
  }
  uint32_t close_owned_by(uint64_t /*owner*/) override { return 0; }
  Expected<bool> abort(SessionId id) override {
    KESTREL_TRY(find(id));
    return false;
  }
  void drain(Clock::time_point /*deadline*/) override {}

  void step(StepRequest r, std::function<void(Expected<StepResult>)> done) override {
    check(!r.tokens.empty(), "a Step reaches the Service with tokens");
    check_tokens(r.tokens);
    check(r.top_logprobs >= 0 && r.top_logprobs <= SamplingParams::kMaxLogprobs, "top_logprobs in range");
    check_sampling(r.sampling);
    if (Status s = find(r.session); !s) return done(s.error());
    StepResult out;
    out.token = (r.tokens.back() + 1) % kVocab;
    out.top.resize(static_cast<size_t>(r.top_logprobs), TokenLogprob{1, -1.0f});
    done(std::move(out));
  }

  void generate(GenerateRequest r, std::shared_ptr<GenerateSink> sink) override {
    check(!r.prompt.empty(), "a prompt reaches the Service non-empty");
    check_tokens(r.prompt);
    check_tokens(r.stop_tokens);
    check(r.max_tokens > 0, "max_tokens > 0");
    check(r.n_ctx >= 0 && (r.n_ctx == 0 || r.session == 0), "n_ctx only for a temporary session");
    check(r.stop_tokens.size() <= 64 && r.stop_strings.size() <= 16, "stop lists within RpcLimits");
    for (const std::string& s : r.stop_strings) check(!s.empty() && s.size() <= 256, "stop strings within RpcLimits");
    check(r.top_logprobs >= 0 && r.top_logprobs <= SamplingParams::kMaxLogprobs, "top_logprobs in range");
    check_sampling(r.sampling);
    if (r.session != 0) {
      if (Status s = find(r.session); !s) return sink->on_done(s.error());
    }
    // A chunk whose text is raw prompt bytes (perhaps not UTF-8: the transport must clean it), then the summary.
    GenerateChunk c;
    c.tokens = {r.prompt.front()};
    for (const int32_t t : r.prompt) c.text.push_back(static_cast<char>(t));
    sink->on_chunk(std::move(c));
    GenerateSummary sum;
    sum.reason = r.prompt.size() % 2 == 0 ? FinishReason::kMaxTokens : FinishReason::kShutdown;
    sum.message = sum.reason == FinishReason::kShutdown ? "stopping\xC3" : "";
    sum.prompt_tokens = static_cast<uint32_t>(r.prompt.size());
    sink->on_done(sum);
  }

 private:
  Status find(SessionId id) const {
    check(id != 0, "session id 0 never reaches the Service");
    if (!sessions_.contains(id)) return make_error(ErrorCode::kNotFound, "no session " + std::to_string(id));
    return ok_status();
  }
  std::map<SessionId, int> sessions_;
  SessionId next_id_ = 1;
  ServiceMetrics metrics_;
};

void check_status(const RpcStatus& s) {
  check(s.code >= 0 && s.code <= 16, "status codes are gRPC's");
  if (!s.ok()) check(!s.message.empty(), "a failed call says why");
}

class Stream final : public RpcHandlers::GenerateStream {
 public:
  void on_chunk(v1::GenerateChunk chunk) override {
    check(!done_, "no chunk after the end");
    check(valid_utf8(chunk.text()), "chunk text is UTF-8");
  }
  void on_done(RpcStatus status, v1::GenerateChunk last) override {
    check(!done_, "a stream ends once");
    done_ = true;
    check_status(status);
    check(valid_utf8(last.finish_message()), "finish_message is UTF-8");
    if (status.ok()) check(last.finish_reason() != v1::FINISH_REASON_UNSPECIFIED, "the last chunk has a reason");
  }
  bool cancelled() const override { return false; }
  bool done() const { return done_; }

 private:
  bool done_ = false;
};

template <class Request>
bool parse(std::string_view payload, Request* r) {
  return r->ParseFromArray(payload.data(), static_cast<int>(payload.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  // Protobuf logs an ERROR for every string field that is not UTF-8 as parsing fails; here that is most inputs.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  StrictService service;
  RpcLimits limits;
  limits.max_response_bytes = 4096;
  RpcHandlers handlers(service, limits);
  fuzz::FuzzInput in(bytes, size);
  for (int call = 0; call < 32 && !in.empty(); ++call) {
    const int op = in.u8() % 11;
    const std::string_view payload = in.bytes(in.u16());
    switch (op) {
      case 0: {
        v1::GetModelInfoRequest r;
        v1::ModelInfo out;
        if (!parse(payload, &r)) break;
        check_status(handlers.get_model_info(r, &out));
        check(valid_utf8(out.name()) && valid_utf8(out.model_path()), "model info strings are UTF-8");
        break;
      }
      case 1: {
        v1::GetServerStatusRequest r;
        v1::ServerStatus out;
        if (parse(payload, &r)) check_status(handlers.get_server_status(r, &out));
        break;
      }
      case 2: {
        v1::TokenizeRequest r;
        v1::TokenizeResponse out;
        if (!parse(payload, &r)) break;
        const RpcStatus s = handlers.tokenize(r, &out, payload.size() % 2 == 0 ? SIZE_MAX : 512);
        check_status(s);
        check(out.ByteSizeLong() <= 4096, "a Tokenize response stays within the response limit");
        break;
      }
      case 3: {
        v1::DetokenizeRequest r;
        v1::DetokenizeResponse out;
        if (!parse(payload, &r)) break;
        const RpcStatus s = handlers.detokenize(r, &out, payload.size() % 2 == 0 ? SIZE_MAX : 512);
        check_status(s);
        check(valid_utf8(out.text()), "detokenized text is UTF-8");
        check(out.ByteSizeLong() <= 4096, "a Detokenize response stays within the response limit");
        break;
      }
      case 4: {
        v1::CreateSessionRequest r;
        v1::SessionInfo out;
        if (parse(payload, &r)) check_status(handlers.create_session(r, 0, &out));
        break;
      }
      case 5: {
        v1::CloneSessionRequest r;
        v1::SessionInfo out;
        if (parse(payload, &r)) check_status(handlers.clone_session(r, 0, &out));
        break;
      }
      case 6: {
        v1::ResetSessionRequest r;
        v1::SessionInfo out;
        if (parse(payload, &r)) check_status(handlers.reset_session(r, &out));
        break;
      }
      case 7: {
        v1::CloseSessionRequest r;
        v1::CloseSessionResponse out;
        if (parse(payload, &r)) check_status(handlers.close_session(r, &out));
        break;
      }
      case 8: {
        v1::AbortRequest r;
        v1::AbortResponse out;
        if (parse(payload, &r)) check_status(handlers.abort(r, &out));
        break;
      }
      case 9: {
        v1::StepRequest r;
        if (!parse(payload, &r)) break;
        int answers = 0;
        handlers.step(r, std::nullopt, [&answers](RpcStatus s, const v1::StepResponse& resp) {
          ++answers;
          check_status(s);
          if (s.ok()) check(resp.top_logprobs_size() <= SamplingParams::kMaxLogprobs, "top_logprobs bounded");
        });
        check(answers == 1, "a Step is answered exactly once");
        break;
      }
      case 10: {
        v1::GenerateRequest r;
        if (!parse(payload, &r)) break;
        auto stream = std::make_shared<Stream>();
        handlers.generate(r, std::nullopt, 0, stream);
        check(stream->done(), "a Generate ends");
        break;
      }
    }
  }
  return 0;
}
