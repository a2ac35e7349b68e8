// device_timing: the pieces bench_gdn and bench_moe share with the pattern of bench_gemv (docs/benchmarking.md):
// a plain streaming-read kernel and the device-to-device copy as the limits measured in the same run, their
// size-matched forms (the same read or copy over a step's bytes, rotated out of L2), and the median time of
// CUDA-graph replays of back-to-back launches. Header-only, for the benchmark programs alone.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/base/expected.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/pdl.cuh"

namespace kestrel::gpu::bench {

constexpr int kReadThreads = 256;            // threads per block of the read kernel
constexpr int kReadUnroll = 4;               // 16-byte loads in flight per thread per iteration
constexpr int kMinLaunches = 200;            // launches per graph
constexpr int kReplays = 5;                  // timed graph replays; the median is reported
constexpr int kWarmupReplays = 2;            // untimed replays first
constexpr uint64_t kPeakBytes = 1ull << 30;  // peak read / copy buffer (1 GiB)

// Plain streaming read: sums n16 16-byte words (then the n_tail bytes after them) and writes one partial per block
// to out[blockIdx.x], so nothing is optimised away. src 16-byte aligned; out: u32 [gridDim.x]. kPdl: the form for
// a chain of programmatic launches (gpu/kernels/pdl.cuh) — the next launch may start at once, and only the store of the
// partial waits for the launch before (the source is read-only, as resident weights are).
template <bool kPdl = false>
__global__ void stream_read_kernel(const uint4* __restrict__ src, uint64_t n16, int n_tail,
                                   unsigned* __restrict__ out) {
  if constexpr (kPdl) pdl_trigger();
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (kReadUnroll - 1) * stride < n16; i += kReadUnroll * stride) {
    uint4 v[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) acc += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = src[i];
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const unsigned char* tail = reinterpret_cast<const unsigned char*>(src + n16);
    for (int b = 0; b < n_tail; ++b) acc += tail[b];
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ unsigned warp_sums[kReadThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned total = 0;
    for (int w = 0; w < kReadThreads / 32; ++w) total += warp_sums[w];
    if constexpr (kPdl) pdl_wait();
    out[blockIdx.x] = total;
  }
}

// Owns one device allocation (bytes, uninitialised).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Status allocate(uint64_t bytes) {
    KESTREL_CUDA_TRY(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
    return {};
  }
  unsigned char* bytes() const { return static_cast<unsigned char*>(ptr_); }
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// The read kernel's launch shape for n_bytes: enough 256-thread blocks for one 16-byte load per thread, at most 8
// resident blocks per SM (the grid-stride loop covers the rest).
struct ReadPlan {
  uint64_t n16 = 0;
  int n_tail = 0;
  int blocks = 1;
};

inline ReadPlan plan_read(uint64_t n_bytes, int sm_count) {
  ReadPlan p;
  p.n16 = n_bytes / 16;
  p.n_tail = static_cast<int>(n_bytes % 16);
  const uint64_t want = (p.n16 + kReadThreads - 1) / kReadThreads;
  p.blocks = static_cast<int>(std::clamp<uint64_t>(want, 1, static_cast<uint64_t>(sm_count) * 8));
  return p;
}

// programmatic: the read kernel's chain form, launched as a programmatic dependent of the launch before it.
inline Status launch_read(const unsigned char* src, const ReadPlan& p, unsigned* partials, cudaStream_t stream,
                          bool programmatic = false) {
  return launch_programmatic(programmatic, programmatic ? stream_read_kernel<true> : stream_read_kernel<false>,
                             dim3(p.blocks), dim3(kReadThreads), 0, stream, reinterpret_cast<const uint4*>(src), p.n16,
                             p.n_tail, partials);
}

// Captures n_launch calls of enqueue(i) (each returning Status) into one CUDA graph, replays it kWarmupReplays
// times, then times kReplays replays with events; returns the median microseconds per launch.
template <class Enqueue>
Expected<double> time_graph_us(cudaStream_t stream, int n_launch, Enqueue&& enqueue) {
  KESTREL_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < n_launch; ++i) {
    Status st = enqueue(i);
    if (!st) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) (void)cudaGraphDestroy(broken);
      return st.error();
    }
  }
  cudaGraph_t graph = nullptr;
  KESTREL_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  KESTREL_CUDA_TRY(inst);
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  std::vector<float> ms(kReplays, 0.0f);
  Status result = [&]() -> Status {
    KESTREL_CUDA_TRY(cudaEventCreate(&start));
    KESTREL_CUDA_TRY(cudaEventCreate(&stop));
    for (int r = 0; r < kWarmupReplays; ++r) KESTREL_CUDA_TRY(cudaGraphLaunch(exec, stream));
    KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));
    for (int r = 0; r < kReplays; ++r) {
      KESTREL_CUDA_TRY(cudaEventRecord(start, stream));
      KESTREL_CUDA_TRY(cudaGraphLaunch(exec, stream));
      KESTREL_CUDA_TRY(cudaEventRecord(stop, stream));
      KESTREL_CUDA_TRY(cudaEventSynchronize(stop));
      KESTREL_CUDA_TRY(cudaEventElapsedTime(&ms[static_cast<size_t>(r)], start, stop));
    }
    return {};
  }();
  if (start != nullptr) (void)cudaEventDestroy(start);
  if (stop != nullptr) (void)cudaEventDestroy(stop);
  (void)cudaGraphExecDestroy(exec);
  if (!result) return result.error();
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(ms[kReplays / 2]) * 1000.0 / n_launch;
}

// Plain streaming copy: dst[i] = src[i] for n16 16-byte words (grid-stride, kReadUnroll loads in flight per thread).
// kPdl: the form for a chain of programmatic launches — the next launch may start at once, the first loads are
// issued before the wait for the launch before, every store after it (as a chained state update loads its state
// early and writes it late).
template <bool kPdl = false>
__global__ void stream_copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, uint64_t n16) {
  if constexpr (kPdl) pdl_trigger();
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kReadUnroll - 1) * stride < n16; i += kReadUnroll * stride) {
    uint4 v[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) v[u] = src[i + u * stride];
    if constexpr (kPdl) pdl_wait();
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) dst[i + u * stride] = v[u];
  }
  if constexpr (kPdl) pdl_wait();
  for (; i < n16; i += stride) dst[i] = src[i];
}

// The size-matched read limit of a step that reads `bytes`: the plain read kernel over that many bytes (rounded up to
// 16), timed like the step — buffer sets of that size used in rotation (launch i on set i % k, k · bytes >=
// rotation_bytes) so every launch reads from memory, not L2.
// programmatic: the chain of programmatic launches (the read kernel's kPdl form).
inline Expected<double> matched_read_us(uint64_t bytes, uint64_t rotation_bytes, int sm_count, unsigned* partials,
                                        cudaStream_t stream, bool programmatic = false) {
  const uint64_t set_bytes = std::max<uint64_t>(16, (bytes + 15) / 16 * 16);
  const uint64_t k = std::max<uint64_t>(2, (rotation_bytes + set_bytes - 1) / set_bytes);
  DeviceBuffer src;
  KESTREL_TRY(src.allocate(k * set_bytes));
  KESTREL_CUDA_TRY(memset_synced(src.bytes(), 0x5a, k * set_bytes));
  KESTREL_CUDA_TRY(cudaDeviceSynchronize());
  const ReadPlan plan = plan_read(set_bytes, sm_count);
  const int n_launch = static_cast<int>((kMinLaunches + k - 1) / k * k);
  return time_graph_us(stream, n_launch, [&](int i) {
    return launch_read(src.bytes() + (static_cast<uint64_t>(i) % k) * set_bytes, plan, partials, stream, programmatic);
  });
}

// The size-matched copy limit of a kernel that moves `bytes` (read + written): a plain copy of bytes / 2 (rounded
// up to 16) read and as many written, timed like the kernel (time_graph_us over >= kMinLaunches launches), with
// src/dst buffer sets used in rotation (launch i on set i % k, k · bytes >= rotation_bytes) so they stay cold in L2
// as the kernel's states do. Returns the median microseconds per copy. programmatic: the chain of programmatic
// launches (the copy kernel's kPdl form).
inline Expected<double> matched_copy_us(uint64_t bytes, uint64_t rotation_bytes, int sm_count, cudaStream_t stream,
                                        bool programmatic = false) {
  const uint64_t half16 = std::max<uint64_t>(1, (bytes / 2 + 15) / 16);  // 16-byte words each way
  const uint64_t set_bytes = half16 * 16;
  const uint64_t k = std::max<uint64_t>(2, (rotation_bytes + 2 * set_bytes - 1) / (2 * set_bytes));
  DeviceBuffer src;
  DeviceBuffer dst;
  KESTREL_TRY(src.allocate(k * set_bytes));
  KESTREL_TRY(dst.allocate(k * set_bytes));
  KESTREL_CUDA_TRY(memset_synced(src.bytes(), 0x5a, k * set_bytes));
  KESTREL_CUDA_TRY(memset_synced(dst.bytes(), 0, k * set_bytes));
  KESTREL_CUDA_TRY(cudaDeviceSynchronize());
  const ReadPlan plan = plan_read(set_bytes, sm_count);
  const int n_launch = static_cast<int>((kMinLaunches + k - 1) / k * k);
  return time_graph_us(stream, n_launch, [&](int i) -> Status {
    const uint64_t set = static_cast<uint64_t>(i) % k;
    return launch_programmatic(programmatic, programmatic ? stream_copy_kernel<true> : stream_copy_kernel<false>,
                               dim3(plan.blocks), dim3(kReadThreads), 0, stream,
                               reinterpret_cast<const uint4*>(src.bytes() + set * set_bytes),
                               reinterpret_cast<uint4*>(dst.bytes() + set * set_bytes), half16);
  });
}

struct Limits {
  double peak_read_gbs = 0;  // plain streaming read of 1 GiB
  double copy_gbs = 0;       // cudaMemcpy D2D of 1 GiB, bytes read + written
};

// Measures both limits; partials: u32 [8 · sm_count].
inline Expected<Limits> measure_limits(int sm_count, unsigned* partials, cudaStream_t stream) {
  DeviceBuffer src;
  DeviceBuffer dst;
  KESTREL_TRY(src.allocate(kPeakBytes));
  KESTREL_TRY(dst.allocate(kPeakBytes));
  KESTREL_CUDA_TRY(memset_synced(src.bytes(), 0x5a, kPeakBytes));
  KESTREL_CUDA_TRY(memset_synced(dst.bytes(), 0, kPeakBytes));
  KESTREL_CUDA_TRY(cudaDeviceSynchronize());  // the memsets run on the legacy stream; `stream` does not wait for it
  const ReadPlan plan = plan_read(kPeakBytes, sm_count);
  Limits lim;
  KESTREL_TRY_ASSIGN(const double read_us, time_graph_us(stream, kMinLaunches, [&](int) {
                       return launch_read(src.bytes(), plan, partials, stream);
                     }));
  lim.peak_read_gbs = static_cast<double>(kPeakBytes) / (read_us * 1e3);
  constexpr int kCopies = 50;  // 1 GiB each way per copy: 50 is plenty for a stable median
  KESTREL_TRY_ASSIGN(
      const double copy_us, time_graph_us(stream, kCopies, [&](int) -> Status {
        KESTREL_CUDA_TRY(cudaMemcpyAsync(dst.bytes(), src.bytes(), kPeakBytes, cudaMemcpyDeviceToDevice, stream));
        return {};
      }));
  lim.copy_gbs = 2.0 * static_cast<double>(kPeakBytes) / (copy_us * 1e3);
  return lim;
}

// The common start of a benchmark run: prints the device, creates a non-blocking stream (destroyed with the setup),
// allocates the read kernel's partials (u32 [8 · SMs]) and measures and prints both limits.
struct BenchSetup {
  int sm_count = 0;
  cudaStream_t stream = nullptr;
  DeviceBuffer partials_buf;
  Limits lim;

  BenchSetup() = default;
  BenchSetup(const BenchSetup&) = delete;
  BenchSetup& operator=(const BenchSetup&) = delete;
  ~BenchSetup() {
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
  unsigned* partials() const { return reinterpret_cast<unsigned*>(partials_buf.bytes()); }

  Status start() {
    int device = 0;
    KESTREL_CUDA_TRY(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    KESTREL_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
    sm_count = prop.multiProcessorCount;
    std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, sm_count, prop.l2CacheSize >> 20);
    KESTREL_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    KESTREL_TRY(partials_buf.allocate(static_cast<uint64_t>(sm_count) * 8 * sizeof(unsigned)));
    KESTREL_TRY_ASSIGN(lim, measure_limits(sm_count, partials(), stream));
    std::printf("peak read (1 GiB, plain 16-byte loads): %.0f GB/s; D2D copy (1 GiB, read + written): %.0f GB/s\n",
                lim.peak_read_gbs, lim.copy_gbs);
    return {};
  }
};

// A benchmark program's exit status for the Status its run returned: 0, or 1 with the error on stderr after the
// program's name (every GPU bench's main ends here).
inline int exit_status(const char* program, const Status& st) {
  if (st) return 0;
  std::fprintf(stderr, "%s: %s\n", program, st.error().to_string().c_str());
  return 1;
}

}  // namespace kestrel::gpu::bench
