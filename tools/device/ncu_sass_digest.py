#!/usr/bin/env python3
"""Digests ncu's source page (SASS, per instruction) into where a kernel's instructions and stalls go
(6eb9850^:docs/benchmarks.md, "GEMV v4.6-v4.7": how the GEMV's overhead per MMA was found).

Make the CSV on the lent GPU machine, e.g. the 32-token grouped GEMVs of moe_imma and lm_head:
  ncu --set full --import-source no --kernel-name-base demangled -k 'regex:gemv_imma_kernel.*\\(int\\)2, ' \\
      --launch-count 2 -o /tmp/moe32 build/gpu/bin/test_moe_imma --gtest_filter=MoeImma.Qwen35Moe35BShapeQ4_0
  ncu -i /tmp/moe32.ncu-rep --page source --csv --print-source sass > $OUT/moe32_source.csv
then here:
  python3 tools/device/ncu_sass_digest.py moe32_source.csv            # every kernel in the file
  python3 tools/device/ncu_sass_digest.py moe32_source.csv --top 30 --per IMMA

For each kernel: its executed warp instructions per executed instruction of the opcode given by --per (default IMMA,
one tensor-core MMA), by opcode; the stall reasons over all samples; the --top instructions by stall samples with
their two main reasons. A kernel the report holds twice (ncu prints some results twice) is shown once.
"""
import argparse
import collections
import csv
import sys


def kernels(path):
    """Yields (name, header index, rows) for each kernel section of an ncu source-page CSV."""
    name, index, rows = None, None, []
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                if name is not None:
                    yield name, index, rows
                name, index, rows = r[1], None, []
            elif r[0] == "Address":
                index = {n: i for i, n in enumerate(r)}
            elif index is not None:
                rows.append(r)
    if name is not None:
        yield name, index, rows


def count(r, index, column):
    v = r[index[column]] if column in index else ""
    return int(v) if v.strip().isdigit() else 0


def opcode(sass):
    words = sass.split()
    op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "?")
    return op.split(".")[0]


def digest(name, index, rows, per, top, out):
    executed = "Instructions Executed"
    samples = "Warp Stall Sampling (All Samples)"
    stalls = [n for n in index if n.startswith("stall_") and "Not Issued" not in n]
    by_op = collections.Counter()
    for r in rows:
        by_op[opcode(r[1])] += count(r, index, executed)
    unit = by_op.get(per, 0)
    total = sum(by_op.values())
    n_samples = sum(count(r, index, samples) for r in rows)
    out.write(f"== {name}\n   {len(rows)} instructions in the kernel, {total} executed")
    if unit:
        out.write(f", {total / unit:.1f} per {per}\n   per {per}: ")
        out.write(", ".join(f"{op} {v / unit:.2f}" for op, v in by_op.most_common(16)))
    out.write("\n")
    if n_samples:
        reasons = collections.Counter({n[6:]: sum(count(r, index, n) for r in rows) for n in stalls})
        out.write("   stalls: " + ", ".join(f"{k} {100 * v / n_samples:.1f}%" for k, v in reasons.most_common(8)) + "\n")
        ranked = sorted(range(len(rows)), key=lambda i: -count(rows[i], index, samples))
        for i in ranked[:top]:
            r = rows[i]
            why = sorted(((count(r, index, n), n[6:]) for n in stalls), reverse=True)[:2]
            out.write(f"   {i:5d} {100 * count(r, index, samples) / n_samples:5.1f}%  ex {count(r, index, executed):>9}  "
                      f"{r[1].strip()[:64]:64s} {', '.join(f'{k} {v}' for v, k in why if v)}\n")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=12, help="instructions to list by stall samples (default 12)")
    ap.add_argument("--per", default="IMMA", help="the opcode to count instructions per (default IMMA)")
    a = ap.parse_args(argv)
    seen = set()
    for name, index, rows in kernels(a.csv):
        key = (name, len(rows), tuple(tuple(r[:3]) for r in rows[:8]))
        if key in seen:
            continue
        seen.add(key)
        digest(name, index, rows, a.per, a.top, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
