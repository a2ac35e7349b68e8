// smem_optin.cuh: a kernel's dynamic shared memory above the default 48 KiB. The limit is an attribute of the kernel
// (cudaFuncAttributeMaxDynamicSharedMemorySize), so it is raised once per kernel to everything the device allows, and
// each launch only compares its bytes with that limit — not one cudaFuncSetAttribute per launch on the host's path.
// Host code; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include "core/base/expected.h"

namespace kestrel::gpu {

// The dynamic shared memory a block of kKernel may use: the device's opt-in maximum less the kernel's static shared
// memory, set on the kernel by the first call (thread-safe: a function-local static); 48 KiB less the static part when
// a query or the attribute fails. A failed call's error is cleared here, so that the cudaGetLastError() after the
// next launch reports that launch alone.
template <auto kKernel>
int smem_optin() {
  static const int limit = [] {
    int dev = 0;
    int v = 0;
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, kKernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return 48 * 1024;  // no device, or no image of the kernel for it: the launch reports why
    }
    const int static_bytes = static_cast<int>(fa.sharedSizeBytes);
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v - static_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 48 * 1024 - static_bytes;
    }
    return v - static_bytes;
  }();
  return limit;
}

// kInvalidArgument naming what() when a launch of kKernel needs more than smem_optin() bytes. `what` returns the
// message's subject and is called only then, so a launch that fits builds no string.
template <auto kKernel, class What>
requires std::is_invocable_r_v<std::string, What> Status check_smem(size_t bytes, What&& what) {
  const int limit = smem_optin<kKernel>();
  if (bytes <= static_cast<size_t>(limit)) return ok_status();
  return make_error(ErrorCode::kInvalidArgument, what() + " needs " + std::to_string(bytes) +
                                                     " bytes of shared memory per block (the device gives " +
                                                     std::to_string(limit) + ")");
}

// The same with a fixed subject.
template <auto kKernel>
Status check_smem(size_t bytes, const char* what) {
  return check_smem<kKernel>(bytes, [what] { return std::string(what); });
}

}  // namespace kestrel::gpu
