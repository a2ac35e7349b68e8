// swiglu (swiglu.h): one thread per element, grid-strided.
#include "gpu/cuda_check.h"
#include "gpu/kernels/swiglu.h"

namespace kestrel::gpu {
namespace {

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                              float* __restrict__ act) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    act[i] = g * (1.0f / (1.0f + expf(-g))) * up[i];
  }
}

}  // namespace

Status swiglu(const float* gate, const float* up, int64_t n, float* act, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (gate == nullptr || up == nullptr || act == nullptr))) {
    return make_error(ErrorCode::kInvalidArgument, "swiglu: null buffer or negative length");
  }
  if (n == 0) return ok_status();
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  swiglu_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, stream>>>(gate, up, n, act);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
