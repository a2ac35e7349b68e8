// LogThrottle (log_throttle.h).
#include "daemon/shm/log_throttle.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace kestrel::daemon {

LogThrottle::LogThrottle(std::string what, uint32_t burst, Clock::duration period)
    : what_(std::move(what)), burst_(burst), period_(period) {}

void LogThrottle::roll(Clock::time_point now) {
  if (now - period_start_ < period_) return;
  if (suppressed_ > 0) {
    const double seconds = std::chrono::duration<double>(period_).count();
    spdlog::warn("{} more {} in the last {:g} s, not logged one by one", suppressed_, what_, seconds);
  }
  period_start_ = now;
  logged_ = 0;
  suppressed_ = 0;
}

void LogThrottle::warn(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  roll(Clock::now());
  if (logged_ < burst_) {
    ++logged_;
    spdlog::warn("{}", line);
    return;
  }
  ++suppressed_;
  ++suppressed_total_;
}

void LogThrottle::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (suppressed_ > 0) roll(Clock::now());
}

uint64_t LogThrottle::suppressed_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return suppressed_total_;
}

}  // namespace kestrel::daemon
