// configure_allocator() and MemoryTrimmer (allocator.h).
#include "daemon/ops/allocator.h"

#include <malloc.h>

#include <cstdlib>

namespace kestrel::daemon::ops {

int configure_allocator(int arenas) {
  if (const char* env = std::getenv("MALLOC_ARENA_MAX"); env != nullptr && *env != '\0') {  // NOLINT: start-up
    return std::atoi(env);
  }
  if (arenas <= 0) return 0;
  return mallopt(M_ARENA_MAX, arenas) == 1 ? arenas : 0;
}

MemoryTrimmer::MemoryTrimmer(std::chrono::milliseconds period) : period_(period) {
  if (period_.count() > 0) thread_ = std::thread([this] { run(); });
}

MemoryTrimmer::~MemoryTrimmer() { stop(); }

void MemoryTrimmer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t MemoryTrimmer::trims() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trims_;
}

void MemoryTrimmer::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
    lock.unlock();
    malloc_trim(0);
    lock.lock();
    ++trims_;
  }
}

}  // namespace kestrel::daemon::ops
