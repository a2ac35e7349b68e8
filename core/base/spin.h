// Busy-wait helpers shared by the threads that spin before they sleep or between polls (cpu/worker_pool, the hybrid
// hand-off's host thread in gpu/engine/host_expert_link, the shm fast path's doorbell in proto/kestrel/shm).
#pragma once

namespace kestrel {

// Iterations of cpu_relax() a waiting thread spins before it sleeps: about 50-100 µs of pause instructions.
inline constexpr int kSpinIterations = 20000;

// Tells the core this thread is spinning (x86 pause, arm64 yield: less power, the sibling hyper-thread runs); a no-op
// elsewhere.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace kestrel
