#!/bin/bash
# Session 15, call 1: the host's topology and CPU GEMV diagnostics, the CPU engine's figures (issue 29), then the
# side-stream A/B (dev/ss_check.sh).
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$SECONDS
mkdir -p /tmp/ss /tmp/cg && tar -C /tmp -xJf dev/ss.tar.xz && tar -C /tmp -xJf dev/cg.tar.xz
export LD_LIBRARY_PATH=/tmp/cg:/tmp/ss
S=/tmp/ss; G=/tmp/cg/bench_cpu_gemv
nvidia-smi --query-gpu=name --format=csv,noheader
lscpu | grep -E "^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket|Model name|L2|L3|MHz|NUMA" | tee $OUT/lscpu.txt
echo "siblings: $(cat /sys/devices/system/cpu/cpu{0,1,2,8}/topology/thread_siblings_list | tr '\n' ' ')"
grep -o -E 'avx512_vnni|amx_int8|avx512_bf16|amx_tile' /proc/cpuinfo | sort | uniq -c
timeout 90 $G --benchmark_filter='BM_GemvInCache/type:(0|1)/n_in:2048/batch:(1|8)$' --benchmark_min_time=0.2 2>&1 | grep -E "^BM_" | tee $OUT/incache.txt
timeout 90 $G --benchmark_filter='BM_GemvInCacheAll/type:(0|1)/n_in:2048/batch:1' --benchmark_min_time=0.2 2>&1 | grep -E "^BM_" | tee $OUT/incacheall.txt
N=/tmp/cg/bench_cpu_gemv_new
for t in test_cpu_gemv test_cpu_act_q8; do timeout 60 /tmp/cg/$t --gtest_brief=1 2>&1 | tail -2; done
timeout 60 $N --benchmark_filter='BM_GemvInCache/type:(0|1)/n_in:2048/batch:(1|8)$' --benchmark_min_time=0.2 2>&1 | grep -E "^BM_" | tee $OUT/incache_new.txt
timeout 60 $N --benchmark_filter='BM_GemvInCacheAll/type:(0|1)/n_in:2048/batch:1' --benchmark_min_time=0.2 2>&1 | grep -E "^BM_" | tee $OUT/incacheall_new.txt
echo "== gemv sweep ($((SECONDS-T0)) s)"
for b in $G $N; do
timeout 100 $b --benchmark_filter='BM_Gemv/type:(0|1)/shape:3/batch:1/threads:16/act:1' --benchmark_min_time=0.3 2>&1 | grep -E "^BM_" | sed "s|^|$(basename $b) |" | tee -a $OUT/sweep.txt
done
echo "== cpu engine ($((SECONDS-T0)) s)"
$S/kestrel-mkmodel --preset qwen35moe-35b-a3b --types q4_0 -o /tmp/q4_0.gguf -q; echo "model ($((SECONDS-T0)) s)"
sleep 5
for e in bench_cpu_engine_new bench_cpu_engine; do
timeout 100 /tmp/cg/$e --model /tmp/q4_0.gguf --sessions 1,8 --steps 8 --pp 512 --profile > $OUT/$e.txt 2>&1
echo "-- $e"; grep -E "^\||tokens/s|read|roofline" $OUT/$e.txt | head -24
done
echo "== side stream ($((SECONDS-T0)) s)"
bash dev/ss_check.sh  # reuses /tmp/q4_0.gguf
