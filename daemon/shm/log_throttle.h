// LogThrottle: a warning that a peer can trigger at will (a refused or failed shm connection) is logged at most
// `burst` times per `period`; the rest are counted and summarised in one line ("... 1195 more in the last 10 s"), so a
// flood of connections costs a few log lines a period while a single event is still logged at once.
//
// Threading: every method may be called from any thread. Logs through spdlog's default logger.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace kestrel::daemon {

class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;

  // `what` names the events in the summary line ("refused or failed shm connections").
  LogThrottle(std::string what, uint32_t burst, Clock::duration period);

  // Logs `line` at warning level when fewer than `burst` lines were logged in the current period; otherwise counts
  // it. A line that starts a new period is preceded by the previous period's summary, if any.
  void warn(const std::string& line);
  // Logs the summary of a period that is over, if lines were suppressed in it. Call it now and then (the shm acceptor
  // does, once a second), so a flood that stops is still reported.
  void flush();

  // Lines suppressed so far, in total (for tests and counters).
  uint64_t suppressed_total() const;

 private:
  // Under mu_: starts a new period at `now` when the current one is over, logging its summary.
  void roll(Clock::time_point now);

  const std::string what_;
  const uint32_t burst_;
  const Clock::duration period_;
  mutable std::mutex mu_;
  Clock::time_point period_start_{};  // guarded by mu_
  uint32_t logged_ = 0;               // in the current period; guarded by mu_
  uint64_t suppressed_ = 0;           // in the current period; guarded by mu_
  uint64_t suppressed_total_ = 0;     // guarded by mu_
};

}  // namespace kestrel::daemon
