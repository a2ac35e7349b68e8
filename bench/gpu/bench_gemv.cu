// bench_gemv: gpu/gemv's weight-streaming speed on the qwen35moe-35b-a3b decode shapes, as ratios to read limits
// measured in the same run (docs/benchmarking.md):
//   peak read   a plain streaming-read kernel (16-byte loads, grid-stride) over one 1 GiB buffer;
//   copy        cudaMemcpy device-to-device of 1 GiB (bytes read + written; printed for reference only);
//   size-matched read  the same read kernel over the same K rotating weight copies each GEMV case reads.
// GEMV v4 (x prepared once) is also timed as a chain of programmatic launches (gpu/kernels/pdl.cuh: each launch may
// start while the one before ends; its first weight loads are issued before it waits), against the read kernel chained
// the same way ("us PDL", "%m PDL") — the form a decode step runs its GEMVs in.
// Every figure is the median of 5 replays of a CUDA graph of back-to-back launches (>= 200), after warm-up, timed
// with CUDA events. Weights stay cold in the 60 MB L2: each case keeps K copies of its weight (K·B >= 256 MiB, K >= 2)
// and launch i reads copy i % K; the launch count is a multiple of K, so every copy is read once per replay and
// >= 256 MiB - B of other weights pass between two reads of the same bytes, within and across replays.
// Weights are core's quantize_row of uniform random rows (64 distinct rows repeated), so every block is valid; a
// few outputs of each case are checked against a host dequantize-and-dot, so a broken launch cannot pass as fast.
//
// Usage: build/gpu/bin/bench_gemv [--split S] [FILTER]   (no filter: every case, ~2 min on an H200).
//   FILTER keeps the cases whose "shape/kernel/type" contains it (e.g. "lm_head/imma/q4_0", for a profiler run);
//   --split S runs GEMV v4 with S warps per row group (GemvImmaTuning::split) instead of the split by shape, for a
//   sweep. docs/benchmarks.md records results.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/gpu/device_timing.cuh"
#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/quant/quant.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/memory/tiled_matrix.h"

namespace kestrel::gpu {
namespace {

using namespace bench;  // the read kernel, graph timing and limits shared with bench_gdn and bench_moe

constexpr uint64_t kRotationBytes = 256ull << 20;  // K·B >= this (cold L2: the H200 has 60 MB)
constexpr int64_t kDistinctRows = 64;              // distinct quantized rows, repeated to fill a weight
constexpr int kMaxBatch = 32;                      // GEMV v4 at 1, 8, 32 vectors; the raw kernel at 1 and 8

int launches_for(uint64_t k_copies) {
  const uint64_t rounds = (kMinLaunches + k_copies - 1) / k_copies;
  return static_cast<int>(rounds * k_copies);
}

struct Shape {
  const char* name;
  int64_t n_in;   // ggml ne0: columns
  int64_t n_out;  // ggml ne1: rows
};

// gemv() on raw GGUF rows (v1/v2); gemv_imma() on the re-tiled copy (v4), with x prepared once outside the timed
// launches (as a decode step does for the matrices that share an x, or as the op that produces x writes it), or with
// one preparation per launch. (GEMV v3, bf16 tensor cores on the same tiles, was removed once v4 beat it at every
// shape; dev/notes/gpu-kernels.md has its figures.)
enum class Kernel { kRaw, kImma, kImmaPrep };
constexpr int kKernels = 3;
constexpr const char* kKernelNames[kKernels] = {"raw", "imma", "i+prep"};
constexpr const char* kKernelLong[kKernels] = {"raw (v2)", "imma (v4, x prepared once)",
                                               "imma (v4) + x preparation per call"};

struct Case {
  Shape shape;
  GgmlType type;
  Kernel kernel = Kernel::kRaw;
};

struct Row {
  std::string label;
  Kernel kernel;
  GgmlType type;
  int batch;
  uint64_t bytes;
  double us;
  double gbs;
  double pct_peak;
  double pct_matched;
  double matched_gbs;
  double us_pdl = 0;           // a chain of programmatic launches (imma only; 0: not measured)
  double pct_matched_pdl = 0;  // against the read kernel's chain of programmatic launches
};

// Fills copy 0 of `weights` with n_out rows: kDistinctRows quantized random rows, then doubled in place on the device;
// then copies it to copies 1..k-1 (each `stride` bytes apart). Returns the host bytes of the distinct rows.
Expected<std::vector<unsigned char>> fill_weights(const Case& c, uint64_t row_bytes, uint64_t stride, uint64_t k,
                                                  unsigned char* weights, std::mt19937& rng) {
  const int64_t distinct = std::min(c.shape.n_out, kDistinctRows);
  std::vector<unsigned char> host(static_cast<size_t>(row_bytes * static_cast<uint64_t>(distinct)));
  std::vector<float> row(static_cast<size_t>(c.shape.n_in));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t r = 0; r < distinct; ++r) {
    for (float& v : row) v = dist(rng);
    KESTREL_TRY(quantize_row(c.type, row.data(), host.data() + static_cast<uint64_t>(r) * row_bytes, c.shape.n_in));
  }
  const uint64_t total = row_bytes * static_cast<uint64_t>(c.shape.n_out);
  if (c.kernel != Kernel::kRaw) {
    // The whole raw matrix (the distinct rows repeated) re-tiled on the host, then uploaded once.
    std::vector<unsigned char> raw(total);
    for (uint64_t off = 0; off < total; off += host.size()) {
      std::memcpy(raw.data() + off, host.data(), std::min<uint64_t>(host.size(), total - off));
    }
    std::vector<uint8_t> tiled(total);
    KESTREL_TRY(tile_matrix_stack(c.type, raw.data(), c.shape.n_in, c.shape.n_out, 1, tiled));
    KESTREL_CUDA_TRY(memcpy_synced(weights, tiled.data(), total, cudaMemcpyHostToDevice));
  } else {
    KESTREL_CUDA_TRY(memcpy_synced(weights, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  uint64_t filled = c.kernel != Kernel::kRaw ? total : host.size();
  while (filled < total) {
    const uint64_t n = std::min(filled, total - filled);
    KESTREL_CUDA_TRY(memcpy_synced(weights + filled, weights, n, cudaMemcpyDeviceToDevice));
    filled += n;
  }
  for (uint64_t j = 1; j < k; ++j) {
    KESTREL_CUDA_TRY(memcpy_synced(weights + j * stride, weights, total, cudaMemcpyDeviceToDevice));
  }
  KESTREL_CUDA_TRY(cudaDeviceSynchronize());
  return host;
}

// Checks outputs of rows 0, 1 and n_out-1 for every vector against a host dequantize-and-dot (row r of the weight
// is distinct row r % kDistinctRows). Bound: 1e-4 · Σ|w·x| (the kernel is tested to 1e-5 in tests/gpu).
Status check_outputs(const Case& c, int batch, const std::vector<unsigned char>& host_rows, uint64_t row_bytes,
                     const std::vector<float>& x, const float* y_dev) {
  const int64_t n_in = c.shape.n_in;
  const int64_t n_out = c.shape.n_out;
  std::vector<float> y(static_cast<size_t>(batch * n_out));
  KESTREL_CUDA_TRY(memcpy_synced(y.data(), y_dev, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<float> w(static_cast<size_t>(n_in));
  for (const int64_t r : {int64_t{0}, std::min<int64_t>(1, n_out - 1), n_out - 1}) {
    const int64_t distinct = std::min(n_out, kDistinctRows);
    KESTREL_TRY(
        dequantize_row(c.type, host_rows.data() + static_cast<uint64_t>(r % distinct) * row_bytes, w.data(), n_in));
    for (int v = 0; v < batch; ++v) {
      double ref = 0;
      double mag = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        const double p = static_cast<double>(w[static_cast<size_t>(i)]) * x[static_cast<size_t>(v * n_in + i)];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = y[static_cast<size_t>(v * n_out + r)];
      if (!(std::fabs(got - ref) <= 1e-4 * mag + 1e-6)) {
        return make_error(ErrorCode::kInternal, std::string("gemv output mismatch for ") + c.shape.name + " " +
                                                    std::string(ggml_type_name(c.type)) + " batch " +
                                                    std::to_string(batch) + " row " + std::to_string(r) + ": got " +
                                                    std::to_string(got) + ", want " + std::to_string(ref));
      }
    }
  }
  return {};
}

Status run_case(const Case& c, const GemvImmaTuning& tuning, const Limits& lim, int sm_count, unsigned* partials,
                const float* x_dev, const std::vector<float>& x_host, float* y_dev, cudaStream_t stream,
                std::mt19937& rng, std::vector<Row>& rows) {
  KESTREL_TRY_ASSIGN(const uint64_t row_bytes, ggml_row_bytes(c.type, static_cast<uint64_t>(c.shape.n_in)));
  const uint64_t bytes = row_bytes * static_cast<uint64_t>(c.shape.n_out);  // B
  const uint64_t stride = (bytes + 255) / 256 * 256;                        // copies 256-byte aligned
  const uint64_t k = std::max<uint64_t>(2, (kRotationBytes + bytes - 1) / bytes);
  DeviceBuffer weights;
  KESTREL_TRY(weights.allocate(k * stride));
  KESTREL_TRY_ASSIGN(const std::vector<unsigned char> host_rows,
                     fill_weights(c, row_bytes, stride, k, weights.bytes(), rng));
  const int n_launch = launches_for(k);

  const ReadPlan plan = plan_read(bytes, sm_count);
  KESTREL_TRY_ASSIGN(const double read_us, time_graph_us(stream, n_launch, [&](int i) {
                       return launch_read(weights.bytes() + static_cast<uint64_t>(i) % k * stride, plan, partials,
                                          stream);
                     }));
  const double matched_gbs = static_cast<double>(bytes) / (read_us * 1e3);
  KESTREL_TRY_ASSIGN(const double read_pdl_us, time_graph_us(stream, n_launch, [&](int i) {
                       return launch_read(weights.bytes() + static_cast<uint64_t>(i) % k * stride, plan, partials,
                                          stream, true);
                     }));

  DeviceBuffer xprep_buf;  // prepared activations for the tiled kernels
  void* xprep = nullptr;
  if (c.kernel != Kernel::kRaw) {
    KESTREL_TRY(xprep_buf.allocate(imma_x_bytes(c.shape.n_in, kMaxBatch)));
    xprep = xprep_buf.bytes();
  }
  auto prepare = [&](int batch) { return gemv_imma_prepare_x(x_dev, c.shape.n_in, batch, xprep, stream); };
  for (const int batch : {1, 8, kMaxBatch}) {
    if (batch == kMaxBatch && c.kernel == Kernel::kRaw) continue;
    if (c.kernel == Kernel::kImma) {
      KESTREL_TRY(prepare(batch));
      KESTREL_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    KESTREL_TRY_ASSIGN(
        const double us, time_graph_us(stream, n_launch, [&](int i) -> Status {
          const void* data = weights.bytes() + static_cast<uint64_t>(i) % k * stride;
          if (c.kernel == Kernel::kImmaPrep) KESTREL_TRY(prepare(batch));
          if (c.kernel != Kernel::kRaw) {
            return gemv_imma(TiledView{c.type, data, c.shape.n_in, c.shape.n_out}, xprep, batch, y_dev, stream, false,
                             tuning);
          }
          return gemv(DeviceMatrixView{c.type, data, c.shape.n_in, c.shape.n_out}, x_dev, batch, y_dev, stream);
        }));
    KESTREL_TRY(check_outputs(c, batch, host_rows, row_bytes, x_host, y_dev));
    const double gbs = static_cast<double>(bytes) / (us * 1e3);
    Row row{c.shape.name,
            c.kernel,
            c.type,
            batch,
            bytes,
            us,
            gbs,
            100.0 * gbs / lim.peak_read_gbs,
            100.0 * gbs / matched_gbs,
            matched_gbs};
    if (c.kernel == Kernel::kImma) {
      // The same launches as programmatic dependents of each other, as a decode step chains them (the weight loads
      // start during the launch before), against the read kernel chained the same way.
      KESTREL_CUDA_TRY(memset_synced(y_dev, 0xFF, static_cast<size_t>(batch * c.shape.n_out) * sizeof(float)));
      KESTREL_TRY_ASSIGN(const double us_pdl, time_graph_us(stream, n_launch, [&](int i) -> Status {
                           const void* data = weights.bytes() + static_cast<uint64_t>(i) % k * stride;
                           return gemv_imma(TiledView{c.type, data, c.shape.n_in, c.shape.n_out}, xprep, batch, y_dev,
                                            stream, true, tuning);
                         }));
      KESTREL_TRY(check_outputs(c, batch, host_rows, row_bytes, x_host, y_dev));
      row.us_pdl = us_pdl;
      row.pct_matched_pdl = 100.0 * read_pdl_us / us_pdl;
    }
    rows.push_back(row);
  }
  return {};
}

Status run(const std::string& only, const GemvImmaTuning& tuning) {
  BenchSetup setup;
  KESTREL_TRY(setup.start());
  const int sm_count = setup.sm_count;
  cudaStream_t stream = setup.stream;
  const Limits& lim = setup.lim;
  unsigned* partials_u32 = setup.partials();

  // qwen35moe-35b-a3b decode shapes, H = 2048; {n_in, n_out} as ggml's {ne0, ne1}.
  const Shape attn_qkv{"gdn.attn_qkv", 2048, 8192};
  const Shape attn_gate{"gdn.attn_gate", 2048, 4096};
  const Shape ssm_out{"gdn.ssm_out", 4096, 2048};
  const Shape attn_q{"attn.attn_q", 2048, 8192};
  const Shape attn_k{"attn.attn_k", 2048, 512};
  const Shape attn_output{"attn.attn_output", 4096, 2048};
  const Shape lm_head{"lm_head", 2048, 248320};
  // qwen3next-80b-a3b: the same GDN/attention projections as above, plus these; per-expert shapes of both presets.
  const Shape next_lm_head{"next.lm_head", 2048, 151936};
  const Shape next_ssm_ba{"next.ssm_ba", 2048, 64};
  const Shape exp_gate{"expert.gate_up", 2048, 512};
  const Shape exp_down{"expert.down", 512, 2048};
  // Every type gpu::gemv takes on every shape (Q4_0 / Q4_K first: the issue's target and the geomean; then the types
  // real files keep the rest in — Q4_K_M: attn_qkv Q5_K, lm_head Q6_K; Q5_K_M; Q8_0 — and the plain ones of
  // unquantized files), on the raw kernel and, where it takes the type, GEMV v4.
  std::vector<Case> cases;
  for (const GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_0,
                           GgmlType::kBF16, GgmlType::kF16, GgmlType::kF32}) {
    for (const Shape& s : {attn_qkv, attn_gate, ssm_out, attn_q, attn_k, attn_output, lm_head, next_lm_head,
                           next_ssm_ba, exp_gate, exp_down}) {
      if (s.n_in % static_cast<int64_t>(ggml_type_traits(t).block_elems) != 0) continue;
      cases.push_back({s, t, Kernel::kRaw});
      if (gemv_imma_supports(t, s.n_in, s.n_out)) {
        cases.push_back({s, t, Kernel::kImma});
        cases.push_back({s, t, Kernel::kImmaPrep});
      }
    }
  }

  int64_t max_in = 0;
  int64_t max_out = 0;
  for (const Case& c : cases) {
    max_in = std::max(max_in, c.shape.n_in);
    max_out = std::max(max_out, c.shape.n_out);
  }
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  DeviceBuffer x_dev;  // f32 [kMaxBatch, n_in] (re-filled per n_in)
  DeviceBuffer y_dev;  // f32 [kMaxBatch, max n_out]
  KESTREL_TRY(x_dev.allocate(static_cast<uint64_t>(kMaxBatch * max_in) * sizeof(float)));
  KESTREL_TRY(y_dev.allocate(static_cast<uint64_t>(kMaxBatch * max_out) * sizeof(float)));

  std::vector<Row> rows;
  for (const Case& c : cases) {
    const char* kname = kKernelNames[static_cast<int>(c.kernel)];
    const std::string id = std::string(c.shape.name) + "/" + kname + "/" + std::string(ggml_type_name(c.type));
    if (!only.empty() && id.find(only) == std::string::npos) continue;
    std::vector<float> x(static_cast<size_t>(kMaxBatch * c.shape.n_in));  // f32 [kMaxBatch, n_in]
    for (float& v : x) v = dist(rng);
    KESTREL_CUDA_TRY(memcpy_synced(x_dev.floats(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    KESTREL_TRY(run_case(c, tuning, lim, sm_count, partials_u32, x_dev.floats(), x, y_dev.floats(), stream, rng, rows));
  }

  std::printf("\n%-18s %-6s %-5s %5s %12s %9s %8s %8s %9s %14s %8s %9s\n", "case", "kernel", "type", "batch", "bytes",
              "us", "GB/s", "%peak", "%matched", "matched GB/s", "us PDL", "%m PDL");
  double log_sum[kKernels] = {};
  int n_geo[kKernels] = {};
  double log_sum_pdl = 0;
  int n_geo_pdl = 0;
  for (const Row& r : rows) {
    const int kv = static_cast<int>(r.kernel);
    std::printf("%-18s %-6s %-5s %5d %12" PRIu64 " %9.2f %8.0f %7.1f%% %8.1f%% %14.0f", r.label.c_str(),
                kKernelNames[kv], std::string(ggml_type_name(r.type)).c_str(), r.batch, r.bytes, r.us, r.gbs,
                r.pct_peak, r.pct_matched, r.matched_gbs);
    if (r.us_pdl > 0) std::printf(" %8.2f %8.1f%%", r.us_pdl, r.pct_matched_pdl);
    std::printf("\n");
    if (r.batch == 1 && (r.type == GgmlType::kQ4_0 || r.type == GgmlType::kQ4_K)) {
      log_sum[kv] += std::log(r.pct_matched);
      ++n_geo[kv];
      if (r.us_pdl > 0) {
        log_sum_pdl += std::log(r.pct_matched_pdl);
        ++n_geo_pdl;
      }
    }
  }
  for (int kv = 0; kv < kKernels; ++kv) {
    if (n_geo[kv] == 0) continue;
    std::printf("geomean %% of size-matched read, batch 1, Q4_0 + Q4_K, %s (%d cases): %.1f%%\n", kKernelLong[kv],
                n_geo[kv], std::exp(log_sum[kv] / n_geo[kv]));
  }
  if (n_geo_pdl > 0) {
    std::printf(
        "geomean %% of size-matched read, batch 1, Q4_0 + Q4_K, imma (v4), both as chains of programmatic "
        "launches (%d cases): %.1f%%\n",
        n_geo_pdl, std::exp(log_sum_pdl / n_geo_pdl));
  }
  // Per type, batch 1: the kernel a decode step would use — GEMV v4 where it takes the type, the raw kernel else.
  std::vector<GgmlType> types;
  for (const Row& r : rows) {
    if (std::find(types.begin(), types.end(), r.type) == types.end()) types.push_back(r.type);
  }
  for (const GgmlType t : types) {
    const bool v4 =
        std::any_of(rows.begin(), rows.end(), [&](const Row& r) { return r.type == t && r.kernel == Kernel::kImma; });
    const Kernel k = v4 ? Kernel::kImma : Kernel::kRaw;
    double log_sum_t = 0;
    int n_t = 0;
    for (const Row& r : rows) {
      if (r.type != t || r.kernel != k || r.batch != 1) continue;
      log_sum_t += std::log(r.pct_matched);
      ++n_t;
    }
    std::printf("geomean %% of size-matched read, batch 1, %s, %s (%d cases): %.1f%%\n",
                std::string(ggml_type_name(t)).c_str(), kKernelLong[static_cast<int>(k)], n_t,
                std::exp(log_sum_t / n_t));
  }
  return {};
}

}  // namespace
}  // namespace kestrel::gpu

// bench_gemv [--split S] [FILTER] (see the head of this file).
int main(int argc, char** argv) {
  kestrel::gpu::GemvImmaTuning tuning;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--split" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      tuning.split = std::atoi(argv[++i]);
    } else if (a.empty() || a[0] == '-' || !filter.empty()) {
      std::fprintf(stderr, "usage: bench_gemv [--split S] [FILTER]\n");
      return 2;
    } else {
      filter = a;
    }
  }
  return kestrel::gpu::bench::exit_status("bench_gemv", kestrel::gpu::run(filter, tuning));
}
