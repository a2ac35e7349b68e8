#!/usr/bin/env bash
# Runs on the lent GPU machine: a branch's prebuilt binaries (dev/mn.tar.xz: test and bench binaries and kestreld,
# stripped, built here; dev/notes/decode-step.md "Verifying the branch") beside main's carry (dev/carry.tar.xz), most
# important first: the branch's bench_engine, its test_cuda_engine, main's bench_engine, the branch's kernel tests,
# a second branch's hybrid tests and hybrid bench beside main's (dev/hf.tar.xz, when carried), the first branch's
# kestreld serving the Q4_0 35B-A3B file over gRPC and shm; then, if time is left, main's CPU engine with its
# section split, its expert backend's thread sweep and Nsight Compute's per-kernel split of the branch's step at 32
# sessions; LIMIT seconds in all (default 400).
#   (device) carry ["dev/carry.tar.xz", "dev/mn.tar.xz"]: LIMIT=400 bash tools/device/branch_check.sh
set -uo pipefail
export KESTREL_SOURCE_ROOT=/work/main
final=${OUT:-/tmp/out}
export OUT=/tmp/o
mkdir -p "$OUT" "$final"
t0=$SECONDS
LIMIT=${LIMIT:-400}
left() { echo $((LIMIT - (SECONDS - t0))); }
bash tools/device/engine_check.sh model 2>&1 | tail -2
tar -xJf dev/mn.tar.xz -C /tmp
export LD_LIBRARY_PATH=/tmp/kestrel-carry/lib:${LD_LIBRARY_PATH:-}
M=/tmp/mn
K=/tmp/kestrel-carry/bin
test_of() {  # test_of NAME SECONDS (the binary from $M)
  timeout "$2" "$M/$1" --gtest_brief=1 >"$OUT/mn_$1.txt" 2>&1
  local rc=$?
  echo "$1 rc $rc at $((SECONDS - t0)) s: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/mn_$1.txt" | tr '\n' ' ')"
  [ "$rc" -ne 0 ] && grep -E "Failure|differ|Expected|actual|FAILED" "$OUT/mn_$1.txt" | head -12
}
bench() {  # bench TREE: mn (the branch) or main (the carry)
  local b=$K/bench_engine
  [ "$1" = mn ] && b=$M/bench_engine
  echo "== bench $1 at $((SECONDS - t0)) s"
  timeout 90 "$b" --model /tmp/q4_0.gguf --sessions 1,8,32 --pp 0 --ttft 0 >"$OUT/bench_$1.txt" 2>&1
  grep -E "^\| [0-9]|kernel|layout|sessions, ms per step" "$OUT/bench_$1.txt" | head -14
}
bench mn
[ "$(left)" -gt 40 ] && test_of test_cuda_engine $(($(left) > 130 ? 90 : $(left) - 20))
[ "$(left)" -gt 55 ] && bench main
for t in test_rms_norm test_gdn_decode test_attention_decode test_moe_imma; do
  [ "$(left)" -gt 25 ] && test_of "$t" 20
done
# A second branch's binaries (dev/hf.tar.xz: test_expert_handoff, test_cuda_hybrid, test_moe_hybrid, bench_engine),
# when carried: its hybrid tests, then its bench_engine beside main's with every routed expert on the CPU.
if [ -f dev/hf.tar.xz ] && [ "$(left)" -gt 60 ]; then
  tar -xJf dev/hf.tar.xz -C /tmp
  for t in test_expert_handoff test_moe_hybrid test_cuda_hybrid; do
    [ "$(left)" -gt 40 ] && M=/tmp/hf test_of "$t" 60
  done
  for tree in hf main; do
    b=$K/bench_engine
    [ "$tree" = hf ] && b=/tmp/hf/bench_engine
    [ "$(left)" -gt 100 ] || break
    echo "== hybrid bench $tree (--n-cpu-moe 40) at $((SECONDS - t0)) s"
    timeout 90 "$b" --model /tmp/q4_0.gguf --sessions 1,32 --steps 16 --pp 0 --ttft 0 --n-cpu-moe 40 \
      >"$OUT/hybrid_$tree.txt" 2>&1
    grep -E "^\| [0-9]|plan|predict|host experts|sessions, ms per step" "$OUT/hybrid_$tree.txt" | head -12
  done
fi
if [ "$(left)" -gt 35 ]; then
  d=/tmp/kd_mn && rm -rf "$d" && mkdir -p "$d"
  "$M/kestreld" --engine cuda --model /tmp/q4_0.gguf --socket "$d/k.sock" --shm-socket "$d/k-shm.sock" \
    --cache-dir "$d/cache" --log-format text >"$OUT/kestreld_mn.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 60); do grep -q "serving" "$OUT/kestreld_mn.log" && break; sleep 0.5; done
  echo "== kestreld mn at $((SECONDS - t0)) s"
  timeout 10 "$K/kestrel" generate --connect "unix://$d/k.sock" --prompt "Hello" -n 24 --temp 0 2>&1 | tail -2
  timeout 10 "$K/kestrel" generate --connect "shm://$d/k-shm.sock" --prompt "Hello" -n 24 --temp 0 2>&1 | tail -2
  kill -TERM "$pid"
  wait "$pid"
  echo "kestreld mn exited $?"
fi
if [ "$(left)" -gt 70 ]; then
  echo "== cpu engine (main) at $((SECONDS - t0)) s"
  timeout 60 "$K/bench_cpu_engine" --model /tmp/q4_0.gguf --sessions 1 --steps 8 --prompt 8 --pp 0 --profile \
    >"$OUT/bench_cpu.txt" 2>&1
  cat "$OUT/bench_cpu.txt" | head -40
fi
if [ "$(left)" -gt 60 ]; then
  echo "== cpu expert backend (main) at $((SECONDS - t0)) s"
  timeout 40 "$K/bench_cpu_expert_backend" --benchmark_filter='type:0/tokens:(1|32)/' >"$OUT/bench_cpu_experts.txt" 2>&1
  grep -E "BM_|read" "$OUT/bench_cpu_experts.txt" | cut -c1-200 | head -20
fi
if [ "$(left)" -gt 60 ]; then
  nc=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  echo "== ncu mn at $((SECONDS - t0)) s"
  timeout $(($(left) - 10)) "$nc" --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
    --log-file "$OUT/ncu_mn.csv" --launch-count 2000 \
    $M/bench_engine --model /tmp/q4_0.gguf --sessions ${NCU_SESSIONS:-32} --steps 2 --prompt 1 --pp 0 --ttft 0 >/dev/null 2>&1
  python3 tools/device/ncu_step.py "$OUT/ncu_mn.csv" 2>&1 | head -30
fi
echo "all done at $((SECONDS - t0)) s"
for f in bench_main.txt bench_mn.txt mn_test_cuda_engine.txt mn_test_moe_imma.txt kestreld_mn.log ncu_mn.csv bench_cpu.txt bench_cpu_experts.txt hybrid_hf.txt hybrid_main.txt \
  mn_test_expert_handoff.txt mn_test_cuda_hybrid.txt; do
  [ -f "$OUT/$f" ] && cp "$OUT/$f" "$final/"
done
exit 0
