// bench_soak: kestreld under a sustained mixed load, as many programs use it at once. It starts a kestreld child
// (by default `--engine cpu` on the embedded tiny model), runs --clients client threads for --duration seconds, each
// on its own connection — in turn gRPC (Unix socket), the shm fast path and the OpenAI-compatible HTTP API (kestreld
// --http on a free loopback port), as --transports lists them — looping over Steps (a prompt, then the sampled token
// fed back; over HTTP a one-token completion) and Generates (16 tokens; over HTTP a streamed completion) on sessions
// of their own, and samples the daemon's resident memory, open file descriptors and threads every second. Then it
// sends SIGTERM and checks that kestreld exits 0.
//
// With --engine cuda it asks for one device slot per client (--cuda-slots), so that every client can hold a session.
// A request refused for want of a session (RESOURCE_EXHAUSTED, HTTP 429) is counted apart from errors, and its client
// waits 20 ms before it asks again.
//
// It prints, per operation and transport: requests, refusals, errors (with the first messages), p50 / p99 / max
// latency; the daemon's RSS, fds and threads at the start (all clients connected), middle and end, and RSS's range
// over the second half (a leak shows as growth there); and the command line. docs/benchmarks.md has the figures and the
// reason for kestreld's allocator setting. Transports are behind SoakTransport (soak_transport.h).
//
//   bench_soak [--kestreld PATH] [--clients 64] [--duration 600] [--engine cpu] [--threads 2] [--model GGUF]
//              [--transports grpc,shm,http] [--env NAME=VALUE]... [--daemon-arg ARG]...
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/daemon/soak_transport.h"
#include "client/cli/cli11.h"
#include "client/lib/client.h"

namespace kestrel::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// How long a client waits after the daemon refused it a session before it asks again.
constexpr int kRefusedBackoffMs = 20;

struct Options {
  std::string kestreld = KESTRELD_PATH;
  std::string model;  // empty: kestreld's embedded default model
  std::string engine = "cpu";
  int threads = 0;  // 0: kestreld's default
  int clients = 64;
  int duration_s = 600;
  std::vector<std::string> env;  // NAME=VALUE for kestreld
  std::vector<std::string> daemon_args;
  std::string cache_dir;                                          // where the default model is kept between runs
  std::vector<std::string> transports = {"grpc", "shm", "http"};  // clients are given these in turn
};

// A loopback TCP port that was free a moment ago (for kestreld --http).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

// One sample of the daemon process.
struct ProcSample {
  double t_s = 0;
  uint64_t rss = 0;  // bytes
  int fds = 0;
  int threads = 0;
};

ProcSample sample_process(pid_t pid, double t_s) {
  ProcSample s;
  s.t_s = t_s;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss = std::stoull(line.substr(6)) * 1024;
    if (line.rfind("Threads:", 0) == 0) s.threads = std::stoi(line.substr(8));
  }
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    ++s.fds;
  }
  return s;
}

// kestreld in a temporary folder; SIGKILLed by the destructor unless stop() was called.
class Daemon {
 public:
  static Expected<std::unique_ptr<Daemon>> start(const Options& o) {
    std::unique_ptr<Daemon> d(new Daemon());
    std::string tmpl = (fs::temp_directory_path() / "kestrel-soak-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return make_error(ErrorCode::kIo, "mkdtemp failed");
    d->dir_ = tmpl;
    const std::string sock = d->dir_ + "/k.sock";
    const std::string shm = d->dir_ + "/k-shm.sock";
    d->grpc_uri_ = "unix://" + sock;
    d->shm_uri_ = "shm://" + shm;
    std::vector<std::string> args = {o.kestreld, "--socket",    sock,        "--shm-socket",   shm, "--engine",
                                     o.engine,   "--cache-dir", o.cache_dir, "--stop-timeout", "10"};
    if (std::find(o.transports.begin(), o.transports.end(), "http") != o.transports.end()) {
      const int port = free_port();
      if (port == 0) return make_error(ErrorCode::kIo, "no free loopback port for kestreld --http");
      d->http_uri_ = "http://127.0.0.1:" + std::to_string(port);
      args.insert(args.end(), {"--http", "127.0.0.1:" + std::to_string(port)});
    }
    if (!o.model.empty()) args.insert(args.end(), {"--model", o.model});
    if (o.threads > 0) args.insert(args.end(), {"--threads", std::to_string(o.threads)});
    if (o.engine == "cuda") args.insert(args.end(), {"--cuda-slots", std::to_string(o.clients)});
    args.insert(args.end(), o.daemon_args.begin(), o.daemon_args.end());
    const std::string log = d->dir_ + "/kestreld.log";
    d->pid_ = fork();
    if (d->pid_ < 0) return make_error(ErrorCode::kIo, "fork failed");
    if (d->pid_ == 0) {
      for (const std::string& e : o.env) putenv(const_cast<char*>(e.c_str()));
      FILE* f = std::freopen(log.c_str(), "w", stderr);
      if (f == nullptr) _exit(126);
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
        d->pid_ = -1;
        return make_error(ErrorCode::kUnavailable, "kestreld exited during start-up; see " + log);
      }
      if (auto c = client::Client::connect(d->grpc_uri_)) {
        if (auto st = (*c)->server_status(); st && st->serving()) return d;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return make_error(ErrorCode::kDeadlineExceeded, "kestreld did not serve within 300 s; see " + log);
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // SIGTERM; the exit status (128 + signal when killed), -1 when it did not exit within 30 s.
  int stop() {
    kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  pid_t pid() const { return pid_; }
  const std::string& grpc_uri() const { return grpc_uri_; }
  const std::string& shm_uri() const { return shm_uri_; }
  // The URI of a transport named in Options::transports.
  const std::string& uri(const std::string& transport) const {
    return transport == "grpc" ? grpc_uri_ : transport == "shm" ? shm_uri_ : http_uri_;
  }

 private:
  Daemon() = default;
  pid_t pid_ = -1;
  std::string dir_, grpc_uri_, shm_uri_, http_uri_;
};

// Latencies, refusals and errors of one (operation, transport) pair. A refusal is the daemon's RESOURCE_EXHAUSTED
// (HTTP 429) when every session or queue place is taken: a clear answer, counted apart from errors.
struct OpStats {
  std::vector<double> ms;
  uint64_t refused = 0;
  uint64_t errors = 0;
  std::vector<std::string> first_errors;  // up to 3 (errors first, else refusals)
};

class Recorder {
 public:
  void add(SoakOp op, const std::string& transport, double ms, const Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    OpStats& s = stats_[{soak_op_name(op), transport}];
    if (st) {
      s.ms.push_back(ms);
    } else if (st.error().code == ErrorCode::kResourceExhausted) {
      ++s.refused;
      if (s.first_errors.empty()) s.first_errors.push_back(st.error().message);
    } else {
      if (s.errors == 0) s.first_errors.clear();
      ++s.errors;
      if (s.first_errors.size() < 3) s.first_errors.push_back(st.error().message);
    }
  }
  std::map<std::pair<std::string, std::string>, OpStats> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(stats_);
  }

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, OpStats> stats_;
};

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

int run(const Options& o, const std::string& command_line) {
  auto daemon = Daemon::start(o);
  if (!daemon) {
    std::fprintf(stderr, "bench_soak: %s\n", daemon.error().message.c_str());
    return 1;
  }
  Daemon& d = **daemon;
  SoakWork work;
  Recorder recorder;
  std::atomic<bool> stop{false};
  std::atomic<int> connected{0};
  std::atomic<int> connect_failures{0};
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::seconds(o.duration_s);
  std::vector<std::thread> clients;
  for (int i = 0; i < o.clients; ++i) {
    clients.emplace_back([&, i] {
      const std::string uri = d.uri(o.transports[static_cast<size_t>(i) % o.transports.size()]);
      auto t = make_soak_transport(uri, work);
      if (!t) {
        ++connect_failures;
        std::fprintf(stderr, "client %d: %s\n", i, t.error().message.c_str());
        return;
      }
      ++connected;
      std::mt19937_64 rng(static_cast<uint64_t>(i) + 1);
      const std::vector<SoakOp> ops = (*t)->ops();
      // Mostly steps, as an interactive program sends them, with a Generate every few steps.
      for (uint64_t n = 0; !stop.load(std::memory_order_relaxed) && Clock::now() < end; ++n) {
        const SoakOp op = (n % 5 == 4 && ops.size() > 1) ? ops[1] : ops[0];
        const auto start = Clock::now();
        const Status st = (*t)->run(op, rng);
        recorder.add(op, (*t)->name(), std::chrono::duration<double, std::milli>(Clock::now() - start).count(), st);
        // Refused for want of a session: back off as a client that respects the answer would, instead of asking
        // again at once.
        if (!st && st.error().code == ErrorCode::kResourceExhausted) {
          std::this_thread::sleep_for(std::chrono::milliseconds(kRefusedBackoffMs));
        }
      }
    });
  }
  while (connected.load() + connect_failures.load() < o.clients)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::vector<ProcSample> samples;
  const auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  samples.push_back(sample_process(d.pid(), since()));
  while (Clock::now() < end) {
    std::this_thread::sleep_until(std::min(end, Clock::now() + std::chrono::seconds(1)));
    samples.push_back(sample_process(d.pid(), since()));
  }
  stop.store(true);
  for (std::thread& t : clients) t.join();
  const ProcSample last = sample_process(d.pid(), since());
  auto status_client = client::Client::connect(d.grpc_uri());
  uint32_t sessions_left = 0;
  if (status_client) {
    if (auto st = (*status_client)->server_status()) sessions_left = st->sessions();
  }
  status_client = make_error(ErrorCode::kCancelled, "closed");
  const int exit_status = d.stop();

  std::ostringstream mix;
  for (size_t k = 0; k < o.transports.size(); ++k) {
    int n = 0;
    for (int i = 0; i < o.clients; ++i) n += static_cast<size_t>(i) % o.transports.size() == k ? 1 : 0;
    mix << (k ? ", " : "") << n << " " << o.transports[k];
  }
  std::printf("bench_soak: %d clients (%s; %d failed to connect), %d s, kestreld --engine %s\n", o.clients,
              mix.str().c_str(), connect_failures.load(), o.duration_s, o.engine.c_str());
  std::printf(
      "\n| operation | transport | requests | refused | errors | p50 ms | p99 ms | max ms |\n"
      "|---|---|---|---|---|---|---|---|\n");
  auto stats = recorder.take();
  uint64_t total_errors = 0;
  for (auto& [key, s] : stats) {
    total_errors += s.errors;
    const double p50 = percentile(s.ms, 0.50), p99 = percentile(s.ms, 0.99);
    const double max = s.ms.empty() ? 0 : *std::max_element(s.ms.begin(), s.ms.end());
    std::printf("| %s | %s | %zu | %llu | %llu | %.2f | %.2f | %.1f |\n", key.first.c_str(), key.second.c_str(),
                s.ms.size(), static_cast<unsigned long long>(s.refused), static_cast<unsigned long long>(s.errors), p50,
                p99, max);
  }
  for (auto& [key, s] : stats) {
    for (const std::string& e : s.first_errors) {
      std::printf("%s (%s, %s): %s\n", s.errors > 0 ? "error" : "refused", key.first.c_str(), key.second.c_str(),
                  e.c_str());
    }
  }
  const ProcSample& first = samples.front();
  const ProcSample& middle = samples[samples.size() / 2];
  std::printf("\n| kestreld | start (%.0f s) | middle (%.0f s) | end, clients gone (%.0f s) |\n|---|---|---|---|\n",
              first.t_s, middle.t_s, last.t_s);
  std::printf("| RSS | %s | %s | %s |\n", mib(first.rss).c_str(), mib(middle.rss).c_str(), mib(last.rss).c_str());
  std::printf("| open fds | %d | %d | %d |\n", first.fds, middle.fds, last.fds);
  std::printf("| threads | %d | %d | %d |\n", first.threads, middle.threads, last.threads);
  std::printf("\nRSS every tenth of the run:");
  for (int k = 0; k <= 10; ++k) {
    const ProcSample& s = samples[std::min(samples.size() - 1, samples.size() * static_cast<size_t>(k) / 10)];
    std::printf(" %.0f", static_cast<double>(s.rss) / (1 << 20));
  }
  std::printf(" MiB (after the clients closed: %.0f MiB)\n", static_cast<double>(last.rss) / (1 << 20));
  uint64_t lo = ~uint64_t{0}, hi = 0;
  for (size_t i = samples.size() / 2; i < samples.size(); ++i) {
    lo = std::min(lo, samples[i].rss);
    hi = std::max(hi, samples[i].rss);
  }
  std::printf(
      "\nRSS over the second half: %s .. %s (range %s); sessions left after the clients closed: %u; "
      "kestreld exit status after SIGTERM: %d\n",
      mib(lo).c_str(), mib(hi).c_str(), mib(hi - lo).c_str(), sessions_left, exit_status);
  std::printf("command: %s\n", command_line.c_str());
  return total_errors == 0 && exit_status == 0 && connect_failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kestrel::bench

int main(int argc, char** argv) {
  kestrel::bench::Options o;
  o.cache_dir = (std::filesystem::temp_directory_path() / "kestrel-soak-cache").string();
  CLI::App app{"bench_soak: kestreld under many gRPC, shm and HTTP clients for a while; latency, errors, RSS and fds"};
  app.add_option("--kestreld", o.kestreld, "the kestreld binary")->capture_default_str();
  app.add_option("--model", o.model, "GGUF model (default: kestreld's embedded tiny model)");
  app.add_option("--engine", o.engine, "kestreld --engine")->capture_default_str();
  app.add_option("--threads", o.threads, "kestreld --threads (CPU engine; 0: its default)")->capture_default_str();
  app.add_option("-c,--clients", o.clients, "client connections, given the transports in turn")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("-d,--duration", o.duration_s, "seconds of load")->capture_default_str()->check(CLI::Range(1, 86400));
  app.add_option("--transports", o.transports, "transports the clients use in turn: grpc, shm, http")
      ->delimiter(',')
      ->check(CLI::IsMember({"grpc", "shm", "http"}))
      ->capture_default_str();
  app.add_option("--env", o.env, "NAME=VALUE in kestreld's environment (repeatable), e.g. MALLOC_ARENA_MAX=2");
  app.add_option("--daemon-arg", o.daemon_args, "one more kestreld argument (repeatable)");
  app.add_option("--cache-dir", o.cache_dir, "kestreld --cache-dir (the default model is made there once)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
  return kestrel::bench::run(o, command_line);
}
