#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel durations (ncu --csv --metrics gpu__time_duration.sum) per engine pass.

A pass starts at the kernel that publishes the KV pages (or, without attention layers, the embedding's get_rows).
Prints each pass's kernel count and summed duration, then the last complete pass's kernels grouped by name: under
ncu every kernel runs alone, so the sum is the step's time with no launch gaps and no overlap; the step's measured
time less this sum is what the launches between kernels cost.
"""
import csv
import re
import sys
from collections import OrderedDict

UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def short_name(name):
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("unnamed>::", "")
    name = name.split("(")[0]
    depth, out = 0, ""
    for ch in name:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out += ch
    return out.split("::")[-1]


def read_kernels(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    kernels = []
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        kernels.append((short_name(row["Kernel Name"]), value * UNIT_US.get(row["Metric Unit"], 1.0)))
    return kernels


def main():
    kernels = read_kernels(sys.argv[1])
    if not kernels:
        print("no kernel durations in", sys.argv[1])
        return 1
    starter = "kv_page_publish_kernel" if any(k[0] == "kv_page_publish_kernel" for k in kernels) else None
    if starter is None:
        starter = next(k[0] for k in kernels if "get_rows" in k[0])
    passes, cur = [], None
    for k in kernels:
        if k[0] == starter:
            cur = []
            passes.append(cur)
        if cur is not None:
            cur.append(k)
    complete = [p for p in passes if any("argmax" in k[0] for k in p)]
    print(f"{len(kernels)} kernels profiled, {len(passes)} passes, {len(complete)} with the lm_head")
    for i, p in enumerate(passes):
        print(f"  pass {i}: {len(p)} kernels, {sum(d for _, d in p):.1f} us")
    if not complete:
        return 1
    last = complete[-1]
    total = sum(d for _, d in last)
    print(f"\nlast complete pass: {len(last)} kernels, {total:.1f} us of kernel time\n")
    by = OrderedDict()
    for n, d in last:
        c, t = by.get(n, (0, 0.0))
        by[n] = (c + 1, t + d)
    print("| kernel | launches | us | us each | share |")
    print("|---|---|---|---|---|")
    for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {n} | {c} | {t:.1f} | {t / c:.2f} | {100 * t / total:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
