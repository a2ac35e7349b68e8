// Test helpers for the integration tests: a real kestreld process on sockets in a fresh temporary folder, and child
// processes (the `kestrel` CLI, itest_client, python3) with their stdout captured.
//
// DaemonProcess::start() makes /tmp/kestrel-it-XXXXXX, runs kestreld there (--socket, --shm-socket, --cache-dir
// inside it, log to kestreld.log in it) and waits until it answers ServerStatus with serving=true. The destructor
// kills a daemon still running (SIGKILL) and removes the folder. Not thread-safe; one owner (the test body).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/lib/client.h"
#include "core/base/expected.h"

namespace kestrel::itest {

struct DaemonOptions {
  std::string model;  // empty: kestreld's embedded default model (made in the temporary cache folder)
  std::vector<std::string> extra_args;
  int stop_timeout_s = 10;
  std::chrono::seconds start_timeout{60};
};

// The options for `model` with a stop timeout of `stop_timeout_s` seconds.
inline DaemonOptions model_options(std::string model, int stop_timeout_s = 10) {
  DaemonOptions o;
  o.model = std::move(model);
  o.stop_timeout_s = stop_timeout_s;
  return o;
}

class DaemonProcess {
 public:
  static Expected<std::unique_ptr<DaemonProcess>> start(const DaemonOptions& options);
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  std::string grpc_uri() const { return "unix://" + socket_; }
  std::string shm_uri() const { return "shm://" + shm_socket_; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }
  // The daemon's log so far (stdout and stderr).
  std::string log() const;

  // Sends SIGTERM and waits up to `limit` for the exit. Returns the exit status (128+signal when killed by one), or
  // -1 when it did not exit in time (then it is killed). *seconds gets the time from SIGTERM to exit.
  int terminate(std::chrono::milliseconds limit, double* seconds = nullptr);

  // A client on gRPC (Unix socket) or shm.
  Expected<std::unique_ptr<client::Client>> connect_grpc(std::chrono::milliseconds timeout = {}) const;
  Expected<std::unique_ptr<client::Client>> connect_shm(std::chrono::milliseconds timeout = {}) const;

 private:
  DaemonProcess() = default;
  std::string dir_, socket_, shm_socket_;
  pid_t pid_ = -1;
};

// A child process with stdout captured through a pipe (stderr goes to the test's stderr unless `merge_stderr`).
class ChildProcess {
 public:
  static Expected<std::unique_ptr<ChildProcess>> spawn(const std::vector<std::string>& argv,
                                                       const std::vector<std::string>& env = {},
                                                       bool merge_stderr = false);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads stdout until a line is complete or `timeout` passes; false at EOF / timeout.
  bool read_line(std::string* line, std::chrono::milliseconds timeout);
  // Reads stdout to EOF, waits for the exit; returns the exit status (128+signal when killed).
  int wait(std::string* out);
  void kill_now(int sig);

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffered_;
  bool reaped_ = false;
};

// Runs argv to completion; returns {exit status, stdout}.
std::pair<int, std::string> run_command(const std::vector<std::string>& argv, bool merge_stderr = false);

// Entries of /dev/shm whose name contains "kestrel".
std::vector<std::string> kestrel_shm_entries();

}  // namespace kestrel::itest
