// pdl.cuh: programmatic dependent launch (PDL, sm_90) for chains of kernels on one stream.
//
// A kernel launched with launch_programmatic() may start while the kernel before it on the stream is still running,
// once every block of that kernel has called pdl_trigger() (or exited). Each such kernel calls pdl_trigger() and then
// pdl_wait() before it touches memory: the wait returns when the kernel before it has completed and its writes are
// visible, so results do not depend on the overlap — what overlaps is the launch itself (block scheduling, parameter
// load, the first instructions), which otherwise sits between every pair of dependent kernels. The kernel before
// triggered only after all its own blocks were resident, so the waiting blocks never keep it from running. Without
// the launch attribute both calls are no-ops.
// Before the wait a kernel may read only memory that no kernel which may still be running writes — the kernels before
// it may be: resident weights (gemv_imma's dense calls load their first weights there, overlapping the end of the
// kernel before), or a layer's recurrent state, written only by that layer's own step a decode step earlier
// (gdn_decode's one-kernel forms load their S slices there). After the wait, what the kernels before wrote is read
// with ordinary loads (ld_dep below), never ld.global.nc.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/base/expected.h"
#include "gpu/cuda_check.h"

namespace kestrel::gpu {

// Lets the next kernel on the stream, if launched programmatically, begin launching.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the kernel before this one on the stream has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The launch attribute that makes a cudaLaunchKernelEx launch a programmatic dependent of the kernel before it (for
// launches that carry other attributes too, e.g. a cluster shape).
inline cudaLaunchAttribute programmatic_attribute() {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return attr;
}

// What a kernel before this one on the stream wrote, read after pdl_wait(): an ordinary load (ld.global.ca, cached in
// L1), never the non-coherent ld.global.nc that __ldg or a const __restrict__ pointer gives. A non-coherent load
// promises the data is read-only for the kernel's whole lifetime, so ptxas may schedule it ahead of
// griddepcontrol.wait — and under a programmatic launch the kernel before is still writing it then. Found on the H200:
// the grouped GEMV's two-pair kernel, launched programmatically at 32 tokens, read its table's count (n_used) as the
// scratch's garbage and skipped every segment, though its PTX loads nothing before the wait (test_moe_imma, segments
// of 3 vectors with programmatic launches at every size). Resident weights, which no kernel writes, keep ld.global.nc.
template <class T>
__device__ __forceinline__ T ld_dep(const T* p) {
  return __ldca(p);
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the kernel before it on
// the stream when `programmatic` (the kernel must call pdl_wait() before it touches memory the kernels before it may
// write).
template <class... KArgs, class... Args>
Status launch_programmatic(bool programmatic, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                           cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr = programmatic_attribute();
  cfg.attrs = &attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  KESTREL_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  return ok_status();
}

}  // namespace kestrel::gpu
