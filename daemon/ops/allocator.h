// kestreld's malloc settings (glibc). Each thread that allocates gets a malloc arena of its own, up to 8 per core, and
// kestreld has many such threads (one per shm client, gRPC's pollers and callback threads, the engine's workers); a
// freed block stays in its arena, so under a soak of 64 clients RSS kept climbing for minutes after the working set
// had stopped growing. configure_allocator() caps the arenas; MemoryTrimmer hands free
// pages of every arena back to the kernel now and then (malloc_trim), which keeps RSS at the working set.
//
// configure_allocator() runs once in main() before threads exist; MemoryTrimmer's methods from its owner's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace kestrel::daemon::ops {

// M_ARENA_MAX = `arenas`, unless MALLOC_ARENA_MAX is set in the environment (glibc then applies it itself; it stays the
// operator's choice). Returns the value in force (0: glibc's default).
int configure_allocator(int arenas = 4);

// A thread that calls malloc_trim(0) every `period` (0: starts nothing). Stopped and joined by stop() or the
// destructor.
class MemoryTrimmer {
 public:
  explicit MemoryTrimmer(std::chrono::milliseconds period);
  ~MemoryTrimmer();  // stop()
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  void stop();
  uint64_t trims() const;

 private:
  void run();

  std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;   // guarded by mu_
  uint64_t trims_ = 0;  // guarded by mu_
  std::thread thread_;
};

}  // namespace kestrel::daemon::ops
