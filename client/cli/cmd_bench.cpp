// `kestrel bench`: step round-trip latency per transport against a running kestreld.
//
// For each transport asked for (gRPC at --connect, shared memory at --shm, default: the control socket beside the
// gRPC socket), it opens a session (greedy sampling), runs --warmup untimed and -n timed Step calls of --tokens
// tokens each, feeding each step the token the previous one sampled (step_roundtrip.h), and prints p50/p90/p99/mean
// in microseconds, then times as many GetServerStatus calls (no model work: what the transport itself costs). The
// Step time is the client's wall time of the whole call: transport both ways, queueing for the
// engine's next tick, the forward pass of the step and sampling. The daemon's other clients share those ticks, so
// run it on an idle daemon for transport figures (bench/daemon/bench_roundtrip compares with in-process calls).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/cli/cli11.h"
#include "client/cli/cli_format.h"
#include "client/cli/client_flags.h"
#include "client/cli/commands.h"
#include "client/cli/step_roundtrip.h"

namespace kestrel::cli {
namespace {

struct BenchOptions {
  ConnectFlags connect;
  std::string shm_uri;  // empty: shm_uri_beside(connect.uri)
  std::string transport = "all";
  RoundTripOptions rt;
  bool json = false;
};

struct BenchResult {
  std::string transport;
  LatencySummary step;    // Step round trips
  LatencySummary status;  // GetServerStatus round trips: the transport without model work
};

// Connects to `uri` and times the step loop on a fresh session (closed afterwards).
Expected<BenchResult> bench_one(const std::string& uri, const BenchOptions& o) {
  KESTREL_TRY_ASSIGN(auto client, connect_client(uri, o.connect.timeout_s));
  client::Client& c = *client;
  v1::CreateSessionRequest create;
  create.set_n_ctx(o.rt.n_ctx);
  create.mutable_sampling()->set_temperature(0.0f);
  KESTREL_TRY_ASSIGN(const v1::SessionInfo session, c.create_session(create));
  RoundTripOptions rt = o.rt;
  rt.n_ctx = session.n_ctx();
  v1::TokenizeRequest tok;
  tok.set_text("Hello");
  if (auto t = c.tokenize(tok); t && t->tokens_size() > 0) rt.first_token = t->tokens(0);

  v1::StepRequest req;
  req.set_session_id(session.session_id());
  auto step = [&](std::span<const int32_t> tokens) -> Expected<int32_t> {
    req.clear_tokens();
    for (int32_t t : tokens) req.add_tokens(t);
    KESTREL_TRY_ASSIGN(const v1::StepResponse r, c.step(req));
    return r.token();
  };
  auto reset = [&]() -> Status {
    v1::ResetSessionRequest r;
    r.set_session_id(session.session_id());
    KESTREL_TRY(c.reset_session(r));
    return ok_status();
  };
  auto samples = time_step_roundtrips(rt, step, reset);
  v1::CloseSessionRequest close;
  close.set_session_id(session.session_id());
  const Status closed = c.close_session(close);
  if (!samples) return samples.error();
  KESTREL_TRY(closed);
  KESTREL_TRY_ASSIGN(auto status_samples, time_calls(o.rt.steps, o.rt.warmup, [&]() -> Status {
                       KESTREL_TRY(c.server_status());
                       return ok_status();
                     }));
  return BenchResult{c.transport(), summarize_latency(*samples), summarize_latency(status_samples)};
}

int run_bench(const BenchOptions& o) {
  std::vector<std::string> uris;
  const std::string grpc_uri = normalize_uri(o.connect.uri);
  const std::string shm_uri = o.shm_uri.empty() ? shm_uri_beside(grpc_uri) : normalize_uri(o.shm_uri);
  if (o.transport == "all" || o.transport == "grpc") {
    if (grpc_uri.starts_with("shm://")) {
      print_error("", "--connect " + grpc_uri + " is a shared-memory URI; give the gRPC socket (unix:///path)");
      return kExitUsage;
    }
    uris.push_back(grpc_uri);
  }
  if (o.transport == "all" || o.transport == "shm") {
    if (shm_uri.empty()) {
      print_error("", "no shared-memory socket next to " + grpc_uri + ": give --shm shm:///path");
      return kExitUsage;
    }
    uris.push_back(shm_uri);
  }
  std::vector<BenchResult> results;
  int rc = 0;
  for (const auto& uri : uris) {
    auto r = bench_one(uri, o);
    if (!r) {
      print_error(uri, r.error().message);
      rc = 1;
      continue;
    }
    results.push_back(*r);
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["steps"] = o.rt.steps;
    j["warmup"] = o.rt.warmup;
    j["tokens_per_step"] = o.rt.tokens_per_step;
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    auto summary = [](const LatencySummary& l) {
      return nlohmann::ordered_json{{"p50_us", l.p50_us},   {"p90_us", l.p90_us}, {"p99_us", l.p99_us},
                                    {"mean_us", l.mean_us}, {"min_us", l.min_us}, {"max_us", l.max_us}};
    };
    for (const auto& r : results) {
      arr.push_back({{"transport", r.transport}, {"step", summary(r.step)}, {"status", summary(r.status)}});
    }
    j["results"] = std::move(arr);
    std::puts(j.dump().c_str());
    return rc;
  }
  if (!results.empty()) {
    std::printf(
        "round trips in microseconds: Step (%d steps of %d token(s) after %d warm-up steps, greedy) and\n"
        "GetServerStatus (the transport alone, no model work; as many calls)\n",
        o.rt.steps, o.rt.tokens_per_step, o.rt.warmup);
    std::printf("%-10s %-7s %10s %10s %10s %10s %10s %10s\n", "transport", "call", "p50", "p90", "p99", "mean", "min",
                "max");
    for (const auto& r : results) {
      for (const auto& [call, l] : {std::pair{"step", r.step}, std::pair{"status", r.status}}) {
        std::printf("%-10s %-7s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n", r.transport.c_str(), call, l.p50_us,
                    l.p90_us, l.p99_us, l.mean_us, l.min_us, l.max_us);
      }
    }
    if (results.size() == 2 && results[0].step.p50_us > 0.0 && results[0].status.p50_us > 0.0) {
      std::printf("%s / %s at p50: step %.2f, status %.2f\n", results[1].transport.c_str(),
                  results[0].transport.c_str(), results[1].step.p50_us / results[0].step.p50_us,
                  results[1].status.p50_us / results[0].status.p50_us);
    }
  }
  return rc;
}

}  // namespace

void add_bench(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "step round-trip latency per transport against a running kestreld");
  cmd->add_option("--transport", opts->transport, "which transports to time")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "grpc", "shm"}));
  cmd->add_option("-n,--steps", opts->rt.steps, "timed steps per transport")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000000));
  cmd->add_option("--warmup", opts->rt.warmup, "untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--tokens", opts->rt.tokens_per_step, "tokens appended per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("-c,--ctx-size", opts->rt.n_ctx, "the session's context (it is reset when full)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 24));
  cmd->add_option("--shm", opts->shm_uri, "shared-memory control socket (default: kestreld-shm.sock beside --connect)");
  cmd->add_flag("--json", opts->json, "print one JSON object instead of the table");
  add_connect_flags(cmd, &opts->connect);
  cmd->callback([opts, exit_code] { *exit_code = run_bench(*opts); });
}

}  // namespace kestrel::cli
