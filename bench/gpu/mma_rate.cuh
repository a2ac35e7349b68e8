// mma_rate: the tensor cores' int8 multiply-add rate as the engine's kernels issue them (mma.sync m16n8k32, u8 × s8,
// s32 accumulators), measured by a kernel that does nothing else: every warp runs kChains independent accumulator
// chains on register operands. bench_engine prints a prompt pass's multiply-adds beside it (the tensor-core limit).
// Header-only, for the benchmark programs alone.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "bench/gpu/device_timing.cuh"
#include "core/base/expected.h"
#include "gpu/cuda_check.h"

namespace kestrel::gpu::bench {

constexpr int kMmaChains = 8;       // independent accumulators per warp: enough to cover the MMA latency
constexpr int kMmaWarps = 8;        // warps a block
constexpr int kMmaBlocksPerSm = 2;  // blocks an SM
constexpr int kMmaIters = 4096;     // MMAs per chain per launch
constexpr double kMmaMacs = 16.0 * 8.0 * 32.0;

// Chains of D = A·B + D; the operands vary with the lane so that nothing folds, and a lane's sums go to out[tid]
// (never read back) so that nothing is dropped.
__global__ void __launch_bounds__(kMmaWarps * 32) mma_rate_kernel(uint32_t seed, int* out) {
  const uint32_t a = seed * (threadIdx.x + 1), b = seed ^ threadIdx.x;
  int d[kMmaChains][4] = {};
  for (int i = 0; i < kMmaIters; ++i) {
#pragma unroll
    for (int c = 0; c < kMmaChains; ++c) {
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+r"(d[c][0]), "+r"(d[c][1]), "+r"(d[c][2]), "+r"(d[c][3])
          : "r"(a), "r"(a + c), "r"(a ^ c), "r"(a), "r"(b), "r"(b + c));
    }
  }
  int s = 0;
#pragma unroll
  for (int c = 0; c < kMmaChains; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// Multiply-adds a second (the median of graph replays, as the read limits).
inline Expected<double> measure_mma_macs_per_s(int sm_count, cudaStream_t stream) {
  const int blocks = sm_count * kMmaBlocksPerSm;
  DeviceBuffer out;
  KESTREL_TRY(out.allocate(static_cast<uint64_t>(blocks) * kMmaWarps * 32 * sizeof(int)));
  int* o = reinterpret_cast<int*>(out.bytes());
  constexpr int kLaunches = 20;
  KESTREL_TRY_ASSIGN(const double us, time_graph_us(stream, kLaunches, [&](int i) -> Status {
                       mma_rate_kernel<<<blocks, kMmaWarps * 32, 0, stream>>>(0x9E3779B9u + static_cast<uint32_t>(i),
                                                                              o);
                       KESTREL_CUDA_TRY(cudaGetLastError());
                       return {};
                     }));
  const double macs = static_cast<double>(blocks) * kMmaWarps * kMmaChains * kMmaIters * kMmaMacs;
  return macs / (us * 1e-6);
}

}  // namespace kestrel::gpu::bench
