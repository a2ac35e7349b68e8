// SoakTransport over libkestrel-client: gRPC (unix://) and the shm fast path (shm://); and over HTTP/1.1 to kestreld's
// OpenAI-compatible API (http://) (soak_transport.h).
#include "bench/daemon/soak_transport.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <utility>

#include "client/lib/client.h"

namespace kestrel::bench {

const char* soak_op_name(SoakOp op) {
  switch (op) {
    case SoakOp::kStep: return "step";
    case SoakOp::kGenerate: return "generate";
  }
  return "?";
}

namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;

// One session at a time: Steps feed back the token they sampled, Generates continue the sequence; the session is
// replaced when the next operation would not fit its context, or when a call failed.
class KestrelClientTransport final : public SoakTransport {
 public:
  KestrelClientTransport(std::unique_ptr<client::Client> client, SoakWork work)
      : client_(std::move(client)), work_(work) {}
  // Closes the session in use: a gRPC session outlives its connection (until its idle TTL), so the soak's count of
  // sessions left at the end would otherwise include every client's last one.
  ~KestrelClientTransport() override { close_session(); }

  std::string name() const override { return client_->transport() == "shm" ? "shm" : "grpc"; }
  std::vector<SoakOp> ops() const override { return {SoakOp::kStep, SoakOp::kGenerate}; }

  Status run(SoakOp op, std::mt19937_64& rng) override {
    const int64_t need = op == SoakOp::kStep ? work_.prompt_tokens : work_.generate_tokens + 1;
    if (session_ == 0 || n_past_ + need > work_.n_ctx) KESTREL_TRY(open_session());
    Status st = op == SoakOp::kStep ? step(rng) : generate(rng);
    if (!st) close_session();  // start over on a fresh session
    return st;
  }

 private:
  void close_session() {
    if (session_ == 0) return;
    v1::CloseSessionRequest close;
    close.set_session_id(session_);
    (void)client_->close_session(close);  // a session already gone is what we want
    session_ = 0;
  }

  Status open_session() {
    close_session();
    v1::CreateSessionRequest req;
    req.set_n_ctx(work_.n_ctx);
    KESTREL_TRY_ASSIGN(const v1::SessionInfo info, client_->create_session(req));
    session_ = info.session_id();
    n_past_ = 0;
    next_token_ = -1;
    return ok_status();
  }

  Status step(std::mt19937_64& rng) {
    v1::StepRequest req;
    req.set_session_id(session_);
    if (next_token_ < 0) {
      for (int i = 0; i < work_.prompt_tokens; ++i) req.add_tokens(static_cast<int32_t>(rng() % 1000) + 100);
    } else {
      req.add_tokens(next_token_);
    }
    req.mutable_sampling()->set_temperature(0.8f);
    KESTREL_TRY_ASSIGN(const v1::StepResponse resp, client_->step(req));
    n_past_ = resp.n_past();
    next_token_ = resp.token();
    return ok_status();
  }

  Status generate(std::mt19937_64& rng) {
    v1::GenerateRequest req;
    req.set_session_id(session_);
    // A Generate needs a prompt: the pending sampled token, or a fresh one.
    req.mutable_tokens()->add_ids(next_token_ >= 0 ? next_token_ : static_cast<int32_t>(rng() % 1000) + 100);
    req.set_max_tokens(work_.generate_tokens);
    req.set_ignore_eos(true);
    req.mutable_sampling()->set_temperature(0.8f);
    KESTREL_TRY_ASSIGN(const v1::GenerateChunk last,
                       client_->generate(req, [](const v1::GenerateChunk&) { return true; }));
    n_past_ = last.n_past();
    next_token_ = -1;  // the last generated token is pending in the session; the next Step starts a new prompt
    return ok_status();
  }

  std::unique_ptr<client::Client> client_;
  SoakWork work_;
  uint64_t session_ = 0;
  int64_t n_past_ = 0;
  int32_t next_token_ = -1;
};

// One kept-alive connection to kestreld's HTTP API. A step is a completion of one token (not streamed), a generate a
// streamed completion of generate_tokens; both send prompt_tokens random ids and end with a status check (a stream's
// errors arrive as an event, so its body must also end with [DONE] and hold no error event).
class HttpTransport final : public SoakTransport {
 public:
  static Expected<std::unique_ptr<SoakTransport>> connect(const std::string& host, const std::string& port,
                                                          const SoakWork& work) {
    std::unique_ptr<HttpTransport> t(new HttpTransport(work));
    t->host_ = host;
    t->port_ = port;
    KESTREL_TRY(t->open());
    return std::unique_ptr<SoakTransport>(std::move(t));
  }

  std::string name() const override { return "http"; }
  std::vector<SoakOp> ops() const override { return {SoakOp::kStep, SoakOp::kGenerate}; }

  Status run(SoakOp op, std::mt19937_64& rng) override {
    std::string prompt = "[";
    for (int i = 0; i < work_.prompt_tokens; ++i) {
      prompt += (i ? "," : "") + std::to_string(static_cast<int32_t>(rng() % 1000) + 100);
    }
    prompt += "]";
    const bool stream = op == SoakOp::kGenerate;
    const int max_tokens = stream ? work_.generate_tokens : 1;
    const std::string body = "{\"prompt\": " + prompt + ", \"max_tokens\": " + std::to_string(max_tokens) +
                             ", \"temperature\": 0.8, \"ignore_eos\": true" + (stream ? ", \"stream\": true}" : "}");
    Status st = post("/v1/completions", body, stream);
    if (!st) {
      // Start over on a fresh connection: the old one may be half-way through an answer.
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      stream_.close();
      (void)open();
    }
    return st;
  }

 private:
  using tcp = boost::asio::ip::tcp;
  explicit HttpTransport(SoakWork work) : stream_(ioc_), work_(work) {}

  Status open() {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    const auto results = resolver.resolve(host_, port_, ec);
    if (!ec) stream_.connect(results, ec);
    if (ec) return make_error(ErrorCode::kUnavailable, "http://" + host_ + ":" + port_ + ": " + ec.message());
    buffer_.clear();
    return ok_status();
  }

  Status post(const std::string& target, const std::string& body, bool stream) {
    bhttp::request<bhttp::string_body> req{bhttp::verb::post, target, 11};
    req.set(bhttp::field::host, host_);
    req.set(bhttp::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    beast::error_code ec;
    stream_.expires_after(std::chrono::seconds(120));
    bhttp::write(stream_, req, ec);
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(64 << 20);
    if (!ec) bhttp::read(stream_, buffer_, parser, ec);
    if (ec) return make_error(ErrorCode::kUnavailable, "HTTP " + target + ": " + ec.message());
    const auto& res = parser.get();
    if (res.result_int() != 200) {
      // 429: the daemon refused the request for want of a session or queue place (counted apart from errors).
      const ErrorCode code = res.result_int() == 429 ? ErrorCode::kResourceExhausted : ErrorCode::kInternal;
      return make_error(code, "HTTP " + std::to_string(res.result_int()) + ": " + res.body());
    }
    if (stream) {
      const std::string& b = res.body();
      if (b.find("data: {\"error\"") != std::string::npos) return make_error(ErrorCode::kInternal, "stream: " + b);
      if (b.size() < 14 || b.compare(b.size() - 14, 14, "data: [DONE]\n\n") != 0) {
        return make_error(ErrorCode::kInternal, "the stream did not end with [DONE]");
      }
    }
    return ok_status();
  }

  boost::asio::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  SoakWork work_;
  std::string host_, port_;
};

}  // namespace

Expected<std::unique_ptr<SoakTransport>> make_soak_transport(const std::string& uri, const SoakWork& work) {
  if (uri.rfind("http://", 0) == 0) {
    const std::string hostport = uri.substr(7);
    const size_t colon = hostport.rfind(':');
    if (colon == std::string::npos) return make_error(ErrorCode::kInvalidArgument, uri + ": no port");
    return HttpTransport::connect(hostport.substr(0, colon), hostport.substr(colon + 1), work);
  }
  client::ClientOptions options;
  options.timeout = std::chrono::seconds(120);
  KESTREL_TRY_ASSIGN(auto c, client::Client::connect(uri, options));
  return std::unique_ptr<SoakTransport>(new KestrelClientTransport(std::move(c), work));
}

}  // namespace kestrel::bench
