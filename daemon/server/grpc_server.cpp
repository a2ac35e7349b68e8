// GrpcServer: listeners, health, and one callback reactor per kestrel.v1 call (grpc_server.h). Every method hands its
// request to RpcHandlers; what is here is gRPC plumbing: deadlines in, status codes out, and the Generate stream's
// write queue.
#include "daemon/server/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>

#include "kestrel/v1/kestrel.grpc.pb.h"

namespace kestrel::daemon {
namespace {

constexpr const char* kServiceName = "kestrel.v1.Kestrel";

// strerror without its shared buffer.
std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

grpc::Status to_grpc(const RpcStatus& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code), s.message);
}

// The call's deadline on the Service's clock; nullopt when the client set none (gRPC reports "infinite" as the
// largest time point).
Deadline deadline_of(const grpc::CallbackServerContext& ctx) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return std::nullopt;
  const auto now = std::chrono::system_clock::now();
  if (deadline - now > std::chrono::hours(24 * 365)) return std::nullopt;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(deadline - now);
}

void log_status(const char* method, const RpcStatus& s) {
  if (s.ok()) return;
  if (s.code == rpc_code::kInternal) {
    spdlog::error("grpc {}: {}: {}", method, rpc_code_name(s.code), s.message);
  } else {
    spdlog::debug("grpc {}: {}: {}", method, rpc_code_name(s.code), s.message);
  }
}

// Unary calls have a two-state machine, kept in the reactor gRPC provides (DefaultReactor):
//   received  - the request is parsed; the handler runs (quick calls) or queues it (Step) and returns at once;
//   finished  - Finish(status) was called, by the handler (quick calls, refused Steps) or on the engine thread (Step
//               results); gRPC then releases the call. A cancelled unary call still gets its Finish.
grpc::ServerUnaryReactor* finish_now(grpc::CallbackServerContext* ctx, const char* method, const RpcStatus& s) {
  log_status(method, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(to_grpc(s));
  return reactor;
}

// Requests arrive as raw bytes (GrpcService below): they are parsed here, so bytes that are not the method's message
// get INVALID_ARGUMENT and a message instead of the bare UNIMPLEMENTED grpc++'s generated handlers answer.
template <class Message>
bool parse_request(const grpc::ByteBuffer& bytes, Message* out) {
  grpc::ByteBuffer copy(bytes);  // Deserialize consumes its buffer; the copy shares the slices
  return grpc::SerializationTraits<Message>::Deserialize(&copy, out).ok();
}

RpcStatus unparsable(const google::protobuf::MessageLite& request) {
  return RpcStatus{rpc_code::kInvalidArgument, "the request does not parse as a " + request.GetTypeName() +
                                                   " (malformed protobuf bytes, or a string field that is not UTF-8)"};
}

// A response message into the raw reply; INTERNAL if protobuf cannot serialize it.
RpcStatus serialize_response(const google::protobuf::MessageLite& message, grpc::ByteBuffer* out) {
  bool own = false;
  const grpc::Status s = grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(message, out, &own);
  if (s.ok()) return {};
  return RpcStatus{rpc_code::kInternal, "cannot serialize the " + message.GetTypeName() + ": " + s.error_message()};
}

// A unary call: parse, run `call(request, &response)`, serialize, finish.
template <class Request, class Response, class Call>
grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* ctx, const char* method, const grpc::ByteBuffer* in,
                                grpc::ByteBuffer* out, Call call) {
  Request request;
  if (!parse_request(*in, &request)) return finish_now(ctx, method, unparsable(request));
  Response response;
  RpcStatus status = call(request, &response);
  if (status.ok()) status = serialize_response(response, out);
  return finish_now(ctx, method, status);
}

// One Generate call. The engine thread produces chunks (push/finish, never blocking); gRPC threads report write
// completions and cancellation. All transitions happen under mu_; StartWrite and Finish are called after the lock is
// released (gRPC may run a reaction inline).
class GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // The engine's side (RpcHandlers::GenerateStream); holds the call alive only through the state machine (the
  // reactor is deleted in OnDone, which gRPC calls only after Finish, which happens only after on_done).
  class Stream final : public RpcHandlers::GenerateStream {
   public:
    explicit Stream(GenerateCall* call) : call_(call), cancelled_(call->cancelled_) {}
    void on_chunk(v1::GenerateChunk chunk) override { call_->push(chunk); }
    void on_done(RpcStatus status, v1::GenerateChunk last) override { call_->finish(std::move(status), last); }
    // Reads a flag shared with the call, so that it stays safe even if polled after on_done.
    bool cancelled() const override { return cancelled_->load(std::memory_order_acquire); }

   private:
    GenerateCall* call_;
    std::shared_ptr<std::atomic<bool>> cancelled_;
  };

  void OnWriteDone(bool ok) override {
    Action action;
    {
      std::lock_guard lock(mu_);
      if (!ok) {
        // The peer is gone: nothing more can be written.
        cancelled_->store(true, std::memory_order_release);
        queue_.clear();
        if (state_ == State::kDraining) {
          state_ = State::kFinished;
          action.finish = true;
        } else {
          state_ = State::kCancelled;
        }
      } else if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        action.write = true;  // state unchanged: kWriting or kDraining, one write outstanding
      } else if (state_ == State::kDraining) {
        state_ = State::kFinished;
        action.finish = true;
      } else {
        state_ = State::kIdle;
      }
    }
    run(action);
  }

  void OnCancel() override {
    // Polled by the engine between ticks (Stream::cancelled); the outstanding write, if any, completes with !ok.
    cancelled_->store(true, std::memory_order_release);
    std::lock_guard lock(mu_);
    if (state_ == State::kIdle) state_ = State::kCancelled;
  }

  void OnDone() override { delete this; }

 private:
  // One Generate call's states:
  enum class State {
    kIdle,       // queued to or running in the engine; no write outstanding and nothing queued
    kWriting,    // one StartWrite outstanding; chunks pushed meanwhile wait in queue_ (the engine never waits)
    kDraining,   // the engine has finished: the queued chunks (the last one included) go out, then Finish(final_)
    kCancelled,  // the peer is gone (OnCancel or a failed write): chunks are dropped; the engine's on_done Finishes
    kFinished,   // Finish was called; gRPC calls OnDone, which deletes the reactor
  };

  struct Action {
    bool write = false;
    bool finish = false;
  };

  void push(const v1::GenerateChunk& message) {
    grpc::ByteBuffer chunk;
    if (RpcStatus s = serialize_response(message, &chunk); !s.ok()) {
      spdlog::error("grpc Generate: {} (chunk dropped)", s.message);
      return;
    }
    Action action;
    {
      std::lock_guard lock(mu_);
      switch (state_) {
        case State::kIdle:
          current_ = std::move(chunk);
          state_ = State::kWriting;
          action.write = true;
          break;
        case State::kWriting: queue_.push_back(std::move(chunk)); break;
        case State::kCancelled: break;  // dropped: nobody is listening
        case State::kDraining:
        case State::kFinished:
          spdlog::error("grpc Generate: a chunk arrived after the end of the stream (dropped)");
          break;
      }
    }
    run(action);
  }

  void finish(RpcStatus status, const v1::GenerateChunk& message) {
    grpc::ByteBuffer last;
    if (status.ok()) status = serialize_response(message, &last);
    log_status("Generate", status);
    Action action;
    {
      std::lock_guard lock(mu_);
      final_ = to_grpc(status);
      switch (state_) {
        case State::kIdle:
          if (status.ok()) {
            current_ = std::move(last);
            state_ = State::kDraining;
            action.write = true;
          } else {
            state_ = State::kFinished;
            action.finish = true;
          }
          break;
        case State::kWriting:
          if (status.ok()) queue_.push_back(std::move(last));
          state_ = State::kDraining;  // the chunks already queued still go out before the status
          break;
        case State::kCancelled:
          state_ = State::kFinished;
          action.finish = true;
          break;
        case State::kDraining:
        case State::kFinished: spdlog::error("grpc Generate: the engine finished the stream twice (ignored)"); break;
      }
    }
    run(action);
  }

  void run(const Action& action) {
    if (action.write) StartWrite(&current_);
    if (action.finish) Finish(final_);
  }

  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  std::mutex mu_;
  State state_ = State::kIdle;          // guarded by mu_
  grpc::ByteBuffer current_;            // the serialized chunk of the outstanding write; stable until OnWriteDone
  std::deque<grpc::ByteBuffer> queue_;  // guarded by mu_
  grpc::Status final_;                  // guarded by mu_; sent by Finish
};

// Checks that `path` can become our socket: removes a stale socket left by a dead daemon, refuses a live one and any
// file that is not a socket.
Status prepare_socket_path(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path[0] != '/') {
    return make_error(ErrorCode::kInvalidArgument, "unix socket path '" + path + "' must be absolute");
  }
  if (path.size() >= sizeof(addr.sun_path)) {
    return make_error(ErrorCode::kInvalidArgument, "unix socket path '" + path + "' is " + std::to_string(path.size()) +
                                                       " bytes; the limit is " +
                                                       std::to_string(sizeof(addr.sun_path) - 1));
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec)) {
    return make_error(ErrorCode::kUnavailable, "directory '" + parent.string() +
                                                   "' for the unix socket does not exist "
                                                   "(systemd's RuntimeDirectory=kestrel creates /run/kestrel)");
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return ok_status();
    return make_error(ErrorCode::kIo, "cannot stat '" + path + "': " + errno_text(errno));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'" + path + "' exists and is not a socket; refusing to replace it (choose another path)");
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(ErrorCode::kIo, std::string("socket(AF_UNIX): ") + errno_text(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int connect_errno = errno;
  close(fd);
  if (rc == 0) {
    return make_error(ErrorCode::kUnavailable,
                      "another process is listening on '" + path + "' (is kestreld already running?)");
  }
  if (connect_errno != ECONNREFUSED) {
    return make_error(ErrorCode::kIo, "cannot probe existing socket '" + path + "': " + errno_text(connect_errno));
  }
  if (unlink(path.c_str()) != 0) {
    return make_error(ErrorCode::kIo, "cannot remove stale socket '" + path + "': " + errno_text(errno));
  }
  spdlog::info("removed stale socket {}", path);
  return ok_status();
}

}  // namespace

// kestrel.v1.Kestrel with every method raw (grpc::ByteBuffer in and out), so that requests are parsed by
// parse_request() above.
using RawKestrelService =
    v1::Kestrel::WithRawCallbackMethod_GetModelInfo<v1::Kestrel::WithRawCallbackMethod_GetServerStatus<
        v1::Kestrel::WithRawCallbackMethod_Tokenize<v1::Kestrel::WithRawCallbackMethod_Detokenize<
            v1::Kestrel::WithRawCallbackMethod_CreateSession<v1::Kestrel::WithRawCallbackMethod_CloneSession<
                v1::Kestrel::WithRawCallbackMethod_ResetSession<v1::Kestrel::WithRawCallbackMethod_CloseSession<
                    v1::Kestrel::WithRawCallbackMethod_Step<v1::Kestrel::WithRawCallbackMethod_Generate<
                        v1::Kestrel::WithRawCallbackMethod_Abort<v1::Kestrel::Service>>>>>>>>>>>;

// The kestrel.v1.Kestrel callback service: one method per RPC, each handing its parsed request to RpcHandlers.
class GrpcService final : public RawKestrelService {
 public:
  using Unary = grpc::ServerUnaryReactor*;
  using Ctx = grpc::CallbackServerContext;
  using Bytes = grpc::ByteBuffer;

  explicit GrpcService(RpcHandlers& handlers) : handlers_(handlers) {}

  Unary GetModelInfo(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::GetModelInfoRequest, v1::ModelInfo>(
        ctx, "GetModelInfo", req, resp, [&](const auto& r, auto* out) { return handlers_.get_model_info(r, out); });
  }
  Unary GetServerStatus(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::GetServerStatusRequest, v1::ServerStatus>(
        ctx, "GetServerStatus", req, resp,
        [&](const auto& r, auto* out) { return handlers_.get_server_status(r, out); });
  }
  Unary Tokenize(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::TokenizeRequest, v1::TokenizeResponse>(
        ctx, "Tokenize", req, resp, [&](const auto& r, auto* out) { return handlers_.tokenize(r, out); });
  }
  Unary Detokenize(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::DetokenizeRequest, v1::DetokenizeResponse>(
        ctx, "Detokenize", req, resp, [&](const auto& r, auto* out) { return handlers_.detokenize(r, out); });
  }
  Unary CreateSession(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::CreateSessionRequest, v1::SessionInfo>(
        ctx, "CreateSession", req, resp,
        [&](const auto& r, auto* out) { return handlers_.create_session(r, /*owner=*/0, out); });
  }
  Unary CloneSession(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::CloneSessionRequest, v1::SessionInfo>(
        ctx, "CloneSession", req, resp,
        [&](const auto& r, auto* out) { return handlers_.clone_session(r, /*owner=*/0, out); });
  }
  Unary ResetSession(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::ResetSessionRequest, v1::SessionInfo>(
        ctx, "ResetSession", req, resp, [&](const auto& r, auto* out) { return handlers_.reset_session(r, out); });
  }
  Unary CloseSession(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::CloseSessionRequest, v1::CloseSessionResponse>(
        ctx, "CloseSession", req, resp, [&](const auto& r, auto* out) { return handlers_.close_session(r, out); });
  }
  Unary Abort(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    return unary<v1::AbortRequest, v1::AbortResponse>(
        ctx, "Abort", req, resp, [&](const auto& r, auto* out) { return handlers_.abort(r, out); });
  }

  Unary Step(Ctx* ctx, const Bytes* req, Bytes* resp) override {
    v1::StepRequest request;
    if (!parse_request(*req, &request)) return finish_now(ctx, "Step", unparsable(request));
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    // resp stays valid until Finish; the callback runs once, on the engine thread (or here when refused).
    handlers_.step(
        request, deadline_of(*ctx),
        [reactor, resp](RpcStatus status, const v1::StepResponse& response) {
          if (status.ok()) status = serialize_response(response, resp);
          log_status("Step", status);
          reactor->Finish(to_grpc(status));
        },
        Transport::kGrpc);
    return reactor;
  }

  grpc::ServerWriteReactor<Bytes>* Generate(Ctx* ctx, const Bytes* req) override {
    auto* call = new GenerateCall();  // deleted by its OnDone
    v1::GenerateRequest request;
    if (!parse_request(*req, &request)) {
      GenerateCall::Stream(call).on_done(unparsable(request), v1::GenerateChunk{});
      return call;
    }
    handlers_.generate(request, deadline_of(*ctx), /*owner=*/0, std::make_shared<GenerateCall::Stream>(call),
                       Transport::kGrpc);
    return call;
  }

 private:
  RpcHandlers& handlers_;
};

GrpcServer::GrpcServer(RpcHandlers& handlers, GrpcServerOptions options)
    : options_(std::move(options)), service_(std::make_unique<GrpcService>(handlers)) {}

GrpcServer::~GrpcServer() { shutdown(Clock::now()); }

Expected<std::unique_ptr<GrpcServer>> GrpcServer::create(RpcHandlers& handlers, const GrpcServerOptions& options) {
  if (options.unix_socket_path.empty() && options.tcp_address.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "the gRPC server needs a unix socket path or a TCP address");
  }
  if (options.max_receive_message_bytes <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "max_receive_message_bytes must be > 0, got " +
                                                       std::to_string(options.max_receive_message_bytes));
  }
  if (!options.unix_socket_path.empty()) KESTREL_TRY(prepare_socket_path(options.unix_socket_path));

  std::unique_ptr<GrpcServer> server(new GrpcServer(handlers, options));
  grpc::EnableDefaultHealthCheckService(true);
  // Server reflection (grpc.reflection.v1alpha): grpcurl and other tools list and call the API without the .proto.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  int unix_ok = 0;
  if (!options.unix_socket_path.empty()) {
    builder.AddListeningPort("unix:" + options.unix_socket_path, grpc::InsecureServerCredentials(), &unix_ok);
  }
  if (!options.tcp_address.empty()) {
    builder.AddListeningPort(options.tcp_address, grpc::InsecureServerCredentials(), &server->tcp_port_);
  }
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || (!options.unix_socket_path.empty() && unix_ok == 0) ||
      (!options.tcp_address.empty() && server->tcp_port_ == 0)) {
    if (server->server_) server->server_->Shutdown();
    server->server_.reset();
    std::string where = options.unix_socket_path.empty() ? "" : "unix:" + options.unix_socket_path;
    if (!options.tcp_address.empty()) where += (where.empty() ? "" : " and ") + options.tcp_address;
    return make_error(ErrorCode::kUnavailable,
                      "gRPC server could not listen on " + where + " (address in use or not permitted?)");
  }
  if (grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(kServiceName, false);
    health->SetServingStatus("", false);
  }
  if (!options.unix_socket_path.empty()) {
    if (chmod(options.unix_socket_path.c_str(), options.unix_socket_mode) != 0) {
      const int e = errno;
      server->shutdown(Clock::now());
      return make_error(ErrorCode::kIo, "cannot chmod '" + options.unix_socket_path + "': " + errno_text(e));
    }
    spdlog::info("gRPC listening on unix:{} (mode {:04o})", options.unix_socket_path, options.unix_socket_mode);
  }
  if (!options.tcp_address.empty()) {
    spdlog::info("gRPC listening on {} (port {})", options.tcp_address, server->tcp_port_);
  }
  return server;
}

void GrpcServer::set_serving(bool serving) {
  std::lock_guard lock(shutdown_mu_);
  if (shut_down_ || !server_) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
  }
}

void GrpcServer::shutdown(Clock::time_point deadline) {
  std::lock_guard lock(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (!server_) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) health->Shutdown();
  const auto wall = std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - Clock::now());
  server_->Shutdown(wall);
  server_->Wait();
  if (!options_.unix_socket_path.empty()) unlink(options_.unix_socket_path.c_str());
  spdlog::info("gRPC server stopped");
}

}  // namespace kestrel::daemon
