// sd_notify messages and the watchdog thread (systemd_notify.h).
#include "daemon/ops/systemd_notify.h"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <string>

namespace kestrel::daemon::ops {

namespace {

void send(const std::string& message) {
  const int rc = sd_notify(0, message.c_str());
  if (rc < 0) spdlog::debug("sd_notify failed: {}", rc);
}

}  // namespace

bool notify_enabled() {
  const char* s = std::getenv("NOTIFY_SOCKET");  // NOLINT(concurrency-mt-unsafe): nobody sets it after start-up
  return s != nullptr && *s != '\0';
}

void notify_status(std::string_view text) {
  if (notify_enabled()) send("STATUS=" + std::string(text));
}

void notify_ready(std::string_view status) {
  if (notify_enabled()) send("READY=1\nSTATUS=" + std::string(status));
}

void notify_stopping(std::string_view status) {
  if (notify_enabled()) send("STOPPING=1\nSTATUS=" + std::string(status));
}

void notify_watchdog() {
  if (notify_enabled()) send("WATCHDOG=1");
}

std::chrono::microseconds watchdog_interval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0) return std::chrono::microseconds(0);
  return std::chrono::microseconds(static_cast<int64_t>(usec));
}

Watchdog::Watchdog(std::chrono::microseconds period, AliveProbe alive) : period_(period), alive_(std::move(alive)) {
  if (period_.count() > 0 && alive_) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    lock.unlock();
    if (alive_()) {
      notify_watchdog();
      pings_.fetch_add(1, std::memory_order_relaxed);
    } else {
      // Logged once per miss: systemd restarts the service when misses last WatchdogSec.
      missed_.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("watchdog: the engine loop made no progress; not pinging systemd");
    }
    lock.lock();
    cv_.wait_for(lock, period_, [this] { return stop_; });
  }
}

}  // namespace kestrel::daemon::ops

namespace kestrel::daemon::ops {

bool EngineProgressProbe::operator()(const ServiceStats& stats) {
  const bool ticked = !seen_ || stats.ticks != last_ticks_;
  seen_ = true;
  last_ticks_ = stats.ticks;
  return ticked || stats.queued_steps == 0;
}

}  // namespace kestrel::daemon::ops
