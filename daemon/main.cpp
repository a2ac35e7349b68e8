// kestreld: the Kestrel inference daemon. Parse → build → run until SIGTERM (design.md §2, docs/operations.md):
//
//   config (file + flags) → logging → gRPC listener (health NOT_SERVING, calls UNAVAILABLE) and HTTP listener when
//   configured (/health "loading") → model (or the embedded default) → engine → service → attached to the handlers
//   and the HTTP API → shm server → health SERVING + READY=1 → wait for SIGTERM/SIGINT → STOPPING=1, health
//   NOT_SERVING, drain for stop_timeout_s, servers shut down → exit 0.
//
// Exit status: 0 after a drain (and for --help, --version, --print-config, --check-config); 1 when start-up fails
// (one line saying why: bad config, unreadable or corrupt model, socket folder not writable, address in use) or on a
// second SIGTERM while draining; 2 for a command-line syntax error.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "core/base/expected.h"
#include "core/engine/engine.h"
#include "core/model/model.h"
#include "daemon/engine/service.h"
#include "daemon/http/http_server.h"
#include "daemon/ops/allocator.h"
#include "daemon/ops/command_line.h"
#include "daemon/ops/config.h"
#include "daemon/ops/engine_select.h"
#include "daemon/ops/logging.h"
#include "daemon/ops/model_loader.h"
#include "daemon/ops/signals.h"
#include "daemon/ops/socket_dir.h"
#include "daemon/ops/systemd_notify.h"
#include "daemon/server/grpc_server.h"
#include "daemon/server/rpc_handlers.h"
#include "daemon/shm/shm_server.h"
#include "tools/mkmodel/default_model.h"

#ifndef KESTREL_VERSION
#define KESTREL_VERSION "unknown"
#endif

namespace {

using namespace kestrel;
using namespace kestrel::daemon;
using namespace kestrel::daemon::ops;

// Everything kestreld runs, in construction order; members are destroyed in reverse (servers before the service
// before the engine before the model they borrow).
struct Daemon {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Service> service;
  std::unique_ptr<RpcHandlers> handlers;
  std::unique_ptr<GrpcServer> grpc;
  std::unique_ptr<ShmServer> shm;
  std::unique_ptr<http::HttpServer> http;
  std::string model_path;  // the file served (the default model's path when none was configured)
};

// The HTTP server's options; the API key is read from [http] api_key_file when that is set.
Expected<http::HttpServerOptions> http_options(const DaemonConfig& config) {
  http::HttpServerOptions o;
  o.address = config.listen.http;
  o.api_key = config.http.api_key;
  if (!config.http.api_key_file.empty()) {
    std::ifstream in(config.http.api_key_file);
    if (!in || !std::getline(in, o.api_key)) {
      return make_error(ErrorCode::kIo,
                        "[http] api_key_file " + config.http.api_key_file + ": cannot read a key from its first line");
    }
    while (!o.api_key.empty() && (o.api_key.back() == '\r' || o.api_key.back() == ' ')) o.api_key.pop_back();
    if (o.api_key.empty()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "[http] api_key_file " + config.http.api_key_file + ": the first line is empty");
    }
  }
  o.max_body_bytes = config.http.max_body_bytes;
  o.max_concurrent_requests = config.http.max_concurrent_requests;
  o.max_connections = config.http.max_connections;
  return o;
}

// What the HTTP API says about the model: its id, its chat template and the texts of its BOS and EOS tokens.
http::ServedModel served_model(const DaemonConfig& config, const Model& model, const std::string& path) {
  http::ServedModel m;
  m.id = config.http.served_model_name;
  if (m.id.empty()) m.id = std::filesystem::path(path).stem().string();
  m.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const Tokenizer& tok = model.tokenizer();
  m.chat_template = tok.vocab().chat_template;
  auto text = [&](int32_t id) {
    auto bytes = id >= 0 ? tok.token_bytes(id) : Expected<std::string_view>(std::string_view());
    return bytes ? std::string(*bytes) : std::string();
  };
  m.bos_token = text(tok.vocab().bos_id);
  m.eos_token = text(tok.vocab().eos_id);
  return m;
}

// Builds the daemon from a validated configuration, reporting progress through the log and STATUS=.
Expected<Daemon> build(const DaemonConfig& config) {
  Daemon d;
  // The gRPC listener comes first, with handlers that have no Service yet: while the model loads, grpc.health.v1
  // answers NOT_SERVING and every other call UNAVAILABLE ("still loading"), instead of connection refused.
  ServerIdentity identity;
  identity.version = KESTREL_VERSION;
  d.handlers = std::make_unique<RpcHandlers>(RpcLimits{}, identity);
  notify_status("binding " + config.listen.socket);
  KESTREL_TRY(prepare_socket_dir(config.listen.socket));
  GrpcServerOptions grpc_options;
  grpc_options.unix_socket_path = config.listen.socket;
  grpc_options.unix_socket_mode = static_cast<mode_t>(config.listen.socket_mode);
  grpc_options.tcp_address = config.listen.tcp;
  KESTREL_TRY_ASSIGN(d.grpc, GrpcServer::create(*d.handlers, grpc_options));
  if (!config.listen.http.empty()) {
    // Bound now too: while the model loads, /health answers {"status": "loading"} and /v1/ routes 503.
    KESTREL_TRY_ASSIGN(http::HttpServerOptions http_opts, http_options(config));
    KESTREL_TRY_ASSIGN(d.http, http::HttpServer::start(http_opts));
  }

  std::string path = config.model;
  if (path.empty()) {
    notify_status("preparing the default model in " + config.cache_dir);
    KESTREL_TRY_ASSIGN(
        mkmodel::DefaultModel dm,
        mkmodel::ensure_default_model(config.cache_dir, [](std::string_view line) { spdlog::info("{}", line); }));
    path = dm.path;
  }
  d.model_path = path;
  spdlog::info("loading model {}", path);
  const auto load_start = Clock::now();
  KESTREL_TRY_ASSIGN(d.model, load_model(path, [&](int percent, uint64_t done, uint64_t total) {
                       notify_status("loading model " + path + " " + std::to_string(percent) + "%");
                       spdlog::info("loading model: {}% ({:.1f} / {:.1f} MB)", percent, static_cast<double>(done) / 1e6,
                                    static_cast<double>(total) / 1e6);
                     }));
  const ModelHparams& hp = d.model->hparams();
  spdlog::info("model {}: {} layers, n_embd {}, vocabulary {}, {} experts; opened in {:.2f} s", path, hp.n_layer,
               hp.n_embd, hp.n_vocab, hp.n_expert, std::chrono::duration<double>(Clock::now() - load_start).count());

  notify_status("starting the " + config.engine + " engine");
  ServiceLimits limits = config.limits;
  KESTREL_TRY_ASSIGN(d.engine, make_engine(config, *d.model, &limits, [&](int percent) {
                       notify_status("loading weights onto the engine " + std::to_string(percent) + "%");
                       spdlog::info("engine: weights {}%", percent);
                     }));
  spdlog::info("engine {} on {}", d.engine->name(), d.engine->placement().device);
  for (const PlacementEntry& p : d.engine->placement().entries) {
    spdlog::info("placement: {:<16} {:<8} {:.1f} MB", p.component, p.device, static_cast<double>(p.bytes) / 1e6);
  }
  if (!d.engine->placement().summary.empty()) spdlog::info("placement: {}", d.engine->placement().summary);
  KESTREL_TRY_ASSIGN(d.service, make_service(*d.model, *d.engine, limits));
  const ServiceLimits in_force = d.service->limits();
  spdlog::info("limits: {} sessions, {} queued steps, n_ctx {} (max {}), {} tokens per tick, idle TTL {} s",
               in_force.max_sessions, in_force.max_queued_steps, in_force.default_n_ctx, in_force.max_session_ctx,
               in_force.max_batch_tokens, in_force.default_idle_ttl.count());
  d.handlers->attach(*d.service);
  if (d.http) d.http->attach(*d.service, served_model(config, *d.model, path));

  if (!config.listen.shm_socket.empty()) {
    KESTREL_TRY(prepare_socket_dir(config.listen.shm_socket));
    ShmServerOptions shm_options;
    shm_options.socket_path = config.listen.shm_socket;
    shm_options.socket_mode = config.listen.socket_mode;
    KESTREL_TRY_ASSIGN(d.shm, ShmServer::start(shm_options, *d.service, *d.handlers));
  } else {
    spdlog::info("shm fast path disabled ([listen] shm_socket is empty)");
  }
  return d;
}

// Start-up failed: one line on stderr (through the log) and in systemctl status.
int fail_startup(const Error& e) {
  spdlog::critical("cannot start: {}", e.message);
  notify_status("failed: " + e.message);
  return 1;
}

int run(int argc, char** argv) {
  const Environment env = Environment::from_process();
  auto cli = parse_command_line(argc, argv, env, std::cout, std::cerr);
  if (!cli) {
    std::fprintf(stderr, "kestreld: %s\n", cli.error().message.c_str());
    return 1;
  }
  const DaemonConfig& config = cli->config;
  switch (cli->action) {
    case CliAction::kExit: return cli->exit_code;
    case CliAction::kPrintConfig: std::cout << to_toml(config); return 0;
    case CliAction::kCheckConfig:
      std::printf("kestreld: configuration is valid%s\n",
                  config.config_file.empty() ? "" : (" (" + config.config_file + ")").c_str());
      return 0;
    case CliAction::kRun: break;
  }
  if (Status st = setup_logging(config.log); !st) {
    std::fprintf(stderr, "kestreld: %s\n", st.error().message.c_str());
    return 1;
  }
  // A client that vanishes mid-write must cost an EPIPE on that connection, never the daemon.
  std::signal(SIGPIPE, SIG_IGN);
  // Fewer malloc arenas and a periodic trim hold RSS at the working set (daemon/ops/allocator.h).
  const int arenas = configure_allocator();
  // Before any thread exists: every thread created from here on inherits the blocked signals.
  auto signals = SignalWatcher::start([](int /*signal*/) {
    notify_stopping("stopping at once (second signal)");
    spdlog::default_logger()->flush();
    std::_Exit(1);
  });
  if (!signals) return fail_startup(signals.error());
  MemoryTrimmer trimmer(std::chrono::seconds(10));  // after SignalWatcher: its thread must block the stop signals

  spdlog::info("kestreld {} starting (pid {}, config {})", KESTREL_VERSION, ::getpid(),
               config.config_file.empty() ? "none: defaults and flags" : config.config_file);
  spdlog::info("malloc: {} arenas at most, free pages returned to the kernel every 10 s",
               arenas > 0 ? std::to_string(arenas) : std::string("glibc's default number of"));
  auto daemon = build(config);
  if (!daemon) return fail_startup(daemon.error());
  Daemon& d = *daemon;

  d.grpc->set_serving(true);
  const std::string serving = "serving " + d.model_path + " on " + config.listen.socket +
                              (d.http ? " and http://" + config.listen.http : std::string());
  notify_ready(serving);
  spdlog::info("{}", serving);

  const auto interval = watchdog_interval();
  EngineProgressProbe probe;
  Watchdog watchdog(interval / 2, [&] { return probe(d.service->stats()); });
  if (watchdog.running()) {
    spdlog::info("systemd watchdog: pinging every {} ms while the engine loop is alive",
                 std::chrono::duration_cast<std::chrono::milliseconds>(interval / 2).count());
  }

  const int sig = (*signals)->wait_for_stop();
  const auto deadline = Clock::now() + std::chrono::seconds(config.stop_timeout_s);
  notify_stopping("draining: in-flight requests have " + std::to_string(config.stop_timeout_s) + " s");
  spdlog::info("draining after signal {}: in-flight requests have {} s", sig, config.stop_timeout_s);
  d.grpc->set_serving(false);
  // The shm connections keep running while the service drains, so their in-flight streams finish; then they end.
  d.service->drain(deadline);
  if (d.shm) d.shm->stop();
  if (d.http) d.http->stop(Clock::now() + std::chrono::seconds(2));  // the drained streams' last events go out
  d.grpc->shutdown(Clock::now() + std::chrono::seconds(1));
  watchdog.stop();
  const ServiceStats stats = d.service->stats();
  spdlog::info("stopped: {} ticks, {} tokens processed, {} generated", stats.ticks, stats.tokens_processed,
               stats.tokens_generated);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // CLI11 reports command-line errors as exceptions (handled in parse_command_line); anything else that escapes
  // (std::bad_alloc, a gRPC start-up throw) becomes one line and status 1 instead of std::terminate.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kestreld: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kestreld: unknown exception\n");
  }
  return 1;
}
