// bench_roundtrip: what a transport adds to one Step. The same decode loop (one token per step, the sampled token
// fed back, greedy; client/cli/step_roundtrip.h) runs three ways on the same model:
//   in-process  Service::step called directly (make_reference_engine + make_service), waiting for its callback:
//               the engine's tick (queueing, forward pass, sampling) without any transport;
//   shm         a kestreld child process, libkestrel-client over the shared-memory rings;
//   grpc        the same kestreld, libkestrel-client over gRPC on its Unix socket.
// Then the same number of GetServerStatus calls each way (Service::stats() in-process): the transport's own cost
// without model work. It prints p50/p90/p99/mean per way and call, the ratios shm/in-process and gRPC/in-process,
// the added microseconds at p50, and the command line that reproduces the run. Run it on an otherwise idle machine.
//
//   kestrel-mkmodel --preset tiny -o tiny.gguf
//   bench_roundtrip --model tiny.gguf [--kestreld PATH] [-n 2000] [--warmup 200] [--tokens 1]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/cli/cli11.h"
#include "client/cli/step_roundtrip.h"
#include "client/lib/client.h"
#include "core/engine/reference_engine.h"
#include "core/model/model.h"
#include "daemon/engine/service.h"

namespace kestrel {
namespace {

using cli::LatencySummary;
using cli::RoundTripOptions;

struct Options {
  std::string model;
  std::string kestreld = KESTRELD_PATH;
  RoundTripOptions rt;
};

struct Samples {
  std::vector<double> step_us, status_us;
};

// Service::step, waiting on the calling thread for the callback the engine thread runs; then Service::stats().
Expected<Samples> run_in_process(const Options& o) {
  KESTREL_TRY_ASSIGN(auto model, Model::open(o.model));
  KESTREL_TRY_ASSIGN(auto engine, make_reference_engine(*model, 4));
  daemon::ServiceLimits limits;
  limits.default_sampling.temperature = 0.0f;
  KESTREL_TRY_ASSIGN(auto service, daemon::make_service(*model, *engine, limits));
  daemon::SessionOptions so;
  so.n_ctx = o.rt.n_ctx;
  so.sampling.temperature = 0.0f;
  KESTREL_TRY_ASSIGN(const daemon::SessionInfo session, service->create_session(so));
  RoundTripOptions rt = o.rt;
  rt.n_ctx = session.n_ctx;
  auto ids = service->tokenize("Hello", false);
  if (ids && !ids->empty()) rt.first_token = ids->front();

  std::mutex mu;
  std::condition_variable cv;
  auto step = [&](std::span<const int32_t> tokens) -> Expected<int32_t> {
    daemon::StepRequest req;
    req.session = session.id;
    req.tokens.assign(tokens.begin(), tokens.end());
    std::optional<Expected<daemon::StepResult>> result;
    service->step(std::move(req), [&](Expected<daemon::StepResult> r) {
      std::lock_guard<std::mutex> lock(mu);
      result.emplace(std::move(r));
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return result.has_value(); });
    if (!*result) return result->error();
    return (*result)->token;
  };
  auto reset = [&]() -> Status {
    KESTREL_TRY(service->reset_session(session.id));
    return ok_status();
  };
  auto samples = cli::time_step_roundtrips(rt, step, reset);
  (void)service->close_session(session.id);
  if (!samples) {
    service->drain(daemon::Clock::now());
    return samples.error();
  }
  auto status = cli::time_calls(o.rt.steps, o.rt.warmup, [&]() -> Status {
    const daemon::ServiceStats st = service->stats();
    if (!st.serving) return make_error(ErrorCode::kUnavailable, "the in-process service is not serving");
    return ok_status();
  });
  service->drain(daemon::Clock::now());
  if (!status) return status.error();
  return Samples{std::move(*samples), std::move(*status)};
}

// A kestreld child on sockets in a temporary folder; killed and cleaned up by the destructor.
class Daemon {
 public:
  static Expected<std::unique_ptr<Daemon>> start(const Options& o) {
    auto d = std::make_unique<Daemon>();
    char tmpl[] = "/tmp/kestrel-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return make_error(ErrorCode::kIo, "mkdtemp failed");
    d->dir_ = tmpl;
    const std::string sock = d->dir_ + "/kestreld.sock", shm = d->dir_ + "/kestreld-shm.sock";
    const std::string log = d->dir_ + "/kestreld.log";
    std::vector<std::string> args = {
        o.kestreld,    "--model",          o.model,       "--socket", sock,           "--shm-socket", shm,
        "--cache-dir", d->dir_ + "/cache", "--log-level", "warn",     "--log-format", "text"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    d->pid_ = fork();
    if (d->pid_ < 0) return make_error(ErrorCode::kIo, "fork failed");
    if (d->pid_ == 0) {
      if (std::freopen(log.c_str(), "w", stdout) == nullptr || std::freopen(log.c_str(), "a", stderr) == nullptr) {
        _exit(126);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    d->grpc_uri_ = "unix://" + sock;
    d->shm_uri_ = "shm://" + shm;
    for (int i = 0; i < 1200; ++i) {
      int status = 0;
      if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
        d->pid_ = -1;
        std::ifstream in(log);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return make_error(ErrorCode::kUnavailable, "kestreld exited while starting: " + text);
      }
      if (std::filesystem::exists(sock)) {
        auto c = client::Client::connect(d->grpc_uri_);
        if (c) {
          auto st = (*c)->server_status();
          if (st && st->serving()) return d;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return make_error(ErrorCode::kDeadlineExceeded, "kestreld did not serve within 60 s (log: " + log + ")");
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  const std::string& grpc_uri() const { return grpc_uri_; }
  const std::string& shm_uri() const { return shm_uri_; }

 private:
  std::string dir_, grpc_uri_, shm_uri_;
  pid_t pid_ = -1;
};

Expected<Samples> run_client(const std::string& uri, const Options& o) {
  KESTREL_TRY_ASSIGN(auto c, client::Client::connect(uri));
  v1::CreateSessionRequest create;
  create.set_n_ctx(o.rt.n_ctx);
  create.mutable_sampling()->set_temperature(0.0f);
  KESTREL_TRY_ASSIGN(const v1::SessionInfo session, c->create_session(create));
  RoundTripOptions rt = o.rt;
  rt.n_ctx = session.n_ctx();
  v1::TokenizeRequest tok;
  tok.set_text("Hello");
  if (auto t = c->tokenize(tok); t && t->tokens_size() > 0) rt.first_token = t->tokens(0);
  v1::StepRequest req;
  req.set_session_id(session.session_id());
  auto step = [&](std::span<const int32_t> tokens) -> Expected<int32_t> {
    req.clear_tokens();
    for (int32_t t : tokens) req.add_tokens(t);
    KESTREL_TRY_ASSIGN(const v1::StepResponse r, c->step(req));
    return r.token();
  };
  auto reset = [&]() -> Status {
    v1::ResetSessionRequest r;
    r.set_session_id(session.session_id());
    KESTREL_TRY(c->reset_session(r));
    return ok_status();
  };
  KESTREL_TRY_ASSIGN(auto steps, cli::time_step_roundtrips(rt, step, reset));
  v1::CloseSessionRequest close;
  close.set_session_id(session.session_id());
  KESTREL_TRY(c->close_session(close));
  KESTREL_TRY_ASSIGN(auto status, cli::time_calls(o.rt.steps, o.rt.warmup, [&]() -> Status {
                       KESTREL_TRY(c->server_status());
                       return ok_status();
                     }));
  return Samples{std::move(steps), std::move(status)};
}

int run(const Options& o, const std::string& command_line) {
  struct Row {
    std::string name;
    LatencySummary step, status;
  };
  std::vector<Row> rows;
  auto in_process = run_in_process(o);
  if (!in_process) {
    std::fprintf(stderr, "bench_roundtrip: in-process: %s\n", in_process.error().message.c_str());
    return 1;
  }
  rows.push_back(
      {"in-process", cli::summarize_latency(in_process->step_us), cli::summarize_latency(in_process->status_us)});
  auto daemon = Daemon::start(o);
  if (!daemon) {
    std::fprintf(stderr, "bench_roundtrip: %s\n", daemon.error().message.c_str());
    return 1;
  }
  for (const auto& [name, uri] : {std::pair{std::string("shm"), (*daemon)->shm_uri()},
                                  std::pair{std::string("grpc-unix"), (*daemon)->grpc_uri()}}) {
    auto samples = run_client(uri, o);
    if (!samples) {
      std::fprintf(stderr, "bench_roundtrip: %s: %s\n", name.c_str(), samples.error().message.c_str());
      return 1;
    }
    rows.push_back({name, cli::summarize_latency(samples->step_us), cli::summarize_latency(samples->status_us)});
  }
  std::printf(
      "round trips: %d calls each after %d warm-up calls; Step = %d token(s) appended, greedy; status =\n"
      "GetServerStatus (Service::stats() in-process): the transport without model work. Model %s\n",
      o.rt.steps, o.rt.warmup, o.rt.tokens_per_step, o.model.c_str());
  std::printf("%-11s %-7s %9s %9s %9s %9s %9s %12s %12s %13s\n", "way", "call", "p50 us", "p90 us", "p99 us", "mean us",
              "min us", "p50/in-proc", "p99/in-proc", "p50 added us");
  for (int which = 0; which < 2; ++which) {
    const LatencySummary& base = which == 0 ? rows.front().step : rows.front().status;
    for (const auto& r : rows) {
      const LatencySummary& s = which == 0 ? r.step : r.status;
      // In-process stats() is a few locked loads (well under a microsecond): a ratio to it says nothing, so the
      // status rows give the added microseconds only.
      char ratios[32] = "           -            -";
      if (which == 0)
        std::snprintf(ratios, sizeof ratios, "%12.2f %12.2f", s.p50_us / base.p50_us, s.p99_us / base.p99_us);
      std::printf("%-11s %-7s %9.2f %9.2f %9.2f %9.2f %9.2f %s %13.1f\n", r.name.c_str(),
                  which == 0 ? "step" : "status", s.p50_us, s.p90_us, s.p99_us, s.mean_us, s.min_us, ratios,
                  s.p50_us - base.p50_us);
    }
  }
  std::printf("reproduce: %s\n", command_line.c_str());
  return 0;
}

}  // namespace
}  // namespace kestrel

int main(int argc, char** argv) {
  kestrel::Options o;
  o.rt.steps = 2000;
  o.rt.warmup = 200;
  CLI::App app{"bench_roundtrip: Step round trip in-process vs shm vs gRPC (Unix socket) on one model"};
  app.add_option("-m,--model", o.model, "GGUF model (kestrel-mkmodel --preset tiny -o tiny.gguf)")->required();
  app.add_option("--kestreld", o.kestreld, "the kestreld binary")->capture_default_str();
  app.add_option("-n,--steps", o.rt.steps, "timed steps per way")->capture_default_str()->check(CLI::Range(1, 1 << 24));
  app.add_option("--warmup", o.rt.warmup, "untimed steps first")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  app.add_option("--tokens", o.rt.tokens_per_step, "tokens per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("-c,--ctx-size", o.rt.n_ctx, "session context (reset when full)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
  return kestrel::run(o, command_line);
}
