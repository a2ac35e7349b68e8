#!/usr/bin/env python3
"""Instruments a COPY of the source tree for the GDN phase-clock measurements of 6eb9850^:docs/benchmarks.md
("GDN decode step: where the 1-session time goes"); never run it on your working tree.

It edits gpu/kernels/gdn_decode.cu and bench/gpu/bench_gdn.cu of the copy in place:
  - the per-V-head kernel (gdn_head_kernel, the presets' kernel) stamps clock64() at block entry, after its
    programmatic wait (plain launches: the same place), after each of its five __syncthreads and at its end (thread 0,
    through shared memory, so the kernel's 64 registers are not touched), plus the global timer at entry and end, into
    a device array; bench_gdn prints, after the chained (programmatic) timing and after the plain forced per-head
    timing at each session count, the median and maximum of each stamp over the blocks of the last launch, the spread
    of block start times and the blocks' durations (the cluster kernel this script also stamped left the product; git
    history has both);
  - --no-s-loads / --no-s-stores knock out the S-slice loads (registers get constants) or stores (kept behind a
    condition that never holds, so the arithmetic stays), to see what the step costs without that traffic.

Usage, on the lent GPU machine (tools/device/gpu_targets.sh builds and runs):
  cp -r . /tmp/clk && python3 tools/device/gdn_phase_clocks.py /tmp/clk [--no-s-loads] [--no-s-stores]
  (cd /tmp/clk && OUT=$OUT bash tools/device/gpu_targets.sh bench_gdn build/gpu/bin/bench_gdn)
"""
import argparse
import sys

from source_patch import apply_edits, function_body, replace_once


DUMP = r'''
namespace {
__device__ long long g_phase_clock[4096][8];
__device__ unsigned long long g_phase_timer[4096][2];
}  // namespace

// Prints the stamps of the last launch's first n_blocks blocks (dev instrumentation, tools/device/gdn_phase_clocks.py).
void gdn_print_phase_clocks(int n_blocks, const char* what) {
  static long long clk[4096][8];
  static unsigned long long tmr[4096][2];
  if (n_blocks > 4096) n_blocks = 4096;
  if (cudaMemcpyFromSymbol(clk, g_phase_clock, sizeof(clk)) != cudaSuccess ||
      cudaMemcpyFromSymbol(tmr, g_phase_timer, sizeof(tmr)) != cudaSuccess) {
    std::printf("phase clocks: copy failed\n");
    return;
  }
  unsigned long long lo = ~0ull, hi = 0;
  for (int b = 0; b < n_blocks; ++b) {
    lo = std::min(lo, tmr[b][0]);
    hi = std::max(hi, tmr[b][1]);
  }
  std::printf("phase clocks, %s (cycles from block entry): median / max over %d blocks; global timer span %llu ns\n",
              what, n_blocks, hi - lo);
  const char* names[] = {PHASE_NAMES};
  constexpr int kStamps = static_cast<int>(sizeof(names) / sizeof(names[0]));
  auto median_max = [n_blocks](std::vector<long long> v) {
    std::sort(v.begin(), v.end());
    return std::make_pair(v[static_cast<size_t>(n_blocks / 2)], v.back());
  };
  for (int k = 1; k < kStamps; ++k) {
    std::vector<long long> v;
    for (int b = 0; b < n_blocks; ++b) v.push_back(clk[b][k]);
    const auto mm = median_max(v);
    std::printf("  %-14s %8lld %8lld\n", names[k], mm.first, mm.second);
  }
  std::vector<long long> start, dur;
  for (int b = 0; b < n_blocks; ++b) {
    start.push_back(static_cast<long long>(tmr[b][0] - lo));
    dur.push_back(static_cast<long long>(tmr[b][1] - tmr[b][0]));
  }
  const auto s = median_max(start);
  const auto d = median_max(dur);
  std::printf("  block start spread (ns): median %lld max %lld; block duration (ns): median %lld max %lld\n", s.first,
              s.second, d.first, d.second);
}

namespace {
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="the copy of the source tree to instrument")
    ap.add_argument("--no-s-loads", action="store_true", help="knock out the S-slice loads")
    ap.add_argument("--no-s-stores", action="store_true", help="knock out the S-slice stores")
    ap.add_argument("--kernel", choices=["per-head"], default="per-head", help="the kernel to stamp (the only one)")
    a = ap.parse_args()
    path = a.root + "/gpu/kernels/gdn_decode.cu"
    src = open(path).read()
    src, names, knockouts, bench_edits = stamp_per_head(src)
    src = replace_once(src, "namespace {\n\nconstexpr int kDeltaWarps",
                       DUMP.replace("PHASE_NAMES", names) + "\nconstexpr int kDeltaWarps", "anonymous namespace head")
    src = replace_once(src, "#include <string>\n", "#include <string>\n#include <cstdio>\n#include <utility>\n"
                       "#include <vector>\n", "#include <string>")
    if a.no_s_loads:
        src = replace_once(src, *knockouts["loads"])
    if a.no_s_stores:
        src = replace_once(src, *knockouts["stores"])
    open(path, "w").write(src)

    bench = a.root + "/bench/gpu/bench_gdn.cu"
    b = apply_edits(open(bench).read(), [
        ("namespace kestrel::gpu::bench {",
         "namespace kestrel::gpu {\nvoid gdn_print_phase_clocks(int n_blocks, const char* what);\n}\n"
         "namespace kestrel::gpu::bench {", "bench namespace")] + bench_edits)
    open(bench, "w").write(b)


def stamp_per_head(src):
    """Stamps in gdn_head_kernel (thread 0 into shared memory, then to the device array); returns the edited source, the
    stamps' names, the S knock-out edits and the bench's print calls."""
    body_start, body_end = function_body(src, "gdn_head_kernel(Geo g")
    body = src[body_start:body_end]
    stamp = "  if (threadIdx.x == 0) ph_clk[{k}] = clock64();\n"
    body = replace_once(body, "  if constexpr (kPdl) pdl_trigger();\n",
                        "  __shared__ long long ph_clk[8];\n  __shared__ unsigned long long ph_t0;\n"
                        "  if (threadIdx.x == 0) {\n    ph_clk[0] = clock64();\n"
                        "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(ph_t0));\n  }\n"
                        "  if constexpr (kPdl) pdl_trigger();\n", "the programmatic trigger")
    body = replace_once(body, "  if constexpr (kPdl) pdl_wait();\n",
                        "  if constexpr (kPdl) pdl_wait();\n" + stamp.format(k=1), "the programmatic wait")
    syncs = [line for line in body.split("\n") if line.startswith("  __syncthreads();")]
    if len(syncs) != 5:
        sys.exit("gdn_phase_clocks: the per-V-head kernel no longer has five __syncthreads; update this script")
    for k, line in enumerate(syncs, start=2):
        body = replace_once(body, line + "\n", line + "\n" + stamp.format(k=k), f"__syncthreads {k - 1}")
    body = body + """  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long t_end = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_end));
    const unsigned b = blockIdx.x + gridDim.x * blockIdx.y;
    if (b < 4096) {
      ph_clk[7] = clock64();
      for (int k = 0; k < 8; ++k) g_phase_clock[b][k] = ph_clk[k] - ph_clk[0];
      g_phase_timer[b][0] = ph_t0;
      g_phase_timer[b][1] = t_end;
    }
  }
"""
    names = '"entry", "after wait", "prologue sync", "m sync", "delta sync", "o sync", "norm sync", "end"'
    knockouts = {
        "loads": ("? __ldcs(s_slice + r * dv + 32 * c) : 0.0f;", "? 0.001f * static_cast<float>(r + c) : 0.0f;",
                  "per-head S load"),
        "stores": ("__stcs(s_slice + r * dv + 32 * c, s[r][c]);",
                   "if (s[r][c] == 12345.0f) __stcs(s_slice + r * dv + 32 * c, s[r][c]);", "per-head S store"),
    }
    bench_edits = [
        ("    KESTREL_TRY_ASSIGN(const double us_pdl, time_steps(true, GdnDecodeTuning{}));\n",
         "    KESTREL_TRY_ASSIGN(const double us_pdl, time_steps(true, GdnDecodeTuning{}));\n"
         "    gdn_print_phase_clocks(d.n_v_heads * n_seq, \"per-head, chained\");\n", "the chained timing"),
        ("    // Sanity: the outputs are finite",
         "    if (us_forced[0] > 0.0) gdn_print_phase_clocks(d.n_v_heads * n_seq, \"per-head, plain\");\n"
         "    // Sanity: the outputs are finite", "bench sanity comment")]
    return src[:body_start] + body + src[body_end:], names, knockouts, bench_edits


if __name__ == "__main__":
    main()
