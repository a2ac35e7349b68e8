// expert_handoff (see expert_handoff.h): one block publishes (the rows are a few KiB to a few hundred: its stores to
// host memory are posted writes, and one block orders them before the flag with one fence); the join spreads the copy
// back over blocks, each of which waits for the flag itself (reads of host memory are round trips over the bus, so
// more blocks keep more of them in flight).
#include <algorithm>
#include <cstdint>
#include <cuda/atomic>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/kernels/expert_handoff.h"

namespace kestrel::gpu {
namespace {

constexpr int kPublishThreads = 512;
constexpr int kJoinThreads = 256;
constexpr int kJoinMaxBlocks = 32;

using SystemRef = cuda::atomic_ref<uint32_t, cuda::thread_scope_system>;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kPublishThreads)
    publish_kernel(ExpertHandoff h, int32_t layer, int n_tok, const float4* __restrict__ x,
                   const int2* __restrict__ choices, int n_vec4, int n_choices) {
  auto* hx = reinterpret_cast<float4*>(h.x);
  auto* hc = reinterpret_cast<int2*>(h.choices);
  for (int i = static_cast<int>(threadIdx.x); i < n_vec4; i += kPublishThreads) hx[i] = x[i];
  for (int i = static_cast<int>(threadIdx.x); i < n_choices; i += kPublishThreads) hc[i] = choices[i];
  // Each thread's stores are ordered at system scope before the barrier, the barrier before the first thread's
  // mailbox fields and its release store of the number the host polls.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x != 0) return;
  const uint32_t s = *h.seq + 1;
  *h.seq = s;
  h.mailbox->layer = layer;
  h.mailbox->n_tokens = n_tok;
  SystemRef(h.mailbox->request).store(s, cuda::memory_order_release);
}

__global__ void __launch_bounds__(kJoinThreads)
    join_kernel(ExpertHandoff h, float4* __restrict__ y, int n_vec4, uint64_t timeout_ns) {
  __shared__ int answered;
  if (threadIdx.x == 0) {
    const uint32_t want = *h.seq;
    SystemRef done(h.mailbox->done);
    const uint64_t t0 = global_ns();
    int ok = 1;
    while (done.load(cuda::memory_order_acquire) != want) {
      if (global_ns() - t0 > timeout_ns) {
        SystemRef(h.mailbox->timed_out).store(1u, cuda::memory_order_relaxed);
        ok = 0;
        break;
      }
      __nanosleep(200);
    }
    if (blockIdx.x == 0) *h.wait_ns += global_ns() - t0;
    answered = ok;
  }
  __syncthreads();
  const auto* hy = reinterpret_cast<const float4*>(h.y);
  const float nan = __uint_as_float(0x7FC00000u);
  const int stride = static_cast<int>(gridDim.x) * kJoinThreads;
  for (int i = static_cast<int>(blockIdx.x) * kJoinThreads + static_cast<int>(threadIdx.x); i < n_vec4; i += stride) {
    // __ldcv: fetched again from host memory, never a cached line of an earlier pass.
    y[i] = answered != 0 ? __ldcv(hy + i) : make_float4(nan, nan, nan, nan);
  }
}

Status check_args(const ExpertHandoff& h, int n_tok, int hidden, const char* what) {
  if (h.mailbox == nullptr || h.x == nullptr || h.choices == nullptr || h.y == nullptr || h.seq == nullptr ||
      h.wait_ns == nullptr || n_tok < 1 || hidden < 4 || hidden % 4 != 0) {
    return make_error(ErrorCode::kInvalidArgument, std::string(what) + ": a null buffer, " + std::to_string(n_tok) +
                                                       " rows or " + std::to_string(hidden) +
                                                       " columns (>= 1 rows, columns a positive multiple of 4)");
  }
  return ok_status();
}

}  // namespace

Status expert_handoff_publish(const ExpertHandoff& h, int32_t layer, const float* x, const ExpertChoice* choices,
                              int n_tok, int hidden, int k, cudaStream_t stream) {
  KESTREL_TRY(check_args(h, n_tok, hidden, "expert_handoff_publish"));
  if (x == nullptr || choices == nullptr || k < 1) {
    return make_error(ErrorCode::kInvalidArgument, "expert_handoff_publish: null rows or choices, or k < 1");
  }
  static_assert(sizeof(ExpertChoice) == sizeof(int2));
  publish_kernel<<<1, kPublishThreads, 0, stream>>>(h, layer, n_tok, reinterpret_cast<const float4*>(x),
                                                    reinterpret_cast<const int2*>(choices), n_tok * hidden / 4,
                                                    n_tok * k);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

Status expert_handoff_join(const ExpertHandoff& h, int n_tok, int hidden, float* y, uint64_t timeout_ns,
                           cudaStream_t stream) {
  KESTREL_TRY(check_args(h, n_tok, hidden, "expert_handoff_join"));
  if (y == nullptr || timeout_ns < 1) {
    return make_error(ErrorCode::kInvalidArgument, "expert_handoff_join: null y or a zero timeout");
  }
  const int n_vec4 = n_tok * hidden / 4;
  const int blocks = std::min(kJoinMaxBlocks, (n_vec4 + kJoinThreads - 1) / kJoinThreads);
  join_kernel<<<blocks, kJoinThreads, 0, stream>>>(h, reinterpret_cast<float4*>(y), n_vec4, timeout_ns);
  KESTREL_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace kestrel::gpu
