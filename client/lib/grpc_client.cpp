// The gRPC transport of libkestrel-client: kestrel::client::Client over a grpc::Channel to kestreld (a Unix socket or
// TCP). One stub shared by every call (gRPC stubs are thread-safe); each call gets its own ClientContext with the
// ClientOptions::timeout as its deadline. Failed calls become kestrel::Error with the code from error_code_from_grpc
// and the message "<STATUS_NAME>: <the daemon's message>".
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "client/lib/client.h"
#include "client/lib/transports.h"
#include "kestrel/v1/kestrel.grpc.pb.h"
#include "proto/kestrel/grpc_codes.h"

namespace kestrel::client {
namespace {

// Responses can be larger than requests (Detokenize returns text and raw bytes); the daemon is trusted.
constexpr int kMaxReceiveBytes = 64 * 1024 * 1024;

Error error_from(const grpc::Status& status) {
  return make_error(
      error_code_from_grpc(static_cast<int>(status.error_code())),
      std::string(grpc_code::name(static_cast<int>(status.error_code()))) + ": " + status.error_message());
}

class GrpcClient final : public Client {
 public:
  GrpcClient(std::shared_ptr<grpc::Channel> channel, std::string transport, const ClientOptions& options)
      : channel_(std::move(channel)),
        stub_(v1::Kestrel::NewStub(channel_)),
        transport_(std::move(transport)),
        options_(options) {}

  std::string transport() const override { return transport_; }

  Expected<v1::ModelInfo> model_info() override {
    return unary(&v1::Kestrel::Stub::GetModelInfo, v1::GetModelInfoRequest{});
  }
  Expected<v1::ServerStatus> server_status() override {
    return unary(&v1::Kestrel::Stub::GetServerStatus, v1::GetServerStatusRequest{});
  }
  Expected<v1::TokenizeResponse> tokenize(const v1::TokenizeRequest& request) override {
    return unary(&v1::Kestrel::Stub::Tokenize, request);
  }
  Expected<v1::DetokenizeResponse> detokenize(const v1::DetokenizeRequest& request) override {
    return unary(&v1::Kestrel::Stub::Detokenize, request);
  }
  Expected<v1::SessionInfo> create_session(const v1::CreateSessionRequest& request) override {
    return unary(&v1::Kestrel::Stub::CreateSession, request);
  }
  Expected<v1::SessionInfo> clone_session(const v1::CloneSessionRequest& request) override {
    return unary(&v1::Kestrel::Stub::CloneSession, request);
  }
  Expected<v1::SessionInfo> reset_session(const v1::ResetSessionRequest& request) override {
    return unary(&v1::Kestrel::Stub::ResetSession, request);
  }
  Status close_session(const v1::CloseSessionRequest& request) override {
    Expected<v1::CloseSessionResponse> r = unary(&v1::Kestrel::Stub::CloseSession, request);
    if (!r) return std::move(r).error();
    return ok_status();
  }
  Expected<v1::StepResponse> step(const v1::StepRequest& request) override {
    return unary(&v1::Kestrel::Stub::Step, request);
  }
  Expected<v1::AbortResponse> abort(const v1::AbortRequest& request) override {
    return unary(&v1::Kestrel::Stub::Abort, request);
  }

  Expected<v1::GenerateChunk> generate(const v1::GenerateRequest& request,
                                       const std::function<bool(const v1::GenerateChunk&)>& on_chunk) override {
    grpc::ClientContext ctx;
    set_deadline(ctx);
    std::unique_ptr<grpc::ClientReader<v1::GenerateChunk>> reader = stub_->Generate(&ctx, request);
    v1::GenerateChunk chunk;
    v1::GenerateChunk last;
    bool have_last = false;
    bool stopped_by_caller = false;
    while (reader->Read(&chunk)) {
      const bool is_last = chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
      const bool go_on = on_chunk(chunk);
      if (is_last) {
        last = std::move(chunk);
        have_last = true;
      }
      if (!go_on && !is_last) {
        // The caller wants no more: cancel the call so that the daemon stops generating for it.
        ctx.TryCancel();
        stopped_by_caller = true;
        while (reader->Read(&chunk)) {
        }
        break;
      }
    }
    const grpc::Status status = reader->Finish();
    if (stopped_by_caller) {
      return make_error(ErrorCode::kCancelled, "CANCELLED: generation stopped by the caller");
    }
    if (!status.ok()) return error_from(status);
    if (!have_last) {
      return make_error(ErrorCode::kInternal, "INTERNAL: the Generate stream ended without a final chunk");
    }
    return last;
  }

  // Waits up to `timeout` for the channel to connect.
  Status wait_connected(std::chrono::milliseconds timeout, const std::string& target) {
    if (channel_->WaitForConnected(std::chrono::system_clock::now() + timeout)) return ok_status();
    return make_error(ErrorCode::kUnavailable,
                      "could not connect to " + target + " within " + std::to_string(timeout.count()) + " ms");
  }

 private:
  template <class Request, class Response>
  using Method = grpc::Status (v1::Kestrel::Stub::*)(grpc::ClientContext*, const Request&, Response*);

  template <class Request, class Response>
  Expected<Response> unary(Method<Request, Response> method, const Request& request) {
    grpc::ClientContext ctx;
    set_deadline(ctx);
    Response response;
    const grpc::Status status = (stub_.get()->*method)(&ctx, request, &response);
    if (!status.ok()) return error_from(status);
    return response;
  }

  void set_deadline(grpc::ClientContext& ctx) const {
    if (options_.timeout.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Kestrel::Stub> stub_;
  std::string transport_;
  ClientOptions options_;
};

}  // namespace

Expected<std::unique_ptr<Client>> make_grpc_client(const std::string& target, const std::string& transport_name,
                                                   const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!channel) return make_error(ErrorCode::kInvalidArgument, "'" + target + "' is not a usable gRPC target");
  auto client = std::make_unique<GrpcClient>(std::move(channel), transport_name, options);
  KESTREL_TRY(client->wait_connected(options.connect_timeout, target));
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace kestrel::client
