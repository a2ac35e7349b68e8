#!/usr/bin/env python3
"""Instruments a COPY of the source tree to see where a small GEMV v4 launch spends its time
(6eb9850^:docs/benchmarks.md, "GEMV v4.4"); never run it on your working tree.

It edits the copy in place:
  - gpu/kernels/gemv_imma.cu: lane 0 of every warp of gemv_imma_flat_kernel (the dense calls' kernel at one group per warp:
    every batch-1 projection of the presets) stamps clock64() at entry, after its weight loads are issued, after its
    group's multiply and pair sums (so after the data arrived), after the cross-warp barrier (S > 1) and at its end,
    plus the global timer at entry and end, into device arrays (before 2026-12-01 it stamped the persistent
    gemv_imma_kernel, which the dense batch-1 calls no longer take);
  - bench/gpu/device_timing.cuh: thread 0 of every block of the streaming-read kernel stamps the global timer at
    entry and end;
  - bench/gpu/bench_gemv.cu: after timing the size-matched read and each batch-1 GEMV v4 case, prints the last
    launch's stamps: per-phase median / max over warps (cycles from the warp's entry), the spread of start times,
    and the kernel's span (first entry to last end) next to the time per launch, whose difference is the gap
    between launches.

Usage, on the lent GPU machine:
  mkdir /tmp/clk && tar --exclude=./build -cf - . | tar -x -C /tmp/clk
  python3 tools/device/gemv_phase_clocks.py /tmp/clk
  (cd /tmp/clk && OUT=$OUT bash tools/device/gpu_targets.sh bench_gemv "build/gpu/bin/bench_gemv /imma/")
"""
import argparse

from source_patch import apply_edits, function_body, replace_once

GEMV_DUMP = r'''
constexpr int kClkWarps = 8192;
__device__ long long g_gemv_clk[kClkWarps][5];
__device__ unsigned long long g_gemv_tmr[kClkWarps][2];

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace

void gemv_reset_phase_clocks() {
  static long long zc[kClkWarps][5];
  static unsigned long long zt[kClkWarps][2];
  (void)cudaMemcpyToSymbol(g_gemv_clk, zc, sizeof(zc));
  (void)cudaMemcpyToSymbol(g_gemv_tmr, zt, sizeof(zt));
}

// Prints the stamps of the warps of the last launch (those with an end stamp).
void gemv_print_phase_clocks(double us_per_launch) {
  static long long clk[kClkWarps][5];
  static unsigned long long tmr[kClkWarps][2];
  if (cudaMemcpyFromSymbol(clk, g_gemv_clk, sizeof(clk)) != cudaSuccess ||
      cudaMemcpyFromSymbol(tmr, g_gemv_tmr, sizeof(tmr)) != cudaSuccess) {
    std::printf("phase clocks: copy failed\n");
    return;
  }
  std::vector<int> ws;
  for (int w = 0; w < kClkWarps; ++w) {
    if (tmr[w][1] != 0) ws.push_back(w);
  }
  if (ws.empty()) return;
  unsigned long long lo = ~0ull, hi = 0;
  for (int w : ws) {
    lo = std::min(lo, tmr[w][0]);
    hi = std::max(hi, tmr[w][1]);
  }
  auto med_max = [](std::vector<long long> v) {
    std::sort(v.begin(), v.end());
    return std::make_pair(v[v.size() / 2], v.back());
  };
  std::printf("  gemv phases, %zu warps (cycles from warp entry, median / max): ", ws.size());
  const char* names[5] = {"", "loads issued", "first multiply", "first barrier", "end"};
  for (int k = 1; k < 5; ++k) {
    std::vector<long long> v;
    for (int w : ws) v.push_back(clk[w][k] > 0 ? clk[w][k] - clk[w][0] : 0);
    const auto mm = med_max(v);
    std::printf("%s %lld / %lld; ", names[k], mm.first, mm.second);
  }
  std::vector<long long> start, dur;
  for (int w : ws) {
    start.push_back(static_cast<long long>(tmr[w][0] - lo));
    dur.push_back(static_cast<long long>(tmr[w][1] - tmr[w][0]));
  }
  const auto s = med_max(start);
  const auto d = med_max(dur);
  std::printf("\n  gemv span %llu ns of %.0f ns per launch; warp start spread median %lld max %lld ns; warp duration "
              "median %lld max %lld ns\n", hi - lo, us_per_launch * 1e3, s.first, s.second, d.first, d.second);
}

namespace {
'''

READ_DUMP = r'''
constexpr int kReadClkBlocks = 8192;
__device__ unsigned long long g_read_tmr[kReadClkBlocks][2];

inline void read_reset_phase_clocks() {
  static unsigned long long z[kReadClkBlocks][2];
  (void)cudaMemcpyToSymbol(g_read_tmr, z, sizeof(z));
}

inline void read_print_phase_clocks(double us_per_launch) {
  static unsigned long long t[kReadClkBlocks][2];
  if (cudaMemcpyFromSymbol(t, g_read_tmr, sizeof(t)) != cudaSuccess) return;
  unsigned long long lo = ~0ull, hi = 0;
  std::vector<long long> start, dur;
  for (int b = 0; b < kReadClkBlocks; ++b) {
    if (t[b][1] == 0) continue;
    lo = std::min(lo, t[b][0]);
    hi = std::max(hi, t[b][1]);
  }
  for (int b = 0; b < kReadClkBlocks; ++b) {
    if (t[b][1] == 0) continue;
    start.push_back(static_cast<long long>(t[b][0] - lo));
    dur.push_back(static_cast<long long>(t[b][1] - t[b][0]));
  }
  if (start.empty()) return;
  std::sort(start.begin(), start.end());
  std::sort(dur.begin(), dur.end());
  std::printf("  read span %llu ns of %.0f ns per launch; block start spread median %lld max %lld ns; block "
              "duration median %lld max %lld ns\n", hi - lo, us_per_launch * 1e3, start[start.size() / 2],
              start.back(), dur[dur.size() / 2], dur.back());
}

'''


def instrument_gemv(root):
    path = root + "/gpu/kernels/gemv_imma.cu"
    src = apply_edits(open(path).read(), [
        ("#include <type_traits>\n",
         "#include <type_traits>\n#include <cstdio>\n#include <utility>\n#include <vector>\n",
         "#include <type_traits>"),
        ("// ---- the GEMV kernel ---", GEMV_DUMP + "\n// ---- the GEMV kernel ---", "kernel banner"),
    ])
    a, b = function_body(src, "gemv_imma_flat_kernel(FlatArgs a)")
    body = src[a:b]
    body = replace_once(body, "  extern __shared__ __align__(128) uint8_t smem[];\n",
                        "  extern __shared__ __align__(128) uint8_t smem[];\n  long long clk[5] = {};\n"
                        "  clk[0] = clock64();\n  const unsigned long long t_entry = global_ns();\n",
                        "flat kernel entry")
    load = "w_load<T>(a, r, 0, sl, b);\n"
    if body.count(load) != 2:
        raise SystemExit("gemv_phase_clocks.py: expected the flat kernel's two first-group loads; update this script")
    body = body.replace(load, load + "    clk[1] = clock64();\n")
    body = replace_once(body, "  for (int p = 0; p < NP; ++p) pair_sum(acc[p], lane);\n",
                        "  for (int p = 0; p < NP; ++p) pair_sum(acc[p], lane);\n"
                        "  if (acc[0][0] == 1.2345e30f) asm volatile(\"trap;\");  // the stamp after the sums' data\n"
                        "  clk[2] = clock64();\n", "pair sums")
    body = replace_once(body, "  __syncthreads();\n", "  __syncthreads();\n  clk[3] = clock64();\n", "flat barrier")
    stamp_end = """  {
    clk[4] = clock64();
    const unsigned long long t_end = global_ns();
    const int wid = (static_cast<int>(blockIdx.y) * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x)) *
                        static_cast<int>(blockDim.x / 32) + warp;
    if (lane == 0 && wid < kClkWarps) {
      for (int k = 0; k < 5; ++k) g_gemv_clk[wid][k] = clk[k];
      g_gemv_tmr[wid][0] = t_entry;
      g_gemv_tmr[wid][1] = t_end;
    }
  }
"""
    body = replace_once(body, "    return;\n  }\n  float* part", stamp_end + "    return;\n  }\n  float* part",
                        "S == 1 return")
    body = body + stamp_end
    src = src[:a] + body + src[b:]
    open(path, "w").write(src)


def instrument_read(root):
    path = root + "/bench/gpu/device_timing.cuh"
    src = apply_edits(open(path).read(), [
        ("// Plain streaming read:", READ_DUMP + "// Plain streaming read:", "read kernel comment"),
        ("  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;\n"
         "  uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;\n"
         "  unsigned acc = 0;\n",
         "  unsigned long long t_entry;\n  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t_entry));\n"
         "  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;\n"
         "  uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;\n"
         "  unsigned acc = 0;\n", "read kernel head"),
        ("    out[blockIdx.x] = total;\n  }\n}\n",
         "    out[blockIdx.x] = total;\n    unsigned long long t_end;\n"
         "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t_end));\n"
         "    if (blockIdx.x < kReadClkBlocks) g_read_tmr[blockIdx.x][0] = t_entry, "
         "g_read_tmr[blockIdx.x][1] = t_end;\n  }\n}\n", "read kernel end"),
    ])
    open(path, "w").write(src)


def instrument_bench(root):
    path = root + "/bench/gpu/bench_gemv.cu"
    b = apply_edits(open(path).read(), [
        ("namespace kestrel::gpu {\nnamespace {\n",
         "namespace kestrel::gpu {\nvoid gemv_reset_phase_clocks();\n"
         "void gemv_print_phase_clocks(double us_per_launch);\nnamespace {\n", "bench namespace"),
        ("  const ReadPlan plan = plan_read(bytes, sm_count);\n",
         "  const ReadPlan plan = plan_read(bytes, sm_count);\n  read_reset_phase_clocks();\n", "read plan"),
        ("  const double matched_gbs =",
         "  std::printf(\"%s/%s/%s\\n\", c.shape.name, kKernelNames[static_cast<int>(c.kernel)], "
         "std::string(ggml_type_name(c.type)).c_str());\n  read_print_phase_clocks(read_us);\n"
         "  const double matched_gbs =", "matched gbs"),
        ("    KESTREL_TRY_ASSIGN(\n        const double us, time_graph_us(",
         "    gemv_reset_phase_clocks();\n    KESTREL_TRY_ASSIGN(\n        const double us, time_graph_us(",
         "gemv timing"),
        ("    KESTREL_TRY(check_outputs(c, batch, host_rows, row_bytes, x_host, y_dev));\n    const double gbs",
         "    if (batch == 1 && c.kernel == Kernel::kImma) gemv_print_phase_clocks(us);\n"
         "    KESTREL_TRY(check_outputs(c, batch, host_rows, row_bytes, x_host, y_dev));\n    const double gbs",
         "check call"),
    ])
    open(path, "w").write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="the copy of the source tree to instrument")
    a = ap.parse_args()
    instrument_gemv(a.root)
    instrument_read(a.root)
    instrument_bench(a.root)


if __name__ == "__main__":
    main()
