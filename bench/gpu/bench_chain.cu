// bench_chain: what one dependent link of a kernel chain costs on this device — the floor under every step that is a
// chain of dependent kernels (the MoE layer at one token: router, routing, gate+up, SwiGLU preparation, down,
// combine; a decode step's layers one after another), against limits measured in the same run
// (bench/gpu/device_timing.cuh).
//
// A link is one kernel launch on one stream. Every block of a "touch" link reads all n floats the link before wrote
// (an all-to-all dependency, as a routing reads every logit or a GEMV its whole activation vector), adds them in a
// fixed order, and the link writes n floats of its own (out[i] = in[i] + 1, grid-strided; plus one partial sum a
// block); links alternate between two buffers. An "empty" link only launches, waits and ends: launch and completion
// alone. Each is timed as plain launches and as a chain of programmatic launches (gpu/kernels/pdl.cuh: a link launches
// while the one before runs and waits for it to complete before touching memory), for grids of 1 to 4 blocks an SM. The
// limit: the size-matched read of 18 MB — one token's routed and shared expert weights at the qwen35moe-35b-a3b shape,
// Q4_0 — plain and chained, so "% read" says what one link costs of that layer's read, and k links' floor can be set
// against the 1.5x budget (docs/benchmarks.md).
//
// Before timing, a chain of kCheckLinks touch links from zeros is run once per form and grid and its last buffer
// checked (every element kCheckLinks), so a link that did not run or ran out of order cannot pass.
//
// Usage: build/gpu/bin/bench_chain   (no arguments; a few seconds on an H200).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/gpu/device_timing.cuh"
#include "core/base/expected.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/pdl.cuh"

namespace kestrel::gpu::bench {
namespace {

constexpr int kLinkThreads = 256;
constexpr int kCheckLinks = 10;
constexpr uint64_t kRotationBytes = 256ull << 20;
constexpr uint64_t kMoeOneTokenBytes = 18030592;  // bench_moe's one-token Q4_0 weight bytes at the 35B-A3B shape

// One link. kTouch: every block reads in[0, n) after the wait and sums it (per thread in index order, then the warps'
// butterflies, then the warps in order), the grid writes out[i] = in[i] + 1 (grid-stride), thread 0 of block b writes
// partial[b]. kPdl: the chain form (trigger at once, wait before touching memory).
template <bool kPdl, bool kTouch>
__global__ void __launch_bounds__(kLinkThreads) link_kernel(const float* in, float* out, float* partial, int n) {
  if constexpr (kPdl) {
    pdl_trigger();
    pdl_wait();
  }
  if constexpr (kTouch) {
    float s = 0.0f;
    for (int i = static_cast<int>(threadIdx.x); i < n; i += kLinkThreads) s += ld_dep(in + i);
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    __shared__ float warp_sums[kLinkThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    const int stride = static_cast<int>(gridDim.x) * kLinkThreads;
    for (int g = static_cast<int>(blockIdx.x * kLinkThreads + threadIdx.x); g < n; g += stride) {
      out[g] = ld_dep(in + g) + 1.0f;
    }
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int w = 0; w < kLinkThreads / 32; ++w) total += warp_sums[w];
      partial[blockIdx.x] = total;
    }
  }
}

struct Link {
  const char* name;
  bool touch;
  int n;  // floats read by every block and written by the link
};

Status launch_link(const Link& l, bool pdl, int blocks, const float* in, float* out, float* partial,
                   cudaStream_t stream) {
  void (*kernel)(const float*, float*, float*, int) = nullptr;
  if (l.touch) {
    kernel = pdl ? link_kernel<true, true> : link_kernel<false, true>;
  } else {
    kernel = pdl ? link_kernel<true, false> : link_kernel<false, false>;
  }
  return launch_programmatic(pdl, kernel, dim3(static_cast<unsigned>(blocks)), dim3(kLinkThreads), 0, stream, in, out,
                             partial, l.n);
}

// Runs kCheckLinks touch links from zeros and checks the last buffer.
Status check_chain(const Link& l, bool pdl, int blocks, float* a, float* b, float* partial, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(l.n) * sizeof(float);
  KESTREL_CUDA_TRY(cudaMemsetAsync(a, 0, bytes, stream));
  for (int i = 0; i < kCheckLinks; ++i) {
    KESTREL_TRY(launch_link(l, pdl, blocks, i % 2 == 0 ? a : b, i % 2 == 0 ? b : a, partial, stream));
  }
  KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<float> host(static_cast<size_t>(l.n));
  KESTREL_CUDA_TRY(memcpy_synced(host.data(), kCheckLinks % 2 == 0 ? a : b, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] != static_cast<float>(kCheckLinks)) {
      return make_error(ErrorCode::kInternal, std::string("bench_chain: ") + l.name + " element " + std::to_string(i) +
                                                  " is " + std::to_string(host[i]) + " after " +
                                                  std::to_string(kCheckLinks) + " links, want " +
                                                  std::to_string(kCheckLinks));
    }
  }
  return {};
}

Status run() {
  BenchSetup setup;
  KESTREL_TRY(setup.start());
  cudaStream_t stream = setup.stream;
  const int sms = setup.sm_count;

  KESTREL_TRY_ASSIGN(const double read_us,
                     matched_read_us(kMoeOneTokenBytes, kRotationBytes, sms, setup.partials(), stream));
  KESTREL_TRY_ASSIGN(const double read_pdl_us,
                     matched_read_us(kMoeOneTokenBytes, kRotationBytes, sms, setup.partials(), stream, true));
  std::printf("size-matched read of %llu bytes (one token's MoE weights, Q4_0): %.2f us plain, %.2f us chained\n\n",
              static_cast<unsigned long long>(kMoeOneTokenBytes), read_us, read_pdl_us);

  const Link links[] = {{"empty", false, 0}, {"touch 1 KB", true, 256}, {"touch 8 KB", true, 2048}};
  const int grids[] = {1, sms / 4, sms, 2 * sms, 4 * sms};
  int max_n = 1;
  for (const Link& l : links) max_n = std::max(max_n, l.n);
  DeviceBuffer a, b, partial;
  KESTREL_TRY(a.allocate(static_cast<uint64_t>(max_n) * sizeof(float)));
  KESTREL_TRY(b.allocate(static_cast<uint64_t>(max_n) * sizeof(float)));
  KESTREL_TRY(partial.allocate(static_cast<uint64_t>(4 * sms) * sizeof(float)));

  std::printf("%-12s %7s %10s %10s %10s %10s\n", "link", "blocks", "plain us", "chained us", "%read", "%read ch");
  for (const Link& l : links) {
    for (const int blocks : grids) {
      double us[2] = {0.0, 0.0};
      for (const bool pdl : {false, true}) {
        if (l.touch) KESTREL_TRY(check_chain(l, pdl, blocks, a.floats(), b.floats(), partial.floats(), stream));
        KESTREL_TRY_ASSIGN(us[pdl ? 1 : 0], time_graph_us(stream, kMinLaunches, [&](int i) {
                             return launch_link(l, pdl, blocks, i % 2 == 0 ? a.floats() : b.floats(),
                                                i % 2 == 0 ? b.floats() : a.floats(), partial.floats(), stream);
                           }));
      }
      std::printf("%-12s %7d %10.2f %10.2f %9.1f%% %9.1f%%\n", l.name, blocks, us[0], us[1], 100.0 * us[0] / read_us,
                  100.0 * us[1] / read_pdl_us);
    }
  }
  std::printf(
      "\n%%read = one link's time / the plain size-matched read; %%read ch = the chained link's / the chained read "
      "(the 1.5x target leaves a layer 50%% of its read for everything beyond the read itself)\n");
  return {};
}

}  // namespace
}  // namespace kestrel::gpu::bench

int main() { return kestrel::gpu::bench::exit_status("bench_chain", kestrel::gpu::bench::run()); }
