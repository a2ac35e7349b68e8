#!/usr/bin/env python3
"""Instruments a COPY of the source tree to measure what each launch of moe_imma_forward costs inside the layer's chain
(6eb9850^:docs/benchmarks.md, "MoE layer: what each launch costs in the chain"); never run it on your working tree.

It edits the copy's gpu/kernels/moe_imma.cu so that the launch named by the environment variable KESTREL_MOE_DUP (0 router
logits + x preparation, 1 route + tables, 2 gate+up GEMV, 3 SwiGLU preparation, 4 down GEMV, 5 combine) is issued
twice in a row; every one of them is idempotent (it rewrites the same outputs from the same inputs), so the layer's
results do not change and bench_moe's time grows by that launch's marginal cost in the chain (its second run finds
its inputs in L2: the figure is the launch, latency and compute, more than its DRAM reads).

Usage, on the lent GPU machine:
  mkdir /tmp/dup && tar --exclude=./build -cf - . | tar -x -C /tmp/dup
  python3 tools/device/moe_launch_costs.py /tmp/dup
  cd /tmp/dup && OUT=$OUT bash tools/device/gpu_targets.sh bench_moe \
      'for d in -1 0 1 2 3 4 5; do echo "dup $d"; KESTREL_MOE_DUP=$d build/gpu/bin/bench_moe --main q4_0/ | grep "^q4"; done'
"""
import argparse

from source_patch import replace_once, span_once

# (start, end, what) of each launch statement of moe_imma_forward, in the order of KESTREL_MOE_DUP's numbers.
LAUNCHES = [
    ("  if (f32_router) {  // logits", "    KESTREL_TRY(gemv(w.router, x, n_tok, l.logits, stream));\n  }",
     "router logits + x preparation"),
    ("  KESTREL_TRY(moe_route_dev::with_route_per_lane(E,", "  }));", "route + tables"),
    ("  KESTREL_TRY(gemv_imma_segments(w.gate_up_type, H, I,", "tuning.grouped_gemv));", "gate+up GEMV"),
    ("  KESTREL_TRY(\n      gemv_imma_prepare_swiglu(", "l.aprep, stream, pdl, true));", "SwiGLU preparation"),
    ("  KESTREL_TRY(gemv_imma_segments(w.down_type, I, H,", "used_dn, true, tuning.grouped_gemv));", "down GEMV"),
    ("  if (w.has_shared_expert()) {\n    const auto* gate_inp",
     "ye, token_entry, entry_weight, k, c.n_entries, no_gate, x, H, out));\n  }", "combine"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", help="a copy of the source tree (edited in place)")
    path = ap.parse_args().tree + "/gpu/kernels/moe_imma.cu"
    with open(path) as f:
        s = f.read()
    s = replace_once(s, "#include <algorithm>\n", "#include <algorithm>\n#include <cstdlib>\n", "#include <algorithm>")
    s = replace_once(s, "  int launches = 0;\n",
                     "  int launches = 0;\n  static const int dup = std::getenv(\"KESTREL_MOE_DUP\") != nullptr\n"
                     "      ? std::atoi(std::getenv(\"KESTREL_MOE_DUP\")) : -1;\n", "int launches = 0;")
    for i, (start, end, what) in enumerate(LAUNCHES):
        a, b = span_once(s, start, end, what)
        s = s[:a] + f"for (int rep_ = 0; rep_ < (dup == {i} ? 2 : 1); ++rep_) {{\n" + s[a:b] + "\n}\n" + s[b:]
    with open(path, "w") as f:
        f.write(s)


if __name__ == "__main__":
    main()
