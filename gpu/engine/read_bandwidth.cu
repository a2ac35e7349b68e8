// cuda_read_bandwidth, cuda_pinned_copy_bandwidth and cuda_mapped_read_bandwidth (cuda_engine.h): a streaming read of
// a device buffer, a copy from page-locked host memory and a kernel's read of mapped page-locked host memory, timed
// with events.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/engine/cuda_engine.h"

namespace kestrel::gpu {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kBytes = uint64_t{512} << 20;
constexpr int kRepeats = 3;

// Sums n16 16-byte words (a grid-strided walk, four loads in flight per thread) into one word per block, so the
// loads are not optimised away.
__global__ void __launch_bounds__(kThreads) read_kernel(const uint4* __restrict__ src, uint64_t n16, unsigned* out) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    acc += (a.x ^ a.w) + (b.x ^ b.w) + (c.x ^ c.w) + (d.x ^ d.w);
  }
  for (; i < n16; i += stride) acc += src[i].x ^ src[i].w;
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
  if (threadIdx.x % 32 == 0) atomicAdd(out + blockIdx.x, acc);  // an integer sum: its order does not matter
}

// The shortest of kRepeats timings of `enqueue`'s work on `stream` (events around it), after one untimed run that
// warms up. kInternal when it took no measurable time.
Expected<float> best_ms(cudaStream_t stream, const std::function<Status()>& enqueue) {
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  auto time = [&]() -> Expected<float> {
    KESTREL_CUDA_TRY(cudaEventCreate(&t0));
    KESTREL_CUDA_TRY(cudaEventCreate(&t1));
    float best = 0.0f;
    for (int r = 0; r <= kRepeats; ++r) {
      KESTREL_CUDA_TRY(cudaEventRecord(t0, stream));
      KESTREL_TRY(enqueue());
      KESTREL_CUDA_TRY(cudaEventRecord(t1, stream));
      KESTREL_CUDA_TRY(cudaEventSynchronize(t1));
      float ms = 0.0f;
      KESTREL_CUDA_TRY(cudaEventElapsedTime(&ms, t0, t1));
      if (r > 0 && (best == 0.0f || ms < best)) best = ms;
    }
    if (!(best > 0.0f)) return make_error(ErrorCode::kInternal, "the measurement took no measurable time");
    return best;
  };
  Expected<float> ms = time();
  if (t0 != nullptr) (void)cudaEventDestroy(t0);
  if (t1 != nullptr) (void)cudaEventDestroy(t1);
  return ms;
}

// Bytes/s of read_kernel over `bytes` at device-usable `src` with `blocks` blocks (an `out` word each).
Expected<double> kernel_read_rate(const void* src, uint64_t bytes, int blocks, unsigned* out) {
  KESTREL_CUDA_TRY(cudaMemset(out, 0, static_cast<size_t>(blocks) * sizeof(unsigned)));
  KESTREL_TRY_ASSIGN(const float ms, best_ms(nullptr, [&]() -> Status {
                       read_kernel<<<blocks, kThreads>>>(static_cast<const uint4*>(src), bytes / 16, out);
                       KESTREL_CUDA_TRY(cudaGetLastError());
                       return ok_status();
                     }));
  return static_cast<double>(bytes) / (static_cast<double>(ms) * 1e-3);
}

}  // namespace

Expected<double> cuda_read_bandwidth(int device) {
  if (std::string why = cuda_unavailable_reason(); !why.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "no CUDA device to measure: " + why);
  }
  KESTREL_CUDA_TRY(cudaSetDevice(device));
  int sms = 0;
  KESTREL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int blocks = std::max(sms, 1) * 8;
  void* buf = nullptr;
  unsigned* out = nullptr;
  auto measure = [&]() -> Expected<double> {
    KESTREL_CUDA_TRY(cudaMalloc(&buf, kBytes));
    KESTREL_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&out), static_cast<size_t>(blocks) * sizeof(unsigned)));
    KESTREL_CUDA_TRY(cudaMemset(buf, 1, kBytes));
    return kernel_read_rate(buf, kBytes, blocks, out);
  };
  Expected<double> bw = measure();
  if (buf != nullptr) (void)cudaFree(buf);
  if (out != nullptr) (void)cudaFree(out);
  return bw;
}

Expected<double> cuda_pinned_copy_bandwidth(int device) {
  if (std::string why = cuda_unavailable_reason(); !why.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "no CUDA device to measure: " + why);
  }
  constexpr uint64_t kCopyBytes = uint64_t{256} << 20;
  KESTREL_CUDA_TRY(cudaSetDevice(device));
  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
  auto measure = [&]() -> Expected<double> {
    KESTREL_CUDA_TRY(cudaMallocHost(&host, kCopyBytes));
    KESTREL_CUDA_TRY(cudaMalloc(&dev, kCopyBytes));
    std::memset(host, 1, kCopyBytes);
    KESTREL_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    KESTREL_TRY_ASSIGN(const float ms, best_ms(stream, [&]() -> Status {
                         KESTREL_CUDA_TRY(cudaMemcpyAsync(dev, host, kCopyBytes, cudaMemcpyHostToDevice, stream));
                         return ok_status();
                       }));
    return static_cast<double>(kCopyBytes) / (static_cast<double>(ms) * 1e-3);
  };
  Expected<double> bw = measure();
  if (host != nullptr) (void)cudaFreeHost(host);
  if (dev != nullptr) (void)cudaFree(dev);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  return bw;
}

Expected<double> cuda_mapped_read_bandwidth(int device) {
  if (std::string why = cuda_unavailable_reason(); !why.empty()) {
    return make_error(ErrorCode::kFailedPrecondition, "no CUDA device to measure: " + why);
  }
  constexpr uint64_t kMappedBytes = uint64_t{256} << 20;
  KESTREL_CUDA_TRY(cudaSetDevice(device));
  int sms = 0;
  KESTREL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // Many loads in flight: each is a round trip over the bus.
  const int blocks = std::max(sms, 1) * 8;
  void* host = nullptr;
  unsigned* out = nullptr;
  auto measure = [&]() -> Expected<double> {
    KESTREL_CUDA_TRY(cudaHostAlloc(&host, kMappedBytes, cudaHostAllocMapped));
    std::memset(host, 1, kMappedBytes);
    void* mapped = nullptr;
    KESTREL_CUDA_TRY(cudaHostGetDevicePointer(&mapped, host, 0));
    KESTREL_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&out), static_cast<size_t>(blocks) * sizeof(unsigned)));
    return kernel_read_rate(mapped, kMappedBytes, blocks, out);
  };
  Expected<double> bw = measure();
  if (host != nullptr) (void)cudaFreeHost(host);
  if (out != nullptr) (void)cudaFree(out);
  return bw;
}

}  // namespace kestrel::gpu
