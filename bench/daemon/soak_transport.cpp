// SoakTransport over libkestrel-client: gRPC (unix://) and the shm fast path (shm://) (soak_transport.h).
#include "bench/daemon/soak_transport.h"

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

}  // namespace

Expected<std::unique_ptr<SoakTransport>> make_soak_transport(const std::string& uri, const SoakWork& work) {
  client::ClientOptions options;
  options.timeout = std::chrono::seconds(120);
  KESTREL_TRY_ASSIGN(auto c, client::Client::connect(uri, options));
  return std::unique_ptr<SoakTransport>(new KestrelClientTransport(std::move(c), work));
}

}  // namespace kestrel::bench
