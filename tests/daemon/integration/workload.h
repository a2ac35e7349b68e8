// Deterministic client workloads for the integration tests: greedy Step and Generate sequences whose tokens must
// not depend on which transport carried them or on what else the daemon was doing at the time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/lib/client.h"
#include "core/base/expected.h"

namespace kestrel::itest {

// Workload `id`: a session of its own (n_ctx 512, greedy): the tokenized prompt "Request <id>: ..." as one Step,
// 6 one-token Steps fed back, a Generate of 10 tokens continuing the session (ignore_eos), the session closed; then a
// Generate of 6 tokens on a temporary session. Returns every sampled/generated token in order.
Expected<std::vector<int32_t>> run_workload(client::Client& c, int id);

// "<STATUS>: ..." — the gRPC status name at the start of an error message from libkestrel-client.
std::string status_name(const Error& e);

}  // namespace kestrel::itest
