// Busy-wait helpers shared by the threads that spin before they sleep (cpu/worker_pool, cpu/expert_backend, the
// hybrid hand-off's host thread in gpu/engine/host_expert_link).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kestrel {

// Iterations of cpu_relax() a waiting thread spins before it sleeps: about 50-100 µs of pause instructions.
inline constexpr int kSpinIterations = 20000;

// Tells the core this thread is spinning (x86 pause: less power, the sibling hyper-thread runs); a no-op elsewhere.
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

}  // namespace kestrel
