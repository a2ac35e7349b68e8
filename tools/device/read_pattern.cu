// read_pattern: does GEMV v4's access pattern read slower than a grid-stride stream? (docs/benchmarks.md, "GEMV v4.5")
// Reads one 9.4 MB matrix's bytes (gdn.attn_qkv, Q4_0) per launch, 24 buffers rotated out of the 60 MB L2, in CUDA
// graphs of 240 launches (median of 5 replays): the stream of bench/gpu/device_timing.cuh, and warps that each load
// their own contiguous 2 / 4 / 8 KB slice all at once (the GEMV's pattern: every warp's loads issued together,
// slices spread over the matrix) or the same loads interleaved (at load i the grid reads one contiguous window).
// A diagnostic, built by hand on the lent GPU machine:
//
//   nvcc -O3 -std=c++17 --generate-code=arch=compute_90,code=sm_90 -I. -o /tmp/read_pattern
//   tools/device/read_pattern.cu /tmp/read_pattern
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gpu/ld_stream.cuh"
#define CK(x)                                        \
  do {                                               \
    cudaError_t e = (x);                             \
    if (e != cudaSuccess) {                          \
      printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      exit(1);                                       \
    }                                                \
  } while (0)

__device__ unsigned g_sink[1 << 16];

// grid-stride stream, 4 loads a thread in flight (the bench's read kernel)
__global__ void k_stream(const uint4* __restrict__ p, uint64_t n16) {
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
    for (int u = 0; u < 4; ++u) v[u] = p[i + u * stride];
    for (int u = 0; u < 4; ++u) acc += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    uint4 v = p[i];
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) g_sink[blockIdx.x] = acc;
}

// mode 0: warp w reads its own contiguous slice (kUnits × 512 B), all loads at once (the GEMV's)
// mode 1: warp w reads unit i at (i·W + w)·512 (at load i the grid reads one contiguous window)
// mode 2: as 0 but plain ld.global.nc (L1 allocating)
template <int kUnits, int kMode>
__global__ void __launch_bounds__(256) k_slices(const uint8_t* __restrict__ p, int n_warps) {
  const int w = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (w >= n_warps) return;
  uint4 v[kUnits];
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const size_t off =
        kMode == 1 ? ((size_t)i * n_warps + w) * 512 + lane * 16 : ((size_t)w * kUnits + i) * 512 + lane * 16;
    v[i] = kMode == 2 ? __ldg(reinterpret_cast<const uint4*>(p + off)) : kestrel::gpu::ldg_stream(p + off);
  }
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < kUnits; ++i) acc += v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  if (acc == 0x12345678u) g_sink[w & 0xFFFF] = acc;
}

template <class F>
float time_graph(F&& launch, int n_launch) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < n_launch; ++i) launch(i, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 2) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1000.0f / n_launch;
}

int main() {
  const size_t bytes = 9437184;  // gdn.attn_qkv Q4_0 quants + scales
  const int kSets = 24;          // 226 MB rotated: out of the 60 MB L2
  std::vector<uint8_t*> buf(kSets);
  for (auto& b : buf) {
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(b, 1, bytes));
  }
  const int N = 240;
  auto pr = [&](const char* name, float us) { printf("%-40s %7.2f us  %6.0f GB/s\n", name, us, bytes / us / 1e3); };
  pr("stream (grid 132x8 x256, 4 in flight)",
     time_graph(
         [&](int i, cudaStream_t s) { k_stream<<<132 * 8, 256, 0, s>>>((const uint4*)buf[i % kSets], bytes / 16); },
         N));
  pr("stream (grid 264 x256)",
     time_graph([&](int i, cudaStream_t s) { k_stream<<<264, 256, 0, s>>>((const uint4*)buf[i % kSets], bytes / 16); },
                N));
  {
    const int W = bytes / (8 * 512);  // 2304 warps of 8 units (4 KB)
    pr("slices 4 KB own, nc.no_allocate",
       time_graph([&](int i, cudaStream_t s) { k_slices<8, 0><<<(W + 7) / 8, 256, 0, s>>>(buf[i % kSets], W); }, N));
    pr("slices 4 KB interleaved",
       time_graph([&](int i, cudaStream_t s) { k_slices<8, 1><<<(W + 7) / 8, 256, 0, s>>>(buf[i % kSets], W); }, N));
    pr("slices 4 KB own, ldg",
       time_graph([&](int i, cudaStream_t s) { k_slices<8, 2><<<(W + 7) / 8, 256, 0, s>>>(buf[i % kSets], W); }, N));
  }
  {
    const int W = bytes / (4 * 512);  // 4608 warps of 4 units (2 KB): 2 waves at 16 warps/SM...
    pr("slices 2 KB own (4608 warps)",
       time_graph([&](int i, cudaStream_t s) { k_slices<4, 0><<<(W + 7) / 8, 256, 0, s>>>(buf[i % kSets], W); }, N));
    pr("slices 2 KB interleaved (4608 warps)",
       time_graph([&](int i, cudaStream_t s) { k_slices<4, 1><<<(W + 7) / 8, 256, 0, s>>>(buf[i % kSets], W); }, N));
  }
  {
    const int W = bytes / (16 * 512);  // 1152 warps of 16 units (8 KB)
    pr("slices 8 KB own (1152 warps)",
       time_graph([&](int i, cudaStream_t s) { k_slices<16, 0><<<(W + 7) / 8, 256, 0, s>>>(buf[i % kSets], W); }, N));
    pr("slices 8 KB interleaved (1152 warps)",
       time_graph([&](int i, cudaStream_t s) { k_slices<16, 1><<<(W + 7) / 8, 256, 0, s>>>(buf[i % kSets], W); }, N));
  }
  return 0;
}
