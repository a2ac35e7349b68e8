// cuda_check.h: a cudaError_t turned into a Kestrel Error with the call, file:line and CUDA's own description.
#include "gpu/cuda_check.h"

#include <string>

namespace kestrel::gpu {
namespace {

ErrorCode code_for(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation: return ErrorCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice: return ErrorCode::kFailedPrecondition;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration: return ErrorCode::kInvalidArgument;
    default: return ErrorCode::kInternal;
  }
}

}  // namespace

Error cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  return make_error(code_for(err), std::string("CUDA call ") + what + " failed at " + file + ":" +
                                       std::to_string(line) + ": " + cudaGetErrorString(err) + " (" +
                                       cudaGetErrorName(err) + ")");
}

Status cuda_status(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return ok_status();
  return cuda_error(err, what, file, line);
}

}  // namespace kestrel::gpu
