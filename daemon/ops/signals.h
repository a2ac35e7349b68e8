// Signal handling for kestreld: SIGTERM, SIGINT and SIGHUP are blocked in every thread and read by one thread from a
// signalfd, so no code runs in signal context and no thread is interrupted mid-call.
//
//   first SIGTERM / SIGINT   wait_for_stop() returns: main() drains (STOPPING=1, health NOT_SERVING, in-flight work
//                            gets stop_timeout_s) and exits 0
//   second SIGTERM / SIGINT  on_force_stop runs on the signal thread (main() passes one that exits at once)
//   SIGHUP                   logged and ignored: the configuration is read at start only (restart to change it)
//
// SignalWatcher::start() must run in main() before any other thread exists (threads inherit the blocked mask).
// Thread-safety: wait_for_stop() and request_stop() may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "core/base/expected.h"

namespace kestrel::daemon::ops {

class SignalWatcher {
 public:
  using ForceStop = std::function<void(int signal)>;

  // Blocks the three signals in the calling thread and starts the signal thread. kIo when signalfd/eventfd fail.
  static Expected<std::unique_ptr<SignalWatcher>> start(ForceStop on_force_stop);
  ~SignalWatcher();  // stops the signal thread; the signals stay blocked
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // Blocks until the first SIGTERM/SIGINT (or request_stop()); returns the signal number.
  int wait_for_stop();
  // Like wait_for_stop() with a time limit; 0 when it passed without a signal.
  int wait_for_stop_for(std::chrono::milliseconds timeout);
  // Behaves as if `signal` had arrived (counts toward the second-signal force stop).
  void request_stop(int signal);

  uint32_t stop_signals() const { return stop_count_.load(); }
  uint32_t hangups() const { return hup_count_.load(); }

 private:
  SignalWatcher(int signal_fd, int wake_fd, ForceStop on_force_stop);
  void run();
  void on_stop_signal(int signal);

  int signal_fd_;
  int wake_fd_;
  ForceStop on_force_stop_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int stop_signal_ = 0;  // guarded by mutex_
  std::atomic<uint32_t> stop_count_{0}, hup_count_{0};
  std::thread thread_;
};

}  // namespace kestrel::daemon::ops
