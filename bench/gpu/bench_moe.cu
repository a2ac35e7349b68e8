// bench_moe: the grouped MoE layer (gpu/moe_experts: router GEMV, routing, grouped expert SwiGLU, gated shared
// expert, combine) at the qwen35moe-35b-a3b shape (H 2048, 256 experts top-8, expert ff 512, shared ff 512) for
// batches of 1, 8 and 32 tokens, with every big weight in Q4_0 and in Q4_K, as ratios to limits measured in the
// same run (bench/gpu/device_timing.cuh):
//   bytes  = the weight bytes a step must read: the router, the UNIQUE experts the batch selected (gate + up +
//            down each), the shared expert and its gate (activations and scratch are not counted);
//   ratio  = (bytes / peak read bandwidth) / measured time (target: >= 67%, i.e. within 1.5x).
// Weights stay cold in the 60 MB L2: two copies of the whole layer are used alternately, and each launch uses one
// of 16 activation sets (so successive steps select different experts); bytes are the mean over the sets.
// Weights are random blocks with small f16 scales (valid for every type); the router is F32, the shared gate F32.
// Each figure is the median of 5 replays of a CUDA graph of >= 200 layer calls, after warm-up.
//
// A second table runs the same layers on GEMV v4 (gpu/moe_imma: the expert stacks re-tiled by MoeImmaLayer, the
// grouped GEMVs as gemv_imma_segments over segment tables built from the routing), same columns plus the
// size-matched read (the plain read kernel over `weight bytes`, buffers rotated out of L2, timed the same way) and
// the layer's time as a ratio to it, at 1, 2, 4, 8, 16 and 32 tokens, and the times with only the down GEMV and the
// combine launched as programmatic dependents and with every kernel after the first so (gpu/kernels/pdl.cuh; the
// default does the latter up to MoeImmaTuning::programmatic_max_tokens tokens, the former above), and with at most 1,
// 4 and 8 vectors per grouped-GEMV segment (MoeImmaTuning::segment_vectors; the default 2), and the routing in one
// block at every size (MoeImmaTuning::route_spread_min_tokens).
//
// Usage: build/gpu/bin/bench_moe [--main] [--split S] [FILTER]   (tens of seconds on an H200, most of it filling
// weights).
//   FILTER: run only the rows whose "type/batch" (e.g. q4_0/32, q4_K+q6_K/8) contains it, in both tables;
//   --main: only the GEMV v4 table, and in it only the layer's own time (the variant columns print "-");
//   --split S: the grouped GEMVs with S warps per row group (GemvImmaTuning::split) instead of the split by shape.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/gpu/device_timing.cuh"
#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/quant/quant.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/kernels/moe_experts.h"
#include "gpu/kernels/moe_imma.h"

namespace kestrel::gpu::bench {
namespace {

constexpr int kH = 2048;
constexpr int kExperts = 256;
constexpr int kUsed = 8;
constexpr int kFf = 512;
constexpr int kFfShared = 512;
constexpr int kCopies = 2;
constexpr int kXSets = 16;

// The command line (see the head of this file).
struct Options {
  std::string filter;
  bool main_only = false;
  MoeImmaTuning tuning;  // every GEMV v4 row's; the variant columns change one field of it
  bool wants(const std::string& type_name, int batch) const {
    return filter.empty() || (type_name + "/" + std::to_string(batch)).find(filter) != std::string::npos;
  }
};

// Fills dst (bytes, device) with random bytes and then sets every block's f16 scale(s) to small values, on the
// host in chunks (quant types); plain F32 is filled with small normal values.
Status fill_weight(GgmlType t, unsigned char* dst, uint64_t bytes, uint64_t seed) {
  const size_t block_bytes = ggml_type_traits(t).block_bytes;
  // Chunks of whole blocks, so every chunk starts at a block boundary.
  std::vector<unsigned char> host(std::min<uint64_t>(bytes, (64ull << 20) / block_bytes * block_bytes));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s]() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  std::vector<size_t> offs;
  if (t == GgmlType::kQ4_0 || t == GgmlType::kQ8_0) offs = {0};
  if (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K) offs = {0, 2};
  if (t == GgmlType::kQ6_K) offs = {block_bytes - 2};
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(host.size(), bytes - done));
    if (t == GgmlType::kF32) {
      std::mt19937 rng(static_cast<unsigned>(next()));
      std::normal_distribution<float> d(0.0f, 0.02f);
      for (size_t i = 0; i + 4 <= n; i += 4) {
        const float f = d(rng);
        std::memcpy(&host[i], &f, 4);
      }
    } else {
      for (size_t i = 0; i + 8 <= n; i += 8) {
        const uint64_t v = next();
        std::memcpy(&host[i], &v, 8);
      }
      for (size_t blk = 0; blk + block_bytes <= n; blk += block_bytes) {  // chunks hold whole blocks
        for (size_t o : offs) {
          const uint16_t h = f32_to_fp16(0.002f + static_cast<float>(next() % 100) * 1e-4f);
          std::memcpy(&host[blk + o], &h, 2);
        }
      }
    }
    KESTREL_CUDA_TRY(memcpy_synced(dst + done, host.data(), n, cudaMemcpyHostToDevice));
    done += n;
  }
  return {};
}

struct Layer {
  DeviceBuffer router, gate, up, down, sh_inp, sh_gate, sh_up, sh_down;
  MoeDeviceWeights w;
};

uint64_t bytes_of(GgmlType t, int64_t cols, int64_t rows) {
  return *ggml_row_bytes(t, static_cast<uint64_t>(cols)) * static_cast<uint64_t>(rows);
}

// Gate/up (routed and shared) of type t, down of type td.
Status make_layer(GgmlType t, GgmlType td, uint64_t seed, Layer& l) {
  auto put = [&](DeviceBuffer& b, GgmlType ty, int64_t cols, int64_t rows, int64_t mats, uint64_t sd) -> Status {
    const uint64_t n = bytes_of(ty, cols, rows) * static_cast<uint64_t>(mats);
    KESTREL_TRY(b.allocate(n));
    return fill_weight(ty, b.bytes(), n, sd);
  };
  KESTREL_TRY(put(l.router, GgmlType::kF32, kH, kExperts, 1, seed + 1));
  KESTREL_TRY(put(l.gate, t, kH, kFf, kExperts, seed + 2));
  KESTREL_TRY(put(l.up, t, kH, kFf, kExperts, seed + 3));
  KESTREL_TRY(put(l.down, td, kFf, kH, kExperts, seed + 4));
  KESTREL_TRY(put(l.sh_inp, GgmlType::kF32, kH, 1, 1, seed + 5));
  KESTREL_TRY(put(l.sh_gate, t, kH, kFfShared, 1, seed + 6));
  KESTREL_TRY(put(l.sh_up, t, kH, kFfShared, 1, seed + 7));
  KESTREL_TRY(put(l.sh_down, td, kFfShared, kH, 1, seed + 8));
  l.w.n_expert_used = kUsed;
  l.w.router = {GgmlType::kF32, l.router.bytes(), kH, kExperts};
  l.w.gate_exps = {t, l.gate.bytes(), kH, kFf, kExperts};
  l.w.up_exps = {t, l.up.bytes(), kH, kFf, kExperts};
  l.w.down_exps = {td, l.down.bytes(), kFf, kH, kExperts};
  l.w.shared_gate_inp = {GgmlType::kF32, l.sh_inp.bytes(), kH, 1};
  l.w.gate_shexp = {t, l.sh_gate.bytes(), kH, kFfShared};
  l.w.up_shexp = {t, l.sh_up.bytes(), kH, kFfShared};
  l.w.down_shexp = {td, l.sh_down.bytes(), kFfShared, kH};
  return moe_check_weights(l.w);
}

// One batch size's inputs and what the layer makes of them: kXSets random activation sets of `batch` tokens (drawn
// with `normal` from `rng`), the output and workspace buffers, and — from one call per set through `forward`
// (Status(const float* x, MoeLaunchInfo* info)) — the mean number of unique experts and the launches per call.
// The last call's output must be finite.
struct BatchRun {
  DeviceBuffer xs, out, ws;
  double mean_active = 0;
  int launches = 0;
  int batch = 0;
  const float* x(int set) { return xs.floats() + static_cast<size_t>(set) * batch * kH; }
};

template <class Forward>
Status prepare_batch(int batch, uint64_t ws_bytes, std::normal_distribution<float>& normal, std::mt19937& rng,
                     cudaStream_t stream, const char* path, Forward forward, BatchRun& r) {
  r.batch = batch;
  const size_t x_elems = static_cast<size_t>(kXSets) * batch * kH;
  std::vector<float> x(x_elems);
  for (auto& v : x) v = normal(rng);
  KESTREL_TRY(r.xs.allocate(x_elems * sizeof(float)));
  KESTREL_CUDA_TRY(memcpy_synced(r.xs.floats(), x.data(), x_elems * sizeof(float), cudaMemcpyHostToDevice));
  KESTREL_TRY(r.out.allocate(static_cast<uint64_t>(batch) * kH * sizeof(float)));
  KESTREL_TRY(r.ws.allocate(ws_bytes));
  KESTREL_CUDA_TRY(memset_synced(r.ws.bytes(), 0, ws_bytes));  // moe_imma's counters start at zero
  for (int s = 0; s < kXSets; ++s) {
    MoeLaunchInfo info;
    KESTREL_TRY(forward(r.x(s), &info));
    int n_active = 0;
    KESTREL_CUDA_TRY(cudaMemcpyAsync(&n_active, info.routing.n_active, 4, cudaMemcpyDeviceToHost, stream));
    KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));
    r.mean_active += n_active;
    r.launches = info.launches;
  }
  r.mean_active /= kXSets;
  std::vector<float> o(static_cast<size_t>(batch) * kH);
  KESTREL_CUDA_TRY(memcpy_synced(o.data(), r.out.floats(), o.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (float v : o) {
    if (!std::isfinite(v)) return make_error(ErrorCode::kInternal, std::string("bench_moe: non-finite output") + path);
  }
  return {};
}

// One row of the GEMV v4 table: batch tokens through the layer copies `imma` (alternately), kXSets activation sets.
Expected<std::string> imma_row(const std::string& type_name, int batch,
                               const std::unique_ptr<MoeImmaLayer> (&imma)[kCopies], uint64_t expert_bytes,
                               uint64_t fixed_bytes, const BenchSetup& setup, std::mt19937& rng, const Options& opt) {
  cudaStream_t stream = setup.stream;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  BatchRun r;
  KESTREL_TRY(prepare_batch(
      batch, moe_imma_workspace_bytes(imma[0]->weights(), batch), normal, rng, stream, " (GEMV v4 path)",
      [&](const float* x, MoeLaunchInfo* info) {
        return moe_imma_forward(imma[0]->weights(), x, batch, r.out.floats(), r.ws.bytes(), stream, opt.tuning, info);
      },
      r));
  const int n_launch = (kMinLaunches + kXSets - 1) / kXSets * kXSets;
  auto time_layer = [&](const MoeImmaTuning& tuning) {
    return time_graph_us(stream, n_launch, [&](int i) {
      return moe_imma_forward(imma[i % kCopies]->weights(), r.x(i % kXSets), batch, r.out.floats(), r.ws.bytes(),
                              stream, tuning);
    });
  };
  KESTREL_TRY_ASSIGN(const double us, time_layer(opt.tuning));
  const double bytes = r.mean_active * static_cast<double>(expert_bytes) + static_cast<double>(fixed_bytes);
  KESTREL_TRY_ASSIGN(const double read_us, matched_read_us(static_cast<uint64_t>(bytes), 512ull << 20, setup.sm_count,
                                                           setup.partials(), stream));
  const double gbs = bytes / (us * 1e3);
  char line[320];
  std::snprintf(line, sizeof(line), "%-9s %5d %9.1f %14.0f %9.2f %9.0f %7.1f%% %9d %9.2f %8.1f%%", type_name.c_str(),
                batch, r.mean_active, bytes, us, gbs, 100.0 * gbs / setup.lim.peak_read_gbs, r.launches, read_us,
                100.0 * read_us / us);
  std::string row(line);
  if (opt.main_only) {
    for (int i = 0; i < 7; ++i) row += "         -";
    return row + "\n";
  }
  // The same with only the down GEMV and the combine programmatic, and with every launch programmatic.
  double us_as[2] = {0.0, 0.0};
  for (int m = 0; m < 2; ++m) {
    MoeImmaTuning t = opt.tuning;
    t.programmatic_max_tokens = m == 0 ? 0 : kMoeMaxTokens;
    KESTREL_TRY_ASSIGN(us_as[m], time_layer(t));
  }
  // The same with at most 1, 4 and 8 vectors per grouped-GEMV segment (the default: 2).
  constexpr int kSegAlt[3] = {1, 4, 8};
  double us_seg[3] = {0.0, 0.0, 0.0};
  for (int m = 0; m < 3; ++m) {
    MoeImmaTuning t = opt.tuning;
    t.segment_vectors = kSegAlt[m];
    KESTREL_TRY_ASSIGN(us_seg[m], time_layer(t));
  }
  // The same with the routing in one block at every size (the default spreads it from 16 tokens).
  MoeImmaTuning one_block = opt.tuning;
  one_block.route_spread_min_tokens = kMoeMaxTokens + 1;
  KESTREL_TRY_ASSIGN(const double us_route1, time_layer(one_block));
  std::snprintf(line, sizeof(line), " %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", us_as[0], us_as[1], us_seg[0], us_seg[1],
                us_seg[2], us_route1);
  return row + line;
}

Status run(const Options& opt) {
  BenchSetup setup;
  KESTREL_TRY(setup.start());
  cudaStream_t stream = setup.stream;
  const Limits& lim = setup.lim;

  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::printf("\n%-9s %5s %9s %14s %9s %9s %8s %9s\n", "type", "batch", "experts", "weight bytes", "us", "GB/s",
              "%read", "launches");
  std::vector<std::string> imma_rows;
  // Q4_0, Q4_K, and a Q4_K_M file's layers that keep their down matrices in Q6_K.
  for (const auto& [t, td] : {std::pair{GgmlType::kQ4_0, GgmlType::kQ4_0}, std::pair{GgmlType::kQ4_K, GgmlType::kQ4_K},
                              std::pair{GgmlType::kQ4_K, GgmlType::kQ6_K}}) {
    const std::string name = std::string(ggml_type_name(t)) + (td == t ? "" : "+" + std::string(ggml_type_name(td)));
    bool any = false;
    for (const int batch : {1, 2, 4, 8, 16, 32}) any = any || opt.wants(name, batch);
    if (!any) continue;  // filling the weights is most of the run
    Layer layers[kCopies];
    for (int c = 0; c < kCopies; ++c) KESTREL_TRY(make_layer(t, td, 100 * static_cast<uint64_t>(c) + 1, layers[c]));
    const uint64_t expert_bytes = 2 * bytes_of(t, kH, kFf) + bytes_of(td, kFf, kH);  // gate + up + down of one expert
    const uint64_t fixed_bytes = bytes_of(GgmlType::kF32, kH, kExperts) + bytes_of(GgmlType::kF32, kH, 1) +
                                 2 * bytes_of(t, kH, kFfShared) + bytes_of(td, kFfShared, kH);
    for (const int batch : {1, 8, 32}) {
      if (opt.main_only || !opt.wants(name, batch)) continue;
      BatchRun r;
      KESTREL_TRY(prepare_batch(
          batch, moe_workspace_bytes(layers[0].w, batch), normal, rng, stream, "",
          [&](const float* x, MoeLaunchInfo* info) {
            return moe_forward(layers[0].w, x, batch, r.out.floats(), r.ws.bytes(), stream, info);
          },
          r));
      const int n_launch = (kMinLaunches + kXSets - 1) / kXSets * kXSets;
      KESTREL_TRY_ASSIGN(const double us, time_graph_us(stream, n_launch, [&](int i) {
                           return moe_forward(layers[i % kCopies].w, r.x(i % kXSets), batch, r.out.floats(),
                                              r.ws.bytes(), stream);
                         }));
      const double bytes = r.mean_active * static_cast<double>(expert_bytes) + static_cast<double>(fixed_bytes);
      const double gbs = bytes / (us * 1e3);
      std::printf("%-9s %5d %9.1f %14.0f %9.2f %9.0f %7.1f%% %9d\n", name.c_str(), batch, r.mean_active, bytes, us, gbs,
                  100.0 * gbs / lim.peak_read_gbs, r.launches);
    }
    // The same layers on GEMV v4; rows printed after the raw-block table.
    std::unique_ptr<MoeImmaLayer> imma[kCopies];
    for (int c = 0; c < kCopies; ++c) {
      KESTREL_TRY_ASSIGN(imma[c], MoeImmaLayer::from_raw_device(layers[c].w));
    }
    for (const int batch : {1, 2, 4, 8, 16, 32}) {
      if (!opt.wants(name, batch)) continue;
      KESTREL_TRY_ASSIGN(std::string row, imma_row(name, batch, imma, expert_bytes, fixed_bytes, setup, rng, opt));
      imma_rows.push_back(row);
    }
  }
  std::printf("\n%%read = (weight bytes / peak read) / time (target: >= 67%%, i.e. within 1.5x)\n");
  std::printf("\nMoE on GEMV v4 (gpu/moe_imma)\n%-9s %5s %9s %14s %9s %9s %8s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n",
              "type", "batch", "experts", "weight bytes", "us", "GB/s", "%read", "launches", "read us", "%matched",
              "us tailPDL", "us allPDL", "us seg1", "us seg4", "us seg8", "us route1");
  for (const std::string& r : imma_rows) std::printf("%s", r.c_str());
  std::printf(
      "\n%%matched = (size-matched plain read time) / layer time; launches = kernels per layer call (graph nodes); "
      "us tailPDL / us allPDL = the layer with only the down GEMV and the combine / every kernel after the first "
      "launched as programmatic dependents (us: every one up to MoeImmaTuning::programmatic_max_tokens = 4 tokens, "
      "then "
      "tailPDL's); us seg1 / seg4 / seg8 = at most 1 / 4 / 8 vectors per "
      "grouped-GEMV segment (us: MoeImmaTuning::segment_vectors = 2); us route1 = the routing in one block at every "
      "size (us: spread over a block per token from MoeImmaTuning::route_spread_min_tokens = 16 tokens)\n");
  return {};
}

}  // namespace
}  // namespace kestrel::gpu::bench

int main(int argc, char** argv) {
  kestrel::gpu::bench::Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--main") {
      opt.main_only = true;
    } else if (a == "--split" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      opt.tuning.grouped_gemv.split = std::atoi(argv[++i]);
    } else if (a.empty() || a[0] == '-' || !opt.filter.empty()) {
      std::fprintf(stderr, "usage: bench_moe [--main] [--split S] [FILTER]\n");
      return 2;
    } else {
      opt.filter = a;
    }
  }
  return kestrel::gpu::bench::exit_status("bench_moe", kestrel::gpu::bench::run(opt));
}
