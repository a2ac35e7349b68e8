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

#include "core/base/expected.h"

namespace kestrel::gpu {

Error cuda_error(cudaError_t err, const char* what, const char* file, int line);
Status cuda_status(cudaError_t err, const char* what, const char* file, int line);

}  // namespace kestrel::gpu

// Returns the error (as Error) from the enclosing function when `expr` is not cudaSuccess.
#define KESTREL_CUDA_TRY(expr)                                                         \
  do {                                                                                 \
    const cudaError_t kestrel_cuda_err_ = (expr);                                      \
    if (kestrel_cuda_err_ != cudaSuccess) {                                            \
      return ::kestrel::gpu::cuda_error(kestrel_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)
