#!/usr/bin/env python3
"""Instruments a COPY of the source tree to show when each kind of warp task of the one-launch MoE layer
(gpu/moe_imma_one.cu) starts and ends within the kernel; never run it on your working tree.

Every warp stamps %globaltimer (ns, one clock for all SMs) at its entry and exit and around each of its tasks into its
own slots (thousands of atomics on one address would serialise and distort what they measure); the rarer events —
the routing, the end of a down task's wait for its activations, the gate+up row finish, the activation
preparation and the combine — keep the earliest and latest start and end per kind with 64-bit atomics. The last
block of every 1000th call (from the 20th) folds the warps' slots per kind and prints every kind relative to the
earliest warp entry; every call then resets the atomics' slots.

Usage, on the lent GPU machine:
  mkdir /tmp/ph && tar --exclude=./build -cf - . | tar -x -C /tmp/ph
  python3 tools/device/moe_one_phases.py /tmp/ph [--no-cooperative]
  cd /tmp/ph && OUT=$OUT bash tools/device/gpu_targets.sh bench_moe 'build/gpu/bin/bench_moe | grep -B2 -A16 phases'
--no-cooperative launches without the cooperative attribute (the grid still fits the device at once).
"""
import argparse

from source_patch import apply_edits, function_body

KINDS = ["x prep", "shared gate", "router row", "shared g+u", "shared down", "-", "gate+up", "down",
         "routing", "g+u row finish", "act prepare", "combine", "down wait end", "route: logits in", "warp exit",
         "warp entry", "g+u routing known", "g+u loads issued", "g+u x ready", "g+u multiplied", "g+u arrived",
         "down multiplied", "down arrived", "route: selected"]

HEAD = r'''
__device__ unsigned long long g_ph[24][4];     // rare events per kind: min start, max start, min end, max end
__device__ unsigned long long g_pw[4096][6];   // per warp: entry, task 1 start, end, task 2 start, end, exit
__device__ int g_pk[4096];                     // per warp: kind of task 1 | kind of task 2 << 8 | tasks << 16
__device__ unsigned g_ph_calls;
__device__ __forceinline__ unsigned long long ph_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void ph_mark(int kind, unsigned long long s, unsigned long long e, int lane) {
  if (lane != 0) return;
  atomicMin(&g_ph[kind][0], s);
  atomicMax(&g_ph[kind][1], s);
  atomicMin(&g_ph[kind][2], e);
  atomicMax(&g_ph[kind][3], e);
}
__device__ __forceinline__ int ph_kind(const OneArgs& a, int task) {
  if (task < a.t_sgate) return 0;
  if (task < a.t_router) return 1;
  if (task < a.t_sh_gu) return 2;
  if (task < a.t_gu) return 3;
  if (task < a.t_sh_dn) return 6;
  if (task < a.t_dn) return 4;
  return 7;
}
// Folds the warps' slots into g_ph (kinds 0..7 from their tasks, 14 exit, 15 entry): lane 0, serially.
__device__ void ph_fold(int n_warps) {
  for (int w = 0; w < n_warps && w < 4096; ++w) {
    const int pk = g_pk[w];
    ph_mark(15, g_pw[w][0], g_pw[w][0], 0);
    ph_mark(14, g_pw[w][5], g_pw[w][5], 0);
    for (int i = 0; i < ((pk >> 16) < 2 ? (pk >> 16) : 2); ++i) ph_mark((pk >> (8 * i)) & 0xFF, g_pw[w][1 + 2 * i], g_pw[w][2 + 2 * i], 0);
  }
}
'''

NAMES = "{" + ", ".join(f'"{k}"' for k in KINDS) + "}"

REPORT = r'''
    if (lane == 0) {
      const unsigned call = g_ph_calls++;
      if (call % 1000 == 20) {
        ph_fold(static_cast<int>(gridDim.x) * kWarps);
        const char* names[24] = NAMES;
        const unsigned long long t0 = g_ph[15][0];
        printf("moe_one phases (call %u, us from the first warp entry): kind, first start, last start, first end, last end\n", call);
        for (int k = 0; k < 24; ++k) {
          if (g_ph[k][1] == 0) continue;
          printf("  %-18s %8.2f %8.2f %8.2f %8.2f\n", names[k], (g_ph[k][0] - t0) * 1e-3, (g_ph[k][1] - t0) * 1e-3,
                 (g_ph[k][2] - t0) * 1e-3, (g_ph[k][3] - t0) * 1e-3);
        }
      }
      for (int k = 0; k < 24; ++k) {
        g_ph[k][0] = g_ph[k][2] = ~0ull;
        g_ph[k][1] = g_ph[k][3] = 0ull;
      }
    }
'''.replace("NAMES", NAMES)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", help="a copy of the source tree (edited in place)")
    ap.add_argument("--no-cooperative", action="store_true")
    args = ap.parse_args()
    path = args.tree + "/gpu/moe_imma_one.cu"
    with open(path) as f:
        s = f.read()
    edits = [
        ("// ---- synchronisation ----", HEAD + "\n// ---- synchronisation ----", "synchronisation section"),
        ("  for (int task = gw; task < a.t_end; task += n_warps) tasks.run(task);",
         "  unsigned long long pw[6] = {ph_now(), 0, 0, 0, 0, 0};\n  int pk = 0, nt = 0;\n"
         "  for (int task = gw; task < a.t_end; task += n_warps) {\n    const unsigned long long s0 = ph_now();\n"
         "    tasks.run(task);\n    if (nt < 2) {\n      pw[1 + 2 * nt] = s0;\n      pw[2 + 2 * nt] = ph_now();\n"
         "      pk |= ph_kind(a, task) << (8 * nt);\n    }\n    ++nt;\n  }\n  pw[5] = ph_now();\n"
         "  if (lane == 0 && gw < 4096) {\n    for (int i = 0; i < 6; ++i) g_pw[gw][i] = pw[i];\n"
         "    g_pk[gw] = pk | nt << 16;\n  }", "the task loop"),
        ("    for (int b = lane; b < a.n_blocks; b += 32) a.flags[b] = 0ull;\n",
         "    for (int b = lane; b < a.n_blocks; b += 32) a.flags[b] = 0ull;\n" + REPORT, "the counter reset"),
        ("lane)) route_once<kPer>(a, br.lg, lane);",
         "lane)) {\n      const unsigned long long rs0 = ph_now();\n      route_once<kPer>(a, br.lg, lane);\n"
         "      ph_mark(8, rs0, ph_now(), lane);\n    }", "the routing"),
        ("    wait_bit(ready_bit(slot), a.flags + blockIdx.x, br.seen);\n",
         "    wait_bit(ready_bit(slot), a.flags + blockIdx.x, br.seen);\n"
         "    ph_mark(12, ph_now(), ph_now(), lane);\n", "the down wait"),
        ("      finish_gate_up_rows(slot, rg);\n", "      const unsigned long long f0 = ph_now();\n"
         "      finish_gate_up_rows(slot, rg);\n      ph_mark(9, f0, ph_now(), lane);\n", "the row finish"),
        ("      imma_prep::prepare_group(imma_prep::L2Rows{a.sc.act}",
         "      const unsigned long long p0 = ph_now();\n      imma_prep::prepare_group(imma_prep::L2Rows{a.sc.act}",
         "the act preparation"),
        ("        publish(ready_bit(slot), a.flags, a.n_blocks, lane);\n      }\n",
         "        publish(ready_bit(slot), a.flags, a.n_blocks, lane);\n      }\n      ph_mark(10, p0, ph_now(), lane);\n",
         "the ready publication"),
        ("static_cast<unsigned>(a.n_slots * a.n_ich), lane)) combine(rg);",
         "static_cast<unsigned>(a.n_slots * a.n_ich), lane)) {\n      const unsigned long long c0 = ph_now();\n"
         "      combine(rg);\n      ph_mark(11, c0, ph_now(), lane);\n    }", "the combine call"),
    ]
    # Inside the routed gate+up and down tasks, sampled (one row group in 8: the atomics stay few).
    def ev(kind, cond):
        return f"    if ({cond}) {{ const unsigned long long e_ = ph_now(); ph_mark({kind}, e_, e_, lane); }}\n"
    gu = "slot < a.k && (rg & 7) == 0"
    edits += [
        ("  __syncwarp();\n  float p = 0.0f, sel_sum = 0.0f;\n",
         "  __syncwarp();\n  { const unsigned long long e_ = ph_now(); ph_mark(13, e_, e_, lane); }\n"
         "  float p = 0.0f, sel_sum = 0.0f;\n", "the routing's logits"),
        ("  if (lane == 0) {\n    *a.r.n_active = a.k;\n",
         "  { const unsigned long long e_ = ph_now(); ph_mark(23, e_, e_, lane); }\n"
         "  if (lane == 0) {\n    *a.r.n_active = a.k;\n", "the routing's selection"),
        ("      base = (m == 0 ? a.gate : a.up) + static_cast<uint64_t>(expert(slot)) * a.gu_bytes;\n",
         "      base = (m == 0 ? a.gate : a.up) + static_cast<uint64_t>(expert(slot)) * a.gu_bytes;\n" + ev(16, "(rg & 7) == 0"),
         "the gate+up routing"),
        ("    wait_bit(kBitX, a.flags + blockIdx.x, br.seen);\n    const int g = lane / 4, t = lane % 4;\n",
         ev(17, gu) + "    wait_bit(kBitX, a.flags + blockIdx.x, br.seen);\n" + ev(18, gu) +
         "    const int g = lane / 4, t = lane % 4;\n", "the gate+up wait"),
        ("    if (arrive(a.ctr + a.off_rg + slot * a.rgI + rg, static_cast<unsigned>(2 * a.n_gch), lane)) {\n",
         ev(19, gu) + "    const bool last_ = arrive(a.ctr + a.off_rg + slot * a.rgI + rg, static_cast<unsigned>(2 * a.n_gch), lane);\n"
         + ev(20, gu) + "    if (last_) {\n", "the gate+up arrival"),
        ("    if (arrive(a.ctr + a.off_comb + rg, static_cast<unsigned>(a.n_slots * a.n_ich), lane)) {\n",
         ev(21, "slot < a.k && (rg & 7) == 0") +
         "    const bool last_ = arrive(a.ctr + a.off_comb + rg, static_cast<unsigned>(a.n_slots * a.n_ich), lane);\n"
         + ev(22, "slot < a.k && (rg & 7) == 0") + "    if (last_) {\n", "the down arrival"),
    ]
    if args.no_cooperative:
        edits.append(("  cfg.numAttrs = 1;\n", "  cfg.numAttrs = 0;\n", "the cooperative attribute"))
    s = apply_edits(s, edits)
    with open(path, "w") as f:
        f.write(s)


if __name__ == "__main__":
    main()
