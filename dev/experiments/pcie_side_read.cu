// Does a host's DRAM serve a GPU reading page-locked host memory over PCIe while CPU threads stream other host memory?
// (dev/notes/hybrid-next.md, "A direction not tried".) Three timed phases, each a few hundred MB:
//   gpu alone:  a kernel sums uint4 words of a mapped page-locked buffer (zero-copy reads over the bus)
//   cpu alone:  T threads sum uint64 words of another (ordinary) buffer
//   both:       the two at once; each side's GB/s and their sum
// Build: nvcc -O2 -arch=sm_90 -o pcie_side_read dev/experiments/pcie_side_read.cu -lpthread
// Run:   ./pcie_side_read [cpu_threads=14] [mb=512] [reps=5]
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CK(x)                                                                                \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

__global__ void sum_words(const uint4* __restrict__ p, size_t n, unsigned long long* out) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x + v.y + v.z + v.w;
  }
  if (acc == 0x12345678u) atomicAdd(out, 1ull);  // keeps the loads
}

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static uint64_t cpu_sum(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  return a ^ b ^ c ^ d;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 14;
  const size_t mb = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 512;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const size_t bytes = mb << 20;

  void* host_gpu = nullptr;  // what the GPU reads over the bus
  CK(cudaHostAlloc(&host_gpu, bytes, cudaHostAllocMapped));
  std::memset(host_gpu, 1, bytes);
  void* dev_view = nullptr;
  CK(cudaHostGetDevicePointer(&dev_view, host_gpu, 0));
  std::vector<uint64_t> host_cpu(bytes / 8 * 2, 3);  // what the CPU threads read (twice the size: they are faster)
  unsigned long long* sink = nullptr;
  CK(cudaMalloc(&sink, 8));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  auto gpu_pass = [&]() {  // seconds for one read of host_gpu
    CK(cudaEventRecord(e0));
    sum_words<<<sms * 8, 512>>>(static_cast<const uint4*>(dev_view), bytes / 16, sink);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / 1e3;
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> cpu_bytes{0};
  auto cpu_worker = [&](int t) {  // reads its slice over and over until stopped
    const size_t n = host_cpu.size() / threads;
    const uint64_t* p = host_cpu.data() + n * t;
    uint64_t s = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      s ^= cpu_sum(p, n);
      cpu_bytes.fetch_add(n * 8, std::memory_order_relaxed);
    }
    if (s == 42) std::printf(" ");
  };
  auto cpu_phase = [&](double seconds) {  // GB/s of the threads over `seconds`
    stop = false;
    cpu_bytes = 0;
    std::vector<std::thread> ts;
    const double t0 = now_s();
    for (int t = 0; t < threads; ++t) ts.emplace_back(cpu_worker, t);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
    for (auto& th : ts) th.join();
    return cpu_bytes.load() / (now_s() - t0) / 1e9;
  };

  gpu_pass();  // warm-up
  double g_alone = 0;
  for (int r = 0; r < reps; ++r) g_alone = std::max(g_alone, bytes / gpu_pass() / 1e9);
  const double c_alone = cpu_phase(1.0);
  // Both: the CPU threads run while the GPU repeats its pass.
  stop = false;
  cpu_bytes = 0;
  std::vector<std::thread> ts;
  const double t0 = now_s();
  for (int t = 0; t < threads; ++t) ts.emplace_back(cpu_worker, t);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  double g_both = 0;
  for (int r = 0; r < reps; ++r) g_both += bytes / gpu_pass() / 1e9;
  g_both /= reps;
  stop = true;
  for (auto& th : ts) th.join();
  const double c_both = cpu_bytes.load() / (now_s() - t0) / 1e9;
  std::printf(
      "gpu over the bus alone %.1f GB/s; cpu %d threads alone %.1f GB/s; together gpu %.1f + cpu %.1f = %.1f GB/s\n",
      g_alone, threads, c_alone, g_both, c_both, g_both + c_both);
  return 0;
}
