// bench_gdn: one GDN decode step (gpu/gdn_decode: conv + norms + gates + delta rule + gated norm) per layer at the
// qwen35moe-35b-a3b shape (Kh 16, Vh 32, dk = dv = 128, conv kernel 4: S is 2 MiB per session) for 1 to 32
// sessions, as ratios to limits measured in the same run (bench/gpu/device_timing.cuh):
//   bytes  = S read + written, conv history read + written, the projection outputs read, the output written
//            (the layer's small weights are counted too; the q̂/k̂/v/o workspace round trip is not);
//   ratio  = (bytes / peak read bandwidth) / measured time, and the same against the D2D copy rate (which moves
//            read + written bytes, like the step);
//   matched copy = a plain copy kernel of the same bytes (half read, half written, buffers rotated out of L2 like
//            the states), timed exactly like the step; %matched = matched-copy time / step time (the issue-5
//            target: >= 67%, i.e. the step within 1.5x of moving its bytes);
//   PDL    = the same steps as a chain of programmatic launches (gpu/kernels/pdl.cuh; each step loads its states before
//   it
//            waits for the one before, as a decode step chains its kernels), against the copy kernel chained the
//            same way (its loads before the wait, its stores after);
//   kernel = the kernel gdn_decode picks; per-head / two-kernel = each kernel forced (GdnDecodeTuning::kernel), plain
//            launches, so the choice can be checked against them.
// The states stay cold in the 60 MB L2: K sets of session states (K·bytes >= 256 MiB) are used in rotation, launch
// i on set i % K. Each figure is the median of 5 replays of a CUDA graph of >= 200 steps, after warm-up.
//
// Usage: build/gpu/bin/bench_gdn   (no arguments; a few seconds on an H200). docs/benchmarks.md records results.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "bench/gpu/device_timing.cuh"
#include "core/base/expected.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/gdn_decode.h"

namespace kestrel::gpu::bench {
namespace {

constexpr uint64_t kRotationBytes = 256ull << 20;

std::vector<float> normal(size_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Status upload(DeviceBuffer& b, const std::vector<float>& v) {
  KESTREL_TRY(b.allocate(v.size() * sizeof(float)));
  KESTREL_CUDA_TRY(memcpy_synced(b.floats(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  return {};
}

Status run() {
  BenchSetup setup;
  KESTREL_TRY(setup.start());
  cudaStream_t stream = setup.stream;
  const Limits& lim = setup.lim;

  ref::GdnDims d;
  d.n_embd = 2048;
  d.n_k_heads = 16;
  d.n_v_heads = 32;
  d.d_k = 128;
  d.d_v = 128;
  d.conv_kernel = 4;
  d.mapping = HeadMapping::kTiled;
  const size_t C = static_cast<size_t>(d.conv_dim()), Vd = static_cast<size_t>(d.value_dim());
  const size_t Vh = static_cast<size_t>(d.n_v_heads);
  const size_t s_elems = Vh * static_cast<size_t>(d.d_k) * static_cast<size_t>(d.d_v);
  const size_t c_elems = C * static_cast<size_t>(d.conv_kernel - 1);
  const size_t slot_elems = s_elems + c_elems;

  std::mt19937 rng(7);
  DeviceBuffer conv1d, dt, sa, sn;
  KESTREL_TRY(upload(conv1d, normal(C * 4, 0.5f, rng)));
  KESTREL_TRY(upload(dt, normal(Vh, 0.5f, rng)));
  std::vector<float> a_host(Vh);
  for (auto& x : a_host) x = -std::exp(std::uniform_real_distribution<float>(-2.0f, 1.0f)(rng));
  KESTREL_TRY(upload(sa, a_host));
  KESTREL_TRY(upload(sn, normal(static_cast<size_t>(d.d_v), 0.3f, rng)));
  const GdnDecodeWeights w{conv1d.floats(), dt.floats(), sa.floats(), sn.floats()};

  std::printf("\n%-8s %6s %12s %9s %10s %9s %9s %10s %15s %9s %8s %12s %9s %10s %10s\n", "sessions", "sets", "bytes",
              "us", "GB/s", "%read", "%copy", "kernel", "matched copy us", "%matched", "us PDL", "copy PDL us",
              "%m PDL", "per-head", "two-kernel");
  KESTREL_TRY_ASSIGN(const GdnKernel kernel, gdn_decode_kernel(d));
  for (const int n_seq : {1, 2, 4, 8, 16, 32}) {
    const size_t N = static_cast<size_t>(n_seq);
    const uint64_t state_bytes = N * slot_elems * sizeof(float);
    const uint64_t k = std::max<uint64_t>(2, (kRotationBytes + state_bytes - 1) / state_bytes);
    DeviceBuffer states;
    KESTREL_TRY(states.allocate(k * state_bytes));
    const std::vector<float> init = normal(N * slot_elems, 0.1f, rng);
    for (uint64_t j = 0; j < k; ++j) {
      KESTREL_CUDA_TRY(
          memcpy_synced(states.floats() + j * N * slot_elems, init.data(), state_bytes, cudaMemcpyHostToDevice));
    }
    std::vector<GdnSlot> slots_host(k * N);
    for (uint64_t j = 0; j < k; ++j) {
      for (size_t n = 0; n < N; ++n) {
        float* base = states.floats() + (j * N + n) * slot_elems;
        slots_host[j * N + n] = GdnSlot{base, base + s_elems};
      }
    }
    DeviceBuffer slots;
    KESTREL_TRY(slots.allocate(slots_host.size() * sizeof(GdnSlot)));
    KESTREL_CUDA_TRY(
        memcpy_synced(slots.bytes(), slots_host.data(), slots_host.size() * sizeof(GdnSlot), cudaMemcpyHostToDevice));
    DeviceBuffer qkv, z, b, a, out, ws;
    KESTREL_TRY(upload(qkv, normal(N * C, 1.0f, rng)));
    KESTREL_TRY(upload(z, normal(N * Vd, 1.0f, rng)));
    KESTREL_TRY(upload(b, normal(N * Vh, 1.0f, rng)));
    KESTREL_TRY(upload(a, normal(N * Vh, 1.0f, rng)));
    KESTREL_TRY(out.allocate(N * Vd * sizeof(float)));
    KESTREL_TRY(ws.allocate(gdn_decode_workspace_bytes(d, n_seq)));
    KESTREL_CUDA_TRY(memset_synced(ws.bytes(), 0, gdn_decode_workspace_bytes(d, n_seq)));
    GdnDecodeInputs in;
    in.qkv = qkv.floats();
    in.z = z.floats();
    in.b = b.floats();
    in.a = a.floats();
    KESTREL_CUDA_TRY(cudaDeviceSynchronize());

    const int n_launch = static_cast<int>((kMinLaunches + k - 1) / k * k);
    const GdnSlot* slots_dev = reinterpret_cast<const GdnSlot*>(slots.bytes());
    auto time_steps = [&](bool programmatic, const GdnDecodeTuning& tuning) {
      return time_graph_us(stream, n_launch, [&](int i) {
        return gdn_decode(d, ref::GdnProjection::kQkvGateBetaAlpha, w, in, slots_dev + static_cast<uint64_t>(i) % k * N,
                          n_seq, out.floats(), ws.bytes(), stream, programmatic, tuning);
      });
    };
    KESTREL_TRY_ASSIGN(const double us, time_steps(false, GdnDecodeTuning{}));
    KESTREL_TRY_ASSIGN(const double us_pdl, time_steps(true, GdnDecodeTuning{}));
    double us_forced[2] = {};  // per-head, two-kernel; 0 where the kernel cannot serve the shape
    const GdnKernel forced[2] = {GdnKernel::kPerHead, GdnKernel::kTwoKernel};
    for (int f = 0; f < 2; ++f) {
      GdnDecodeTuning tuning;
      tuning.kernel = forced[f];
      KESTREL_TRY_ASSIGN(const GdnKernel served, gdn_decode_kernel(d, tuning));
      if (served == forced[f]) {
        KESTREL_TRY_ASSIGN(us_forced[f], time_steps(false, tuning));
      }
    }
    // Sanity: the outputs are finite (a broken launch cannot pass as fast).
    std::vector<float> o(N * Vd);
    KESTREL_CUDA_TRY(memcpy_synced(o.data(), out.floats(), o.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (float v : o) {
      if (!std::isfinite(v)) return make_error(ErrorCode::kInternal, "bench_gdn: non-finite output");
    }
    const uint64_t bytes = 2 * state_bytes                          // S and conv history, read + written
                           + N * (C + Vd + 2 * Vh) * sizeof(float)  // qkv, z, b, a
                           + N * Vd * sizeof(float)                 // out
                           + (C * 4 + 2 * Vh + static_cast<size_t>(d.d_v)) * sizeof(float);  // layer weights
    const double gbs = static_cast<double>(bytes) / (us * 1e3);
    KESTREL_TRY_ASSIGN(const double copy_us, matched_copy_us(bytes, kRotationBytes, setup.sm_count, stream));
    KESTREL_TRY_ASSIGN(const double copy_pdl_us, matched_copy_us(bytes, kRotationBytes, setup.sm_count, stream, true));
    std::printf("%-8d %6d %12llu %9.2f %10.0f %8.1f%% %8.1f%% %10s %15.2f %8.1f%% %8.2f %12.2f %8.1f%% %10.2f %10.2f\n",
                n_seq, static_cast<int>(k), static_cast<unsigned long long>(bytes), us, gbs,
                100.0 * gbs / lim.peak_read_gbs, 100.0 * gbs / lim.copy_gbs, gdn_kernel_name(kernel), copy_us,
                100.0 * copy_us / us, us_pdl, copy_pdl_us, 100.0 * copy_pdl_us / us_pdl, us_forced[0], us_forced[1]);
  }
  std::printf(
      "\n%%read = (bytes / peak read) / time; %%copy = (bytes / D2D copy rate) / time; %%matched = time of a plain "
      "copy of the same bytes (same timing, same L2 rotation) / time (target: >= 67%%, i.e. within 1.5x)\n");
  return {};
}

}  // namespace
}  // namespace kestrel::gpu::bench

int main() { return kestrel::gpu::bench::exit_status("bench_gdn", kestrel::gpu::bench::run()); }
