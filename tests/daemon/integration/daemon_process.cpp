// kestreld and child processes for the integration tests (daemon_process.h).
#include "tests/daemon/integration/daemon_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#ifndef KESTRELD_PATH
#error "KESTRELD_PATH must name the kestreld binary"
#endif

namespace kestrel::itest {
namespace {

using Ms = std::chrono::milliseconds;

int exit_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// fork + exec with stdout to `out_fd` (or a file), stderr to `err_fd`; the child gets its own process group so a
// test's Ctrl-C does not reach it twice.
Expected<pid_t> spawn_raw(const std::vector<std::string>& argv, const std::vector<std::string>& env, int out_fd,
                          int err_fd, int close_fd) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return make_error(ErrorCode::kIo, std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    if (close_fd >= 0) close(close_fd);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
    if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

}  // namespace

Expected<std::unique_ptr<DaemonProcess>> DaemonProcess::start(const DaemonOptions& o) {
  std::unique_ptr<DaemonProcess> d(new DaemonProcess());
  char tmpl[] = "/tmp/kestrel-it-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return make_error(ErrorCode::kIo, std::string("mkdtemp: ") + std::strerror(errno));
  d->dir_ = tmpl;
  d->socket_ = d->dir_ + "/kestreld.sock";
  d->shm_socket_ = d->dir_ + "/kestreld-shm.sock";
  std::vector<std::string> argv = {KESTRELD_PATH,
                                   "--socket",
                                   d->socket_,
                                   "--shm-socket",
                                   d->shm_socket_,
                                   "--cache-dir",
                                   d->dir_ + "/cache",
                                   "--stop-timeout",
                                   std::to_string(o.stop_timeout_s),
                                   "--log-format",
                                   "text"};
  if (!o.model.empty()) {
    argv.push_back("--model");
    argv.push_back(o.model);
  }
  // KESTREL_ITEST_ENGINE runs every test's daemon on that engine (e.g. cuda on a GPU machine); unset: the default.
  if (const char* engine = std::getenv("KESTREL_ITEST_ENGINE"); engine != nullptr && *engine != '\0') {
    argv.push_back("--engine");
    argv.push_back(engine);
    argv.push_back("--cuda-slots");  // the tests open up to max_sessions (256) sessions of the tiny model
    argv.push_back("256");
  }
  argv.insert(argv.end(), o.extra_args.begin(), o.extra_args.end());
  const std::string log_path = d->dir_ + "/kestreld.log";
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return make_error(ErrorCode::kIo, "cannot create " + log_path);
  auto pid = spawn_raw(argv, {}, log_fd, log_fd, -1);
  close(log_fd);
  if (!pid) return pid.error();
  d->pid_ = *pid;

  const auto deadline = std::chrono::steady_clock::now() + o.start_timeout;
  std::string last_error = "no answer";
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
      d->pid_ = -1;
      return make_error(ErrorCode::kUnavailable, "kestreld exited with status " + std::to_string(exit_status(status)) +
                                                     " while starting: " + d->log());
    }
    if (std::filesystem::exists(d->socket_)) {
      auto c = d->connect_grpc(Ms(2000));
      if (c) {
        auto st = (*c)->server_status();
        if (st && st->serving()) return d;
        last_error = st ? "not serving yet" : st.error().message;
      } else {
        last_error = c.error().message;
      }
    }
    std::this_thread::sleep_for(Ms(50));
  }
  return make_error(ErrorCode::kDeadlineExceeded,
                    "kestreld did not serve within the start timeout (" + last_error + "); log: " + d->log());
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string DaemonProcess::log() const {
  std::ifstream in(dir_ + "/kestreld.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int DaemonProcess::terminate(Ms limit, double* seconds) {
  if (pid_ <= 0) return -1;
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(pid_, SIGTERM);
  while (std::chrono::steady_clock::now() - t0 < limit) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (seconds != nullptr) {
        *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      return exit_status(status);
    }
    std::this_thread::sleep_for(Ms(10));
  }
  ::kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

Expected<std::unique_ptr<client::Client>> DaemonProcess::connect_grpc(Ms timeout) const {
  client::ClientOptions opt;
  opt.timeout = timeout;
  return client::Client::connect(grpc_uri(), opt);
}

Expected<std::unique_ptr<client::Client>> DaemonProcess::connect_shm(Ms timeout) const {
  client::ClientOptions opt;
  opt.timeout = timeout;
  return client::Client::connect(shm_uri(), opt);
}

Expected<std::unique_ptr<ChildProcess>> ChildProcess::spawn(const std::vector<std::string>& argv,
                                                            const std::vector<std::string>& env, bool merge_stderr) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return make_error(ErrorCode::kIo, std::string("pipe: ") + std::strerror(errno));
  auto pid = spawn_raw(argv, env, fds[1], merge_stderr ? fds[1] : -1, fds[0]);
  close(fds[1]);
  if (!pid) {
    close(fds[0]);
    return pid.error();
  }
  std::unique_ptr<ChildProcess> c(new ChildProcess());
  c->pid_ = *pid;
  c->out_fd_ = fds[0];
  return c;
}

ChildProcess::~ChildProcess() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

bool ChildProcess::read_line(std::string* line, Ms timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto nl = buffered_.find('\n'); nl != std::string::npos) {
      *line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return true;
    }
    const auto left = std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof buf);
    if (n <= 0) return false;
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

int ChildProcess::wait(std::string* out) {
  std::string all = buffered_;
  buffered_.clear();
  char buf[4096];
  for (ssize_t n; (n = read(out_fd_, buf, sizeof buf)) > 0;) all.append(buf, static_cast<size_t>(n));
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
  if (out != nullptr) *out = std::move(all);
  return exit_status(status);
}

void ChildProcess::kill_now(int sig) { ::kill(pid_, sig); }

std::pair<int, std::string> run_command(const std::vector<std::string>& argv, bool merge_stderr) {
  auto child = ChildProcess::spawn(argv, {}, merge_stderr);
  if (!child) return {-1, child.error().message};
  std::string out;
  const int rc = (*child)->wait(&out);
  return {rc, out};
}

std::vector<std::string> kestrel_shm_entries() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find("kestrel") != std::string::npos) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace kestrel::itest
