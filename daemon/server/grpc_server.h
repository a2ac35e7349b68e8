// GrpcServer: kestreld's gRPC front door (service kestrel.v1.Kestrel plus grpc.health.v1), built on gRPC's callback
// API. Every call is handed to RpcHandlers (rpc_handlers.h), which talks to the Service; this file only adds what is
// gRPC's own: listeners, deadlines, cancellation, flow control of the Generate stream, and health.
//
// Listeners: a Unix socket (the default; a stale socket file left by a dead daemon is removed first, a live one or a
// file that is not a socket is refused; the socket is chmod-ed to `unix_socket_mode`) and optionally a TCP address.
// Messages received are limited to 4 MiB (set explicitly; a larger request fails with RESOURCE_EXHAUSTED).
// Health: grpc.health.v1 answers NOT_SERVING for "" and "kestrel.v1.Kestrel" from start until set_serving(true), and
// again after set_serving(false) (drain) or shutdown().
// Reflection: grpc.reflection.v1alpha.ServerReflection describes every service (grpcurl list / describe).
// Generate: the engine thread pushes chunks into a per-call queue and never waits; one write is outstanding at a
// time and OnWriteDone starts the next; a client that goes away marks the stream cancelled, so the engine stops
// generating for it at its next tick.
//
// Threading: all public methods may be called from any thread. Ownership: the server borrows the RpcHandlers (and
// through it the Service), which must outlive it. Shutdown order (daemon/main.cpp): set_serving(false), then
// Service::drain (it ends every in-flight Step/Generate, so every call's reactor can finish), then shutdown().
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>

#include "core/base/expected.h"
#include "daemon/engine/service.h"
#include "daemon/server/rpc_handlers.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace kestrel::daemon {

struct GrpcServerOptions {
  // Absolute path of the Unix socket; empty = no Unix listener (then tcp_address must be set).
  std::string unix_socket_path = "/run/kestrel/kestreld.sock";
  mode_t unix_socket_mode = 0660;  // owner and the daemon's group may connect
  // "host:port" to also listen on TCP (insecure: put it behind a proxy or a firewall); empty = none. Port 0 picks a
  // free port (tcp_port() tells which).
  std::string tcp_address;
  int max_receive_message_bytes = 4 * 1024 * 1024;  // gRPC's default, stated so that it is a documented contract
};

class GrpcService;  // grpc_server.cpp: the kestrel.v1.Kestrel callback service

class GrpcServer {
 public:
  // Binds every listener and starts serving (health NOT_SERVING). kInvalidArgument for unusable options,
  // kUnavailable when a listener cannot bind (address in use, directory missing, a live daemon on the socket),
  // kIo when the socket's mode cannot be set.
  static Expected<std::unique_ptr<GrpcServer>> create(RpcHandlers& handlers, const GrpcServerOptions& options);
  // Shuts down with an immediate deadline when shutdown() was not called.
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // grpc.health.v1 status of "" and "kestrel.v1.Kestrel": SERVING when true.
  void set_serving(bool serving);
  // The TCP port bound (useful with port 0); 0 when there is no TCP listener.
  int tcp_port() const { return tcp_port_; }
  const std::string& unix_socket_path() const { return options_.unix_socket_path; }

  // Health goes NOT_SERVING for good, new calls are refused, calls in flight may finish until `deadline`, then the
  // rest are cancelled; returns when every call has ended, and removes the socket file. Idempotent.
  void shutdown(Clock::time_point deadline);

 private:
  GrpcServer(RpcHandlers& handlers, GrpcServerOptions options);

  GrpcServerOptions options_;
  std::unique_ptr<GrpcService> service_;
  std::unique_ptr<grpc::Server> server_;
  int tcp_port_ = 0;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;  // guarded by shutdown_mu_
};

}  // namespace kestrel::daemon
