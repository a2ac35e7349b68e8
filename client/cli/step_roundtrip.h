// Step round-trip timing shared by `kestrel bench` and bench/daemon/bench_roundtrip: runs a decode-like loop of
// Step calls through any transport (a function that appends tokens to one session and returns the sampled token)
// and summarizes the wall time of each call in microseconds.
//
// The loop feeds each step the token sampled by the previous one (plus tokens_per_step-1 copies of it), the way a
// client decodes; when the session's context would overflow it calls reset (untimed) and starts over from the
// first token. Not thread-safe: one loop per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/base/expected.h"

namespace kestrel::cli {

struct LatencySummary {
  size_t n = 0;
  double p50_us = 0, p90_us = 0, p99_us = 0, mean_us = 0, min_us = 0, max_us = 0;
};

// Nearest-rank percentiles of `samples_us` (sorted in place). Empty input: all zero.
LatencySummary summarize_latency(std::vector<double>& samples_us);

struct RoundTripOptions {
  int32_t steps = 1000;         // timed steps
  int32_t warmup = 50;          // untimed steps before them
  int32_t tokens_per_step = 1;  // tokens appended per step
  int32_t n_ctx = 4096;         // the session's context: the loop resets before it would overflow
  int32_t first_token = 0;      // the token of the first step after each reset
};

// step(tokens) -> the sampled token or the call's error; reset() -> empties the session.
using StepCall = std::function<Expected<int32_t>(std::span<const int32_t> tokens)>;
using ResetCall = std::function<Status()>;

// Runs warmup + steps calls; returns one wall time per timed call (µs), or the first error.
Expected<std::vector<double>> time_step_roundtrips(const RoundTripOptions& options, const StepCall& step,
                                                   const ResetCall& reset);

// Times `calls` calls of `call` after `warmup` untimed ones (µs each), or returns the first error. For the cost of
// the transport alone: a call that does no model work (GetServerStatus).
using PlainCall = std::function<Status()>;
Expected<std::vector<double>> time_calls(int32_t calls, int32_t warmup, const PlainCall& call);

// "p50 12.3 us, p90 ..., p99 ..., mean ..." for logs.
std::string format_latency(const LatencySummary& s);

}  // namespace kestrel::cli
