// sd_notify(3) for kestreld through libsystemd: STATUS= while loading, READY=1 once serving, STOPPING=1 on SIGTERM,
// and WATCHDOG=1 from a thread while the engine loop is alive.
//
// Outside systemd ($NOTIFY_SOCKET unset) every call is a cheap no-op. Messages are sent with sd_notify(0, ...): the
// environment is left as it is (tests point $NOTIFY_SOCKET at their own datagram socket). The unit says
// NotifyAccess=main, so only the main process may notify — threads of it are fine.
//
// Thread-safety: the free functions may be called from any thread. Watchdog is started and stopped by one owner.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>

namespace kestrel::daemon::ops {

// True when $NOTIFY_SOCKET is set (kestreld runs under systemd with Type=notify).
bool notify_enabled();
// Sends `STATUS=<text>`.
void notify_status(std::string_view text);
// Sends `READY=1` and `STATUS=<text>` in one message.
void notify_ready(std::string_view status);
// Sends `STOPPING=1` and `STATUS=<text>` in one message.
void notify_stopping(std::string_view status);
// Sends `WATCHDOG=1`.
void notify_watchdog();

// The interval systemd expects WATCHDOG=1 within (WatchdogSec=, via sd_watchdog_enabled); zero when the watchdog
// is off or meant for another process.
std::chrono::microseconds watchdog_interval();

// Sends WATCHDOG=1 every `period` (half the watchdog interval) while `alive()` says the engine loop is making
// progress. When alive() returns false — or blocks, because the loop is wedged holding what it reads — no ping is
// sent and systemd restarts the service after WatchdogSec. alive() runs on the watchdog thread.
class Watchdog {
 public:
  using AliveProbe = std::function<bool()>;

  // Starts the thread; a zero period starts nothing (no watchdog configured).
  Watchdog(std::chrono::microseconds period, AliveProbe alive);
  ~Watchdog();  // stop()
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Joins the thread; idempotent. Call from the owner's thread only.
  void stop();

  bool running() const { return thread_.joinable(); }
  uint64_t pings() const { return pings_.load(std::memory_order_relaxed); }
  uint64_t missed() const { return missed_.load(std::memory_order_relaxed); }

 private:
  void run();

  std::chrono::microseconds period_;
  AliveProbe alive_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mutex_
  std::atomic<uint64_t> pings_{0}, missed_{0};
  std::thread thread_;
};

}  // namespace kestrel::daemon::ops

#include "daemon/engine/service.h"

namespace kestrel::daemon::ops {

// The watchdog's test of the engine loop from two successive ServiceStats: alive when the loop ticked since the
// previous probe, or when it had nothing to do (no queued steps: an idle loop does not tick). Work waiting while
// `ticks` stands still for a whole watchdog period means a wedged loop. Not thread-safe: one watchdog thread.
class EngineProgressProbe {
 public:
  bool operator()(const ServiceStats& stats);

 private:
  bool seen_ = false;
  uint64_t last_ticks_ = 0;
};

}  // namespace kestrel::daemon::ops
