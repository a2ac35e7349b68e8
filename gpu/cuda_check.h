// CUDA runtime errors as Kestrel Errors (errors are values; nothing throws).
//
//   KESTREL_CUDA_TRY(cudaMemcpyAsync(...));   // in a function returning Status or Expected<T>
//   Status s = cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize", __FILE__, __LINE__);
//
// The message names the call, file:line and cudaGetErrorString/cudaGetErrorName; the code maps out-of-memory to
// kResourceExhausted, a missing device or driver to kFailedPrecondition, invalid arguments to kInvalidArgument and
// the rest to kInternal. Thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/base/expected.h"

namespace kestrel::gpu {

Error cuda_error(cudaError_t err, const char* what, const char* file, int line);
Status cuda_status(cudaError_t err, const char* what, const char* file, int line);

// cudaMemcpy and cudaMemset with the whole device idle on both sides, for memory that work on non-blocking streams
// then uses (or copies of what such streams wrote). Non-blocking streams do not wait for the legacy stream: a
// cudaMemset is queued there and returns at once, and a host-to-device cudaMemcpy from pageable memory returns once
// its bytes are staged, before the DMA lands, so a kernel launched next on such a stream may run before either lands
// (seen in the GPU tests on an H100 that other processes shared, which delayed the legacy stream: a NaN fill landing
// over a kernel's output, counters zeroed after the first kernel had counted). Nor does a copy back wait for those
// streams.
inline cudaError_t memcpy_synced(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(dst, src, bytes, kind);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e;
}
inline cudaError_t memset_synced(void* dst, int value, size_t bytes) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemset(dst, value, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e;
}

}  // namespace kestrel::gpu

// Returns the error (as Error) from the enclosing function when `expr` is not cudaSuccess.
#define KESTREL_CUDA_TRY(expr)                                                         \
  do {                                                                                 \
    const cudaError_t kestrel_cuda_err_ = (expr);                                      \
    if (kestrel_cuda_err_ != cudaSuccess) {                                            \
      return ::kestrel::gpu::cuda_error(kestrel_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)
