// A warp's arrival at a device-wide counter, for kernels whose last arriver at a piece of work goes on with it
// (moe_route_dev::route_spread's grouping): the warp's writes so far are released with the
// one increment, and the warp whose arrival made the count `target` acquires what every other arriver wrote.
#pragma once

#include <cuda_runtime.h>

namespace kestrel::gpu {

__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// One arrival at *p by lane 0 after the warp's writes (__syncwarp, then a release increment); true in every lane of
// the warp whose arrival made *p equal `target`, after its acquire (read what the others wrote through L2: __ldcg).
// Release increments rather than a fence.acq_rel on each side: the device-scope acquire is paid only by the last
// arriver. Every lane of the warp calls it.
__device__ __forceinline__ bool warp_arrive(unsigned* p, unsigned target, int lane) {
  __syncwarp();
  unsigned old = 0;
  if (lane == 0) {
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
    if (old + 1 == target) fence_acq_rel_gpu();
  }
  return __shfl_sync(0xFFFFFFFFu, old, 0) + 1 == target;
}

}  // namespace kestrel::gpu
