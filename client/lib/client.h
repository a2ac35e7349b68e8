// libkestrel-client: one Client API over kestreld's transports (docs/api.md).
//
//   unix:///run/kestrel/kestreld.sock   gRPC over a Unix socket (the daemon's default listener)
//   tcp://host:port                     gRPC over TCP (only when the daemon is configured to listen there)
//   shm:///run/kestrel/kestreld-shm.sock  the shared-memory fast path: the daemon's control socket hands this
//                                       client a private segment; requests go through lock-free rings in it
//
// The request and response types are the kestrel.v1 protobuf messages (proto/kestrel/v1/kestrel.proto), the same on
// every transport. Errors come back as kestrel::Error whose message starts with the gRPC status name, e.g.
// "NOT_FOUND: session 42 does not exist", and whose code maps that status back (docs/api.md has the table).
//
// Threading: a Client may be used from several threads at once; each call is independent. generate() calls
// on_chunk on the calling thread. Ownership: the Client owns its connection; destroying it closes the connection
// (for shm, the daemon then closes every session this client created).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "core/base/expected.h"
#include "kestrel/v1/kestrel.pb.h"

namespace kestrel::client {

struct ClientOptions {
  std::chrono::milliseconds timeout{0};  // per-call deadline; 0 = none
  std::chrono::milliseconds connect_timeout{5000};
};

// The status of a failed call, as the daemon sent it.
struct CallError {
  int grpc_code = 0;  // grpc::StatusCode value
  std::string message;
};

class Client {
 public:
  // Connects (and, for shm, maps the segment) or returns kUnavailable / kInvalidArgument (bad URI) with the reason.
  static Expected<std::unique_ptr<Client>> connect(const std::string& uri, const ClientOptions& options = {});
  virtual ~Client() = default;

  virtual std::string transport() const = 0;  // "grpc-unix", "grpc-tcp", "shm"

  virtual Expected<v1::ModelInfo> model_info() = 0;
  virtual Expected<v1::ServerStatus> server_status() = 0;
  virtual Expected<v1::TokenizeResponse> tokenize(const v1::TokenizeRequest& request) = 0;
  virtual Expected<v1::DetokenizeResponse> detokenize(const v1::DetokenizeRequest& request) = 0;
  virtual Expected<v1::SessionInfo> create_session(const v1::CreateSessionRequest& request) = 0;
  virtual Expected<v1::SessionInfo> clone_session(const v1::CloneSessionRequest& request) = 0;
  virtual Expected<v1::SessionInfo> reset_session(const v1::ResetSessionRequest& request) = 0;
  virtual Status close_session(const v1::CloseSessionRequest& request) = 0;
  virtual Expected<v1::StepResponse> step(const v1::StepRequest& request) = 0;
  // Streams chunks to on_chunk (return false from it to cancel the generation) and returns the last chunk, which
  // carries the finish reason and counts.
  virtual Expected<v1::GenerateChunk> generate(const v1::GenerateRequest& request,
                                               const std::function<bool(const v1::GenerateChunk&)>& on_chunk) = 0;
  virtual Expected<v1::AbortResponse> abort(const v1::AbortRequest& request) = 0;
};

// Maps a gRPC status code number to the closest kestrel::ErrorCode (docs/api.md).
ErrorCode error_code_from_grpc(int grpc_code);

}  // namespace kestrel::client
