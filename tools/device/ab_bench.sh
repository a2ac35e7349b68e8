#!/usr/bin/env bash
# Runs on the lent GPU machine: the working tree against a base (and optional variants), built side by side and
# timed in turns in one run — the machines are shared and noisy, so only comparisons within one run count. The base
# travels as a patch made here:
#
#   git diff <base-commit> > dev/ab.patch            # the working tree's change against the base
#   # on the device (carry dev/ab.patch, any variant scripts and .debs):
#   OUT=$OUT bash tools/device/ab_bench.sh dev/ab.patch "bench_moe" "build/gpu/bin/bench_moe" 2
#
# Trees: "a" is the working tree (build/gpu), "b" the same tree with the patch reversed (/tmp/ab/b). Variants: set
# AB_VARIANTS="name=script ..." and each name gets a copy of the working tree (/tmp/ab/name) that `script <tree>`
# changes first (python3 for a .py script, bash otherwise), e.g. AB_VARIANTS="ef=dev/evict_first.py". Every tree
# builds the targets (in parallel, logs in $OUT/<tree>/), then the command runs from each tree's root in turns,
# `repeats` times (default 1): a, b, variants, a, b, ... Output: $OUT/<tree>/run<i>.txt, each also printed after a
# "== <tree> <i>" line unless AB_FILTER is set, in which case only the lines matching that extended regex are printed.
# AB_ONCE="command": run once in each tree before the timed rounds (e.g. the change's tests:
# AB_ONCE='build/gpu/bin/test_moe_imma --gtest_brief=1'); its output goes to $OUT/<tree>/once.txt, and a line
# "== <tree> once: ok" or "== <tree> once: FAILED (rc N)" is printed with the last lines of a failure.
# Exit status: non-zero when a tree fails to patch or build (the others still run).
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 PATCH \"target ...\" COMMAND [repeats]" >&2
  exit 2
fi
patch_file=$(realpath "$1")
targets=$2
command=$3
repeats=${4:-1}
export OUT=${OUT:-/tmp/out}
root=$(pwd)
work=/tmp/ab
status=0

copy_tree() {  # copy_tree DIR: the working tree without builds or dev/ (stale files from an earlier run removed)
  rm -rf "$1" && mkdir -p "$1" && tar --exclude=./build --exclude=./dev -cf - . | tar -x -C "$1"
}

trees=(a b)
declare -A dir=([a]=$root [b]=$work/b)
if ! copy_tree "$work/b" || ! (cd "$work/b" && patch -s -R -p1 <"$patch_file"); then
  echo "ab_bench: the base does not apply (patch -R of $1)" >&2
  exit 1
fi
for v in ${AB_VARIANTS:-}; do
  name=${v%%=*}
  script=$(realpath "${v#*=}")
  copy_tree "$work/$name"
  case $script in
    *.py) runner=python3 ;;
    *) runner=bash ;;
  esac
  if (cd "$work/$name" && "$runner" "$script" "$work/$name"); then
    trees+=("$name")
    dir[$name]=$work/$name
  else
    echo "ab_bench: variant $name: $script failed; left out" >&2
    status=1
  fi
done

# The carried packages are unpacked once here, not by every tree's configure at the same time.
bash "$root/tools/device/gpu_deps.sh" || exit 1
t0=$(date +%s)
declare -A pid
for t in "${trees[@]}"; do
  mkdir -p "$OUT/$t"
  (cd "${dir[$t]}" && OUT=$OUT/$t bash "$root/tools/device/gpu_targets.sh" "$targets" >"$OUT/$t/log.txt" 2>&1) &
  pid[$t]=$!
done
built=()
for t in "${trees[@]}"; do
  if wait "${pid[$t]}"; then
    built+=("$t")
  else
    echo "ab_bench: $t did not build:" >&2
    tail -20 "$OUT/$t/log.txt" >&2
    status=1
  fi
done
echo "ab_bench: built ${built[*]} in $(($(date +%s) - t0)) s"

if [ -n "${AB_ONCE:-}" ]; then
  for t in "${built[@]}"; do
    if (cd "${dir[$t]}" && bash -c "$AB_ONCE") >"$OUT/$t/once.txt" 2>&1; then
      echo "== $t once: ok"
    else
      echo "== $t once: FAILED (rc $?)"
      tail -20 "$OUT/$t/once.txt"
      status=1
    fi
  done
fi

for ((i = 1; i <= repeats; ++i)); do
  for t in "${built[@]}"; do
    echo "== $t $i"
    (cd "${dir[$t]}" && bash -c "$command") >"$OUT/$t/run$i.txt" 2>&1 || echo "ab_bench: $t run $i exited non-zero"
    if [ -n "${AB_FILTER:-}" ]; then
      grep -E "$AB_FILTER" "$OUT/$t/run$i.txt"
    else
      cat "$OUT/$t/run$i.txt"
    fi
  done
done
exit "$status"
