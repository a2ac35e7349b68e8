#!/usr/bin/env python3
"""Edits a COPY of the source tree so that the grouped GEMVs (gemv_imma_kernel's table calls, the MoE layer's) skip
part of their work, to bound what that part costs inside bench_moe (6eb9850^:docs/benchmarks.md, "MoE layer at 2-32
tokens: what bounds the grouped GEMVs, ..."); never run it on your working tree. The results are WRONG on purpose: time only.

Modes:
  xsame  every segment reads vector 0's prepared activations (the same few KB: L1 hits after the first);
  xfree  no activation loads: constants in registers stand in for the fragments, digit sums and scales;
  nomul  no multiply and no activation loads: the weights' registers are xor-ed into the sums (Q4_0 only; the other
         types multiply as before), so only the weight stream, the tables and the writes remain.

Usage, as ab_bench.sh variants (a variant script gets the tree as its one argument):
  for m in xsame xfree nomul; do echo "python3 tools/device/moe_gemv_bounds.py \\"\\$1\\" $m" > dev/$m.sh; done
  AB_VARIANTS="xsame=dev/xsame.sh xfree=dev/xfree.sh nomul=dev/nomul.sh" AB_FILTER='^q4_0' OUT=$OUT \\
      bash tools/device/ab_bench.sh dev/ab.patch bench_moe "build/gpu/bin/bench_moe --main q4_0/" 2
"""
import argparse

from source_patch import replace_once

MULTIPLY = """          multiply_add<T>(wb, x, acc[p]);
        }
      }
    }
    if (c.gi + 1 < gps) return;"""


def with_table_branch(body):
    """The step's multiply, replaced by `body` in table calls."""
    return (f"          if constexpr (kTable) {{\n            (void)x;\n{body}"
            "          } else {\n            multiply_add<T>(wb, x, acc[p]);\n          }\n"
            "        }\n      }\n    }\n    if (c.gi + 1 < gps) return;")


FAKE_X = """struct FakeX {  // moe_gemv_bounds.py: activations from registers
  uint32_t v;
  __device__ __forceinline__ uint4 b(int i) const { return make_uint4(v + i, v ^ i, v * 3u + i, v + 7u * i); }
  __device__ __forceinline__ int2 d(int i) const { return make_int2(static_cast<int>(v & 255u) + i, i); }
  __device__ __forceinline__ float s() const { return 1.0f + static_cast<float>(v & 7u); }
};

"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", help="a copy of the source tree (edited in place)")
    ap.add_argument("mode", choices=["xsame", "xfree", "nomul"])
    args = ap.parse_args()
    path = args.tree + "/gpu/kernels/gemv_imma.cu"
    with open(path) as f:
        s = f.read()
    if args.mode == "xsame":
        s = replace_once(s, "        const int vf = g < 4 ? va : vb;\n        const int vd = t < 2 ? va : vb;\n",
                         "        const int vf = (g < 4 ? va : vb) & 0;\n        const int vd = (t < 2 ? va : vb) & 0;\n",
                         "the pair's vector choice in x_round")
    elif args.mode == "xfree":
        s = replace_once(s, MULTIPLY, with_table_branch(
            "            multiply_add<T>(wb, FakeX{static_cast<uint32_t>(lane) * 0x01030507u + "
            "static_cast<uint32_t>(c.gi)}, acc[p]);\n"), "the step's multiply")
        s = replace_once(s, "// A warp's place in its stream", FAKE_X + "// A warp's place in its stream", "Cursor")
    else:
        s = replace_once(s, MULTIPLY, with_table_branch(
            "            if constexpr (T == GgmlType::kQ4_0) {\n"
            "              uint32_t h = 0;\n"
            "#pragma unroll\n"
            "              for (int i = 0; i < kUnitsPerSlice; ++i)\n"
            "                h ^= wb.w[i].x ^ wb.w[i].y ^ wb.w[i].z ^ wb.w[i].w ^ wb.m0[i].x ^ wb.m0[i].y;\n"
            "              acc[p][0] += __int_as_float(h & 0x3FFFFFu);\n"
            "            } else {\n"
            "              multiply_add<T>(wb, x, acc[p]);\n"
            "            }\n"), "the step's multiply")
    with open(path, "w") as f:
        f.write(s)


if __name__ == "__main__":
    main()
