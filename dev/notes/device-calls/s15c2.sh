#!/bin/bash
# Session 15, lean call: the host's topology, the CPU GEMV A/B (main before today's kernels against after), the CPU
# engine with the new kernels (issue 29).
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$SECONDS
mkdir -p /tmp/cg && tar -C /tmp -xJf dev/cg.tar.xz
export LD_LIBRARY_PATH=/tmp/cg
G=/tmp/cg/bench_cpu_gemv; N=/tmp/cg/bench_cpu_gemv_new
nvidia-smi --query-gpu=name --format=csv,noheader
lscpu | grep -E "^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Model name|L2|L3" | tee $OUT/lscpu.txt
grep -o -E 'avx512_vnni|amx_int8|avx512_vbmi' /proc/cpuinfo | sort | uniq -c
for t in test_cpu_gemv test_cpu_act_q8; do timeout 60 /tmp/cg/$t --gtest_brief=1 2>&1 | tail -1; done
echo "== gemv 16 threads ($((SECONDS-T0)) s)"
for b in $G $N $G $N; do
  timeout 60 $b --benchmark_filter='BM_Gemv/type:(0|1)/shape:3/batch:1/threads:16/act:1' --benchmark_min_time=0.3 2>&1 | grep -E "^BM_" | sed "s|^|$(basename $b) |" | tee -a $OUT/sweep.txt
done
for b in $G $N; do
  timeout 60 $b --benchmark_filter='BM_GemvInCache/type:(0|1)/n_in:2048/batch:1$|BM_GemvInCacheAll/type:(0|1)/n_in:2048/batch:1' --benchmark_min_time=0.2 2>&1 | grep -E "^BM_" | sed "s|^|$(basename $b) |" | tee -a $OUT/incache.txt
done
echo "== cpu engine ($((SECONDS-T0)) s)"
/tmp/cg/kestrel-mkmodel --preset qwen35moe-35b-a3b --types q4_0 -o /tmp/q4_0.gguf -q; echo "model ($((SECONDS-T0)) s)"
sleep 5
timeout 120 /tmp/cg/bench_cpu_engine_new --model /tmp/q4_0.gguf --sessions 1,8 --steps 8 --pp 512 --profile > $OUT/engine_new.txt 2>&1
grep -E "^\||tokens/s|read|roofline" $OUT/engine_new.txt | head -24
echo "== done ($((SECONDS-T0)) s)"
