#!/usr/bin/env python3
"""Instruments a COPY of the source tree to show where the spread routing (route_spread_table_kernel in
gpu/kernels/moe_imma.cu, moe_route_dev::route_spread in gpu/kernels/moe_route.cuh; the MoE layer's route + tables from
MoeImmaTuning::route_spread_min_tokens tokens) spends its time; never run it on your working tree.

Thread 0 of every block stamps %globaltimer (ns, one clock for all SMs) at the kernel's entry, after its programmatic
wait, after its warp routed its token (route_one) and after the warp's arrival (warp_arrive); the last block to arrive
also stamps once the entries are back in shared memory, after the grouping (group_entries), before the table writer
(write_tables), after the writer's scan and chunk marks (the barrier after them), when thread 0 has stored its
pieces, when every thread has (an added barrier) and at thread 0's end of it. That block prints, for the 20th call
and every 1000th after it, each stamp's earliest, mean and latest over the blocks in us from the earliest entry
(bench_moe's graph replays make thousands of calls).

Usage, on the lent GPU machine:
  mkdir /tmp/rp && tar --exclude=./build -cf - . | tar -x -C /tmp/rp
  python3 tools/device/route_phases.py /tmp/rp
  cd /tmp/rp && OUT=$OUT bash tools/device/gpu_targets.sh bench_moe \\
      'build/gpu/bin/bench_moe --main q4_0/32 | grep -A12 "route phases" | head -40'
"""
import argparse

from source_patch import apply_edits

HEAD = r'''
namespace {
constexpr int kPhBlocks = 64;
__device__ unsigned long long g_rp[kPhBlocks][4];  // per block: entry, waited, routed, arrived
__device__ unsigned long long g_rl[7];  // the last block: entries in, grouped, tables start, end, scanned, stored, all
__device__ unsigned g_rp_calls;
}  // namespace
__device__ __forceinline__ unsigned long long rp_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void rp_block(int i) {
  if (threadIdx.x == 0 && blockIdx.x < kPhBlocks) g_rp[blockIdx.x][i] = rp_now();
}
__device__ __forceinline__ void rp_last(int i) {
  if (threadIdx.x == 0) g_rl[i] = rp_now();
}
'''

REPORT = r'''
  if (threadIdx.x == 0) {
    moe_route_dev::rp_last(3);
    const unsigned call = moe_route_dev::g_rp_calls++;
    if (call % 1000 == 20) {
      const int nb = min(static_cast<int>(gridDim.x), moe_route_dev::kPhBlocks);
      unsigned long long t0 = ~0ull;
      for (int b = 0; b < nb; ++b) t0 = min(t0, moe_route_dev::g_rp[b][0]);
      const char* names[4] = {"entry", "waited", "routed", "arrived"};
      printf("route phases (call %u, %d blocks, us from the earliest entry): stamp, earliest, mean, latest\n", call, nb);
      for (int i = 0; i < 4; ++i) {
        unsigned long long lo = ~0ull, hi = 0, sum = 0;
        for (int b = 0; b < nb; ++b) {
          const unsigned long long v = moe_route_dev::g_rp[b][i] - t0;
          lo = min(lo, v);
          hi = max(hi, v);
          sum += v;
        }
        printf("  %-14s %8.2f %8.2f %8.2f\n", names[i], lo * 1e-3, sum * 1e-3 / nb, hi * 1e-3);
      }
      const char* last[7] = {"last: entries", "last: grouped", "last: tables", "last: scanned", "last: t0 stored",
                             "last: all stored", "last: end"};
      const int order[7] = {0, 1, 2, 4, 5, 6, 3};
      for (int i = 0; i < 7; ++i) printf("  %-16s %8.2f\n", last[i], (moe_route_dev::g_rl[order[i]] - t0) * 1e-3);
    }
  }
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", help="a copy of the source tree (edited in place)")
    args = ap.parse_args()
    route = args.tree + "/gpu/kernels/moe_route.cuh"
    with open(route) as f:
        s = f.read()
    s = apply_edits(s, [
        ("namespace kestrel::gpu::moe_route_dev {\n", "namespace kestrel::gpu::moe_route_dev {\n" + HEAD,
         "the namespace"),
        ("    route_one<kPer>(logits, static_cast<int>(blockIdx.x), n_expert, k, tid, r, nullptr);\n",
         "    route_one<kPer>(logits, static_cast<int>(blockIdx.x), n_expert, k, tid, r, nullptr);\n    rp_block(2);\n",
         "route_spread's route_one"),
        ("    const bool last = warp_arrive(arrivals, static_cast<unsigned>(n_tok), tid);\n",
         "    const bool last = warp_arrive(arrivals, static_cast<unsigned>(n_tok), tid);\n    rp_block(3);\n",
         "route_spread's arrival"),
        ("  __syncthreads();\n  *rt = group_entries(s, n_tok, n_expert, k, r);\n",
         "  __syncthreads();\n  rp_last(0);\n  *rt = group_entries(s, n_tok, n_expert, k, r);\n  rp_last(1);\n",
         "route_spread's grouping"),
    ])
    with open(route, "w") as f:
        f.write(s)
    imma = args.tree + "/gpu/kernels/moe_imma.cu"
    with open(imma) as f:
        s = f.read()
    s = apply_edits(s, [
        ("    route_spread_table_kernel(const float* __restrict__ logits, int n_expert, int k, TableArgs a) {\n"
         "  pdl_trigger();\n  pdl_wait();\n",
         "    route_spread_table_kernel(const float* __restrict__ logits, int n_expert, int k, TableArgs a) {\n"
         "  moe_route_dev::rp_block(0);\n  pdl_trigger();\n  pdl_wait();\n  moe_route_dev::rp_block(1);\n",
         "route_spread_table_kernel's start"),
        ("  for (int q = 0; q < chunks; ++q) chunk_expert_s[chunk0 + q] = static_cast<short>(e);\n  __syncthreads();\n",
         "  for (int q = 0; q < chunks; ++q) chunk_expert_s[chunk0 + q] = static_cast<short>(e);\n  __syncthreads();\n"
         "  moe_route_dev::rp_last(4);\n", "write_tables' scan"),
        ("  finish_tables(a, used, tid, kBlock);\n}\n",
         "  moe_route_dev::rp_last(5);\n  __syncthreads();\n  moe_route_dev::rp_last(6);\n"
         "  finish_tables(a, used, tid, kBlock);\n}\n", "write_tables' end"),
        ("  if (!moe_route_dev::route_spread<kPer>(logits, a.n_tok, n_expert, k, a.r, a.arrivals, &rt)) return;\n"
         "  __syncthreads();\n  write_tables<moe_route_dev::kThreads>(a, rt, n_expert);\n}\n",
         "  if (!moe_route_dev::route_spread<kPer>(logits, a.n_tok, n_expert, k, a.r, a.arrivals, &rt)) return;\n"
         "  __syncthreads();\n  moe_route_dev::rp_last(2);\n  write_tables<moe_route_dev::kThreads>(a, rt, n_expert);\n"
         + REPORT + "}\n", "route_spread_table_kernel's end"),
    ])
    with open(imma, "w") as f:
        f.write(s)


if __name__ == "__main__":
    main()
