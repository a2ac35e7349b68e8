// The signal thread: signalfd for SIGTERM/SIGINT/SIGHUP plus an eventfd to stop it (signals.h).
#include "daemon/ops/signals.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>

namespace kestrel::daemon::ops {

namespace {

sigset_t watched_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

std::string errno_text(int err) { return std::generic_category().message(err); }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "signal";
  }
}

}  // namespace

Expected<std::unique_ptr<SignalWatcher>> SignalWatcher::start(ForceStop on_force_stop) {
  const sigset_t set = watched_signals();
  if (const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0) {
    return make_error(ErrorCode::kIo, "pthread_sigmask: " + errno_text(rc));
  }
  const int sfd = ::signalfd(-1, &set, SFD_CLOEXEC);
  if (sfd < 0) return make_error(ErrorCode::kIo, "signalfd: " + errno_text(errno));
  const int efd = ::eventfd(0, EFD_CLOEXEC);
  if (efd < 0) {
    const int err = errno;
    ::close(sfd);
    return make_error(ErrorCode::kIo, "eventfd: " + errno_text(err));
  }
  return std::unique_ptr<SignalWatcher>(new SignalWatcher(sfd, efd, std::move(on_force_stop)));
}

SignalWatcher::SignalWatcher(int signal_fd, int wake_fd, ForceStop on_force_stop)
    : signal_fd_(signal_fd), wake_fd_(wake_fd), on_force_stop_(std::move(on_force_stop)) {
  thread_ = std::thread([this] { run(); });
}

SignalWatcher::~SignalWatcher() {
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof one) < 0) spdlog::error("signal thread: eventfd write: {}", errno_text(errno));
  if (thread_.joinable()) thread_.join();
  ::close(signal_fd_);
  ::close(wake_fd_);
}

int SignalWatcher::wait_for_stop() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return stop_signal_ != 0; });
  return stop_signal_;
}

int SignalWatcher::wait_for_stop_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [this] { return stop_signal_ != 0; });
  return stop_signal_;
}

void SignalWatcher::request_stop(int signal) { on_stop_signal(signal); }

void SignalWatcher::on_stop_signal(int signal) {
  const uint32_t n = stop_count_.fetch_add(1) + 1;
  if (n == 1) {
    spdlog::info("{}: draining (a second one stops at once)", signal_name(signal));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_signal_ = signal;
    }
    cv_.notify_all();
    return;
  }
  spdlog::warn("{} again: stopping at once", signal_name(signal));
  if (on_force_stop_) on_force_stop_(signal);
}

void SignalWatcher::run() {
  pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("signal thread: poll: {}", errno_text(errno));
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    signalfd_siginfo info{};
    const ssize_t n = ::read(signal_fd_, &info, sizeof info);
    if (n != static_cast<ssize_t>(sizeof info)) continue;
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGHUP) {
      hup_count_.fetch_add(1);
      spdlog::info("SIGHUP ignored: the configuration is read at start only; restart kestreld to apply changes");
      continue;
    }
    on_stop_signal(sig);
  }
}

}  // namespace kestrel::daemon::ops
