#!/bin/bash
# The side read on its own stream (new bench_engine) against in stream order (main's), alternating; its tests.
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$SECONDS
mkdir -p /tmp/ss && tar -C /tmp -xJf dev/ss.tar.xz; S=/tmp/ss
export LD_LIBRARY_PATH=/tmp/ss
[ -f /tmp/q4_0.gguf ] || $S/kestrel-mkmodel --preset qwen35moe-35b-a3b --types q4_0 -o /tmp/q4_0.gguf -q; echo "model ($((SECONDS-T0)) s)"
timeout 120 $S/test_cuda_hybrid --gtest_filter='*SideRead*:*BitIdentical*:*Greedy*' --gtest_brief=1 > $OUT/t.txt 2>&1; echo "tests rc $? ($((SECONDS-T0)) s) $(grep -E '^\[  (PASSED|FAILED)' $OUT/t.txt | tr '\n' ' ')"
grep -E "Failure|FAILED" $OUT/t.txt | head -5
run() {  # name, binary, args
  local n=$1 b=$2; shift 2
  timeout 60 $S/$b --model /tmp/q4_0.gguf --ttft 0 --pp 0 "$@" > $OUT/$n.txt 2>&1
  echo "$n ($((SECONDS-T0)) s): $(grep -oE 'host read [0-9.]+ GB/s' $OUT/$n.txt | head -1) | $(grep -E '^\| [0-9]+ \|' $OUT/$n.txt | cut -d'|' -f2,3,4 | tr '\n' ' ') | $(grep -oE 'host experts: [0-9.]+ ms a step on the CPU.*waited [0-9.]+ ms' $OUT/$n.txt | head -1 | sed 's/a step on the CPU (40.0 batches), the GPU//')"
}
for i in 1 2; do
  run own_$i bench_engine --sessions 1 --steps 16 --n-cpu-moe 40
  run main_$i bench_engine_main --sessions 1 --steps 16 --n-cpu-moe 40
done
run own_32 bench_engine --sessions 32 --steps 8 --n-cpu-moe 40
run main_32 bench_engine_main --sessions 32 --steps 8 --n-cpu-moe 40
echo "== done ($((SECONDS-T0)) s)"
