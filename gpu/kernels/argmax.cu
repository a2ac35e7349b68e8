// argmax_rows (see argmax.h): one block per row, (value, index) pairs combined by a total order.
#include <cmath>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/argmax.h"

namespace kestrel::gpu {
namespace {

constexpr int kThreads = 1024;
constexpr int32_t kNoIndex = 0x7FFFFFFF;  // "no candidate yet": loses every comparison against a real one

// (bv, bi) := the better of (bv, bi) and (ov, oi): larger value, then lower index. NaN never enters (candidates are
// only values > -inf, and NaN > x is false).
__device__ __forceinline__ void take_better(float& bv, int32_t& bi, float ov, int32_t oi) {
  if (ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}

__global__ void argmax_kernel(const float* __restrict__ logits, int32_t n_vocab, int32_t* __restrict__ ids) {
  __shared__ float s_v[32];
  __shared__ int32_t s_i[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * n_vocab;
  float bv = -INFINITY;
  int32_t bi = kNoIndex;
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < n_vocab; i += static_cast<int32_t>(blockDim.x)) {
    const float v = row[i];
    if (v > bv) {  // strict: the first (lowest) index of this thread's equal maxima stays
      bv = v;
      bi = i;
    }
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, m);
    const int32_t oi = __shfl_xor_sync(0xFFFFFFFFu, bi, m);
    take_better(bv, bi, ov, oi);
  }
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if (lane == 0) {
    s_v[warp] = bv;
    s_i[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float v = s_v[0];
    int32_t idx = s_i[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) take_better(v, idx, s_v[w], s_i[w]);
    ids[blockIdx.x] = idx == kNoIndex ? 0 : idx;
  }
}

}  // namespace

Status argmax_rows(const float* logits, int64_t n_rows, int64_t n_vocab, int32_t* ids, cudaStream_t stream) {
  if (n_rows < 0 || n_rows > 0x7FFFFFFF || n_vocab < 1 || n_vocab > kNoIndex - kThreads) {
    return make_error(ErrorCode::kInvalidArgument, "argmax_rows: bad shape (" + std::to_string(n_rows) + " rows of " +
                                                       std::to_string(n_vocab) + " logits)");
  }
  if (logits == nullptr || ids == nullptr) return make_error(ErrorCode::kInvalidArgument, "argmax_rows: null pointer");
  if (n_rows == 0) return ok_status();
  argmax_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(logits, static_cast<int32_t>(n_vocab), ids);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
