// read_pattern: how fast GEMV v4's loads alone read on the H200 (6eb9850^:docs/benchmarks.md, "GEMV v4.5"). Bytes of
// one projection per launch, 24 buffers rotated out of the 60 MB L2, CUDA graphs of 240 launches (median of 5 replays):
//   1. the stream of bench/gpu/device_timing.cuh against warps that each load their own contiguous 2 / 4 / 8 KB slice
//      at once (the GEMV's pattern) or the same loads interleaved (at load i the grid reads one contiguous window);
//   2. the GEMV's request mix in blocks of 16 warps: weights, + the prepared x every SM reads (from L2 per warp, or
//      staged in shared memory), + Q4_0's scales (4 LDG.64 a group from their own region, or after the quants, or one
//      request a group), + the x digit sums.
// A diagnostic, built by hand on the lent GPU machine:
//
//   nvcc -O3 -std=c++17 --generate-code=arch=compute_90,code=sm_90 -I. -o /tmp/read_pattern
//   tools/device/read_pattern.cu /tmp/read_pattern
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gpu/kernels/ld_stream.cuh"
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

// blocks of 16 warps (a row group's slices); warp s of a block reads its kUnits × 512 B weight slice and, kX = 1,
// one uint4 a lane of x per unit from global (16 KB region, slice s's part; lanes 16..31 repeat 0..15 as the GEMV's
// missing second vector does); kX = 2: the block first copies x (kX bytes) into shared memory, then reads it there.
template <int kUnits, int kX>
__global__ void __launch_bounds__(512)
    k_gemvlike(const uint8_t* __restrict__ p, const uint8_t* __restrict__ xs, int n_warps) {
  __shared__ uint4 xsh[16 * kUnits * 16];
  const int s = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int w = blockIdx.x * 16 + s;
  uint4 v[kUnits];
  uint4 xv[kUnits];
#pragma unroll
  for (int i = 0; i < kUnits; ++i) v[i] = kestrel::gpu::ldg_stream(p + ((size_t)w * kUnits + i) * 512 + lane * 16);
  if constexpr (kX == 2) {
    const uint4* xg = reinterpret_cast<const uint4*>(xs);
    for (int q = threadIdx.x; q < 16 * kUnits * 16; q += 512) xsh[q] = __ldg(xg + q);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int q = (s * kUnits + i) * 16 + lane % 16;
    if constexpr (kX == 1)
      xv[i] = __ldg(reinterpret_cast<const uint4*>(xs) + q);
    else if constexpr (kX == 2)
      xv[i] = xsh[q];
    else
      xv[i] = make_uint4(0, 0, 0, 0);
  }
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < kUnits; ++i) acc += (v[i].x ^ v[i].y ^ v[i].z ^ v[i].w) + (xv[i].x ^ xv[i].w);
  if (w < n_warps && acc == 0x12345678u) g_sink[w & 0xFFFF] = acc;
}

// The GEMV's request mix in blocks of 16 warps. Scales (kM): 0 none; 1 Q4_0's as tiled (64 B a unit in their own
// region, lane / 4 picks 8 B: 4 LDG.64 a group); 2 the same right after each unit's quants; 3 one request a group
// (lane L loads 8 B at the group's 256 B + 8L) from their own region; 4 the same 256 B right after the group's 2 KB
// of quants. Digit sums (kD): 0 none; 1 an int2 a lane a unit (4 LDG.64 a group, as now); 2 an int4 a lane every
// second unit (2 LDG.128 a group).
template <int kUnits, int kM, int kD>
__global__ void __launch_bounds__(512) k_mix(const uint8_t* __restrict__ p, const uint8_t* __restrict__ meta,
                                             const uint8_t* __restrict__ xs, int n_warps) {
  const int s = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int w = blockIdx.x * 16 + s;
  constexpr int kG = kUnits / 4;
  constexpr size_t kUnitStride = kM == 2 ? 576 : 512;                // quants (+ scales) a unit
  constexpr size_t kGroupStride = kM == 4 ? 2304 : 4 * kUnitStride;  // a group of 4 units (+ its scales)
  uint4 v[kUnits];
  uint2 m[kUnits];
  uint4 xv[kUnits];
  int4 dv[kUnits];
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const size_t g0 = ((size_t)w * kG + i / 4) * kGroupStride;  // the group's first byte
    const size_t t = (size_t)w * kUnits + i;                    // the unit
    v[i] = kestrel::gpu::ldg_stream(p + g0 + (i % 4) * kUnitStride + lane * 16);
    m[i] = make_uint2(0, 0);
    if constexpr (kM == 1) m[i] = kestrel::gpu::ldg_stream2(meta + t * 64 + (lane / 4) * 8);
    if constexpr (kM == 2) m[i] = kestrel::gpu::ldg_stream2(p + g0 + (i % 4) * kUnitStride + 512 + (lane / 4) * 8);
    if constexpr (kM == 3) {
      if (i % 4 == 0) m[i] = kestrel::gpu::ldg_stream2(meta + (t / 4) * 256 + lane * 8);
    }
    if constexpr (kM == 4) {
      if (i % 4 == 0) m[i] = kestrel::gpu::ldg_stream2(p + g0 + 2048 + lane * 8);
    }
  }
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int q = (s * kUnits + i) * 16 + lane % 16;
    xv[i] = __ldg(reinterpret_cast<const uint4*>(xs) + q);
    dv[i] = make_int4(0, 0, 0, 0);
    if constexpr (kD == 1) {
      const int2 d2 = __ldg(reinterpret_cast<const int2*>(xs + 32768) + q);
      dv[i] = make_int4(d2.x, d2.y, 0, 0);
    }
    if constexpr (kD == 2) {
      if (i % 2 == 0) dv[i] = __ldg(reinterpret_cast<const int4*>(xs + 32768) + q);
    }
  }
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < kUnits; ++i)
    acc += (v[i].x ^ v[i].y ^ v[i].z ^ v[i].w) + (xv[i].x ^ xv[i].w) + m[i].x + m[i].y + dv[i].x + dv[i].w;
  if (w < n_warps && acc == 0x12345678u) g_sink[w & 0xFFFF] = acc;
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

// n device buffers of `bytes`, every byte `fill` (n = 24 of a projection's size rotate it out of the 60 MB L2).
std::vector<uint8_t*> buffers(int n, size_t bytes, int fill) {
  std::vector<uint8_t*> v(static_cast<size_t>(n));
  for (auto& b : v) {
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(b, fill, bytes));
  }
  return v;
}

void free_all(const std::vector<uint8_t*>& v) {
  for (uint8_t* b : v) CK(cudaFree(b));
}

template <int kUnits>
void run(const char* name, size_t bytes) {
  const int kSets = 24;
  const std::vector<uint8_t*> buf = buffers(kSets, bytes, 1);
  uint8_t* xs = buffers(1, 65536, 2)[0];
  const int W = static_cast<int>(bytes / (kUnits * 512));
  const int blocks = (W + 15) / 16;
  const int N = 240;
  const float t0 = time_graph(
      [&](int i, cudaStream_t s) { k_gemvlike<kUnits, 0><<<blocks, 512, 0, s>>>(buf[i % kSets], xs, W); }, N);
  const float t1 = time_graph(
      [&](int i, cudaStream_t s) { k_gemvlike<kUnits, 1><<<blocks, 512, 0, s>>>(buf[i % kSets], xs, W); }, N);
  const float t2 = time_graph(
      [&](int i, cudaStream_t s) { k_gemvlike<kUnits, 2><<<blocks, 512, 0, s>>>(buf[i % kSets], xs, W); }, N);
  printf("%-26s %d blocks: weights only %.2f us; + x per warp from L2 %.2f us; + x staged in smem %.2f us\n", name,
         blocks, t0, t1, t2);
  free_all(buf);
  free_all({xs});
}

template <int kUnits>
void run_full(const char* name, size_t bytes) {
  const int kSets = 24;
  const std::vector<uint8_t*> buf = buffers(kSets, bytes * 9 / 8, 1);  // quants (+ scales, interleaved forms)
  const std::vector<uint8_t*> meta = buffers(kSets, bytes / 8, 1);     // scales in their own region
  uint8_t* xs = buffers(1, 131072, 2)[0];
  const int W = static_cast<int>(bytes / (kUnits * 512));
  const int blocks = (W + 15) / 16;
  const int N = 240;
#define T(M, D)                                                                             \
  time_graph(                                                                               \
      [&](int i, cudaStream_t s) {                                                          \
        k_mix<kUnits, M, D><<<blocks, 512, 0, s>>>(buf[i % kSets], meta[i % kSets], xs, W); \
      },                                                                                    \
      N)
  const float a = T(0, 0), b = T(1, 0), c = T(0, 1), d = T(1, 1), e = T(2, 1);
  const float f = T(3, 1), g = T(4, 1), h = T(3, 2), j = T(4, 2), k = T(3, 0);
#undef T
  printf("%-26s w+x %.2f; +scales apart %.2f; +dsum %.2f; +both %.2f; scales interleaved +dsum %.2f us\n", name, a, b,
         c, d, e);
  printf(
      "%-26s one scale request a group: apart +dsum %.2f; after quants +dsum %.2f; apart +dsum x2 %.2f; after quants "
      "+dsum x2 %.2f; apart no dsum %.2f us\n",
      name, f, g, h, j, k);
  free_all(buf);
  free_all(meta);
  free_all({xs});
}

int main() {
  const size_t bytes = 9437184;  // gdn.attn_qkv Q4_0 quants + scales
  const int kSets = 24;          // 226 MB rotated: out of the 60 MB L2
  const std::vector<uint8_t*> buf = buffers(kSets, bytes, 1);
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
  // The GEMV's whole request mix (blocks of 16 warps = a row group's slices; bytes = the quants, scales 1/8 more).
  run<4>("4.7 MB, 1 group a warp", 4718592);
  run<8>("9.4 MB, 2 groups a warp", 9437184);
  run<4>("0.6 MB, 1 group a warp", 589824);
  run_full<4>("4.7 MB, 1 group a warp", 4194304);
  run_full<8>("9.4 MB, 2 groups a warp", 8388608);
  run_full<4>("0.6 MB, 1 group a warp", 524288);
  return 0;
}
