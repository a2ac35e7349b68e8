// The soak benchmark's view of a transport (bench_soak.cpp): one client connection that can run the soak's
// operations, each timed by the caller. kestreld's own transports (gRPC on its Unix socket, the shm fast path) are
// one implementation over libkestrel-client; its OpenAI-compatible HTTP API is another, over one kept-alive HTTP/1.1
// connection (Boost.Beast), where a "step" is a one-token completion and a "generate" a streamed completion (HTTP has
// no sessions: each request runs in a temporary one).
//
// Threading: one SoakTransport per client thread. Ownership: each owns its connection.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/base/expected.h"

namespace kestrel::bench {

// What one client does, one timed call each.
enum class SoakOp {
  kStep,      // a session's next Step: the prompt's tokens first, then the sampled token fed back
  kGenerate,  // a Generate of max_tokens on the session (streamed; timed to its last chunk)
};
inline constexpr SoakOp kSoakOps[] = {SoakOp::kStep, SoakOp::kGenerate};
const char* soak_op_name(SoakOp op);

struct SoakWork {
  int32_t n_ctx = 256;        // each session's context; a new session when the next operation would not fit
  int32_t prompt_tokens = 8;  // the first Step of a session appends this many tokens
  int32_t generate_tokens = 16;
};

class SoakTransport {
 public:
  virtual ~SoakTransport() = default;
  // "grpc", "shm", ...: the name the report groups by.
  virtual std::string name() const = 0;
  // The operations this transport offers (a transport without sessions would offer only kGenerate).
  virtual std::vector<SoakOp> ops() const = 0;
  // Runs one operation. Errors are counted by the caller and the client goes on (a new session is opened when the
  // current one was lost).
  virtual Status run(SoakOp op, std::mt19937_64& rng) = 0;
};

// uri: "unix://..." (gRPC) or "shm://..." (libkestrel-client), or "http://HOST:PORT" (kestreld --http). kUnavailable
// when it cannot connect.
Expected<std::unique_ptr<SoakTransport>> make_soak_transport(const std::string& uri, const SoakWork& work);

}  // namespace kestrel::bench
