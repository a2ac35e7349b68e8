// HttpServer: kestreld's OpenAI-compatible HTTP/1.1 server (docs/http.md), off unless configured ([listen] http,
// --http HOST:PORT). Boost.Beast over one io_context run by a few threads: connections (http_connection.h) and event
// streams hold no thread; the engine thread hands results to a connection's strand and never waits on a client.
//
// Lifecycle (daemon/main.cpp): start() binds before the model loads (every /v1/ route answers 503 "loading",
// /health {"status": "loading"}); attach() connects the Service; on SIGTERM the Service drains first (new requests
// get 503, streams in flight end), then stop() closes idle connections at once and the others once their answer is
// written, and closes what is left at the deadline.
//
// Threading: every public method may be called from any thread. Ownership: borrows the Service given to attach(),
// which must outlive stop() (or the destructor).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/base/expected.h"
#include "daemon/engine/service.h"
#include "daemon/http/openai_api.h"

namespace kestrel::daemon::http {

struct HttpServerOptions {
  std::string address;  // "host:port"; "[::1]:8080" for IPv6; port 0 picks a free port (port() tells which)
  std::string api_key;  // "" = none; else /v1/ routes need "Authorization: Bearer <key>"
  uint64_t max_body_bytes = 4 << 20;             // a larger request body is answered 413
  uint32_t max_concurrent_requests = 64;         // completions running over HTTP at once; more are answered 429
  uint32_t max_connections = 512;                // open connections; more are answered 503 and closed
  size_t max_response_bytes = size_t{16} << 20;  // the largest response body (ApiOptions)
  int io_threads = 2;
  std::chrono::seconds read_timeout{30};   // to receive a request (and the idle time of a kept-alive connection)
  std::chrono::seconds write_timeout{60};  // for a client to take one write
};

class HttpServer {
 public:
  // Resolves and binds the address and starts the io threads. kInvalidArgument for a malformed address or option,
  // kUnavailable when it cannot bind (in use, not permitted).
  static Expected<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options);
  ~HttpServer();  // stop(now) when stop() was not called
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void attach(Service& service, ServedModel model);
  // The bound port (useful with port 0).
  int port() const;
  // Stops accepting, lets answers in progress be written until `deadline`, then closes every connection and joins
  // the io threads. Idempotent.
  void stop(Clock::time_point deadline);

 private:
  class Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Splits "host:port" ("[::1]:8080" for IPv6) into host and port; kInvalidArgument naming the problem.
Expected<std::pair<std::string, uint16_t>> split_host_port(const std::string& address);

}  // namespace kestrel::daemon::http
