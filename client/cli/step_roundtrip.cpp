// Step round-trip timing loop and latency summary (step_roundtrip.h).
#include "client/cli/step_roundtrip.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace kestrel::cli {

LatencySummary summarize_latency(std::vector<double>& samples_us) {
  LatencySummary s;
  s.n = samples_us.size();
  if (samples_us.empty()) return s;
  std::sort(samples_us.begin(), samples_us.end());
  auto rank = [&](double q) {
    // Nearest rank: the smallest sample with at least q of the samples at or below it.
    const auto k = static_cast<size_t>(std::ceil(q * static_cast<double>(s.n)));
    return samples_us[std::clamp<size_t>(k, 1, s.n) - 1];
  };
  s.p50_us = rank(0.50);
  s.p90_us = rank(0.90);
  s.p99_us = rank(0.99);
  s.min_us = samples_us.front();
  s.max_us = samples_us.back();
  s.mean_us = std::accumulate(samples_us.begin(), samples_us.end(), 0.0) / static_cast<double>(s.n);
  return s;
}

Expected<std::vector<double>> time_step_roundtrips(const RoundTripOptions& o, const StepCall& step,
                                                   const ResetCall& reset) {
  if (o.steps < 1 || o.warmup < 0 || o.tokens_per_step < 1) {
    return make_error(ErrorCode::kInvalidArgument, "steps must be >= 1, warmup >= 0 and tokens per step >= 1");
  }
  if (o.tokens_per_step >= o.n_ctx) {
    return make_error(ErrorCode::kInvalidArgument, "tokens per step (" + std::to_string(o.tokens_per_step) +
                                                       ") must be below the session context (" +
                                                       std::to_string(o.n_ctx) + ")");
  }
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(o.steps));
  std::vector<int32_t> tokens(static_cast<size_t>(o.tokens_per_step), o.first_token);
  int64_t n_past = 0;
  for (int32_t i = 0; i < o.warmup + o.steps; ++i) {
    if (n_past + o.tokens_per_step > o.n_ctx) {
      KESTREL_TRY(reset());
      n_past = 0;
      std::fill(tokens.begin(), tokens.end(), o.first_token);
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto next = step(tokens);
    const auto t1 = std::chrono::steady_clock::now();
    if (!next) return next.error();
    n_past += o.tokens_per_step;
    std::fill(tokens.begin(), tokens.end(), *next);
    if (i >= o.warmup) samples.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return samples;
}

Expected<std::vector<double>> time_calls(int32_t calls, int32_t warmup, const PlainCall& call) {
  if (calls < 1 || warmup < 0) return make_error(ErrorCode::kInvalidArgument, "calls must be >= 1 and warmup >= 0");
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(calls));
  for (int32_t i = 0; i < warmup + calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Status st = call();
    const auto t1 = std::chrono::steady_clock::now();
    if (!st) return st.error();
    if (i >= warmup) samples.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return samples;
}

std::string format_latency(const LatencySummary& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "p50 %.1f us, p90 %.1f us, p99 %.1f us, mean %.1f us (min %.1f, max %.1f; n %zu)",
                s.p50_us, s.p90_us, s.p99_us, s.mean_us, s.min_us, s.max_us, s.n);
  return buf;
}

}  // namespace kestrel::cli
