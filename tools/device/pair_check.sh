#!/usr/bin/env bash
# Runs on the lent GPU machine: two branches' prebuilt binaries beside main's carry, printing summary lines only
# (dev/notes/decode-step.md "Verifying the branch" says how the tarballs are made):
#   dev/mn.tar.xz  the decode-step branch: bench_engine beside main's; its kernel tests and test_cuda_engine;
#   dev/hf.tar.xz  the hybrid hand-off branch (built in /work/wt-expert): test_expert_handoff, test_cuda_hybrid,
#                  bench_engine with every routed expert on the CPU, bench_cpu_engine with its section split.
# Each step runs only while LIMIT seconds (default 360) leave it time.
#   (device) carry ["dev/carry.tar.xz", "dev/mn.tar.xz", "dev/hf.tar.xz"]: LIMIT=360 bash tools/device/pair_check.sh
set -uo pipefail
export KESTREL_SOURCE_ROOT="/work/main /work/wt-expert"
final=${OUT:-/tmp/out}
export OUT=/tmp/o
mkdir -p "$OUT" "$final"
t0=$SECONDS
LIMIT=${LIMIT:-360}
left() { echo $((LIMIT - (SECONDS - t0))); }
bash tools/device/engine_check.sh model 2>&1 | tail -1
tar -xJf dev/mn.tar.xz -C /tmp
tar -xJf dev/hf.tar.xz -C /tmp
export LD_LIBRARY_PATH=/tmp/kestrel-carry/lib:${LD_LIBRARY_PATH:-}
K=/tmp/kestrel-carry/bin
test_of() {  # test_of DIR NAME SECONDS
  timeout "$3" "$1/$2" --gtest_brief=1 >"$OUT/t_$2.txt" 2>&1
  local rc=$?
  echo "$1/$2 rc $rc at $((SECONDS - t0)) s: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$OUT/t_$2.txt" | tr '\n' ' ')"
  [ "$rc" -ne 0 ] && grep -E "Failure|Expected|Which is|actual|error" "$OUT/t_$2.txt" | head -8
}
bench() {  # bench LABEL BINARY ARGS...
  local label=$1 b=$2
  shift 2
  echo "== $label at $((SECONDS - t0)) s"
  timeout 60 "$b" --model /tmp/q4_0.gguf --steps 16 --pp 0 --ttft 0 "$@" >"$OUT/b_$label.txt" 2>&1
  grep -E "^\| [0-9]|sessions, ms per step|host experts" "$OUT/b_$label.txt" | cut -c1-240
}
[ "$(left)" -gt 40 ] && bench mn /tmp/mn/bench_engine --sessions 1,32
[ "$(left)" -gt 40 ] && bench main $K/bench_engine --sessions 1,32
[ "$(left)" -gt 20 ] && test_of /tmp/hf test_expert_handoff 15
[ "$(left)" -gt 25 ] && test_of /tmp/mn test_cuda_engine 30
for t in test_moe_imma test_rms_norm test_gdn_decode test_attention_decode; do
  [ "$(left)" -gt 20 ] && test_of /tmp/mn "$t" 20
done
[ "$(left)" -gt 35 ] && test_of /tmp/hf test_cuda_hybrid 35
[ "$(left)" -gt 50 ] && bench hf_hybrid /tmp/hf/bench_engine --sessions 1 --n-cpu-moe 40
if [ "$(left)" -gt 30 ]; then
  echo "== cpu engine (hf) at $((SECONDS - t0)) s"
  timeout 40 /tmp/hf/bench_cpu_engine --model /tmp/q4_0.gguf --sessions 1 --steps 8 --prompt 8 --pp 0 --profile \
    >"$OUT/cpu.txt" 2>&1
  grep -E "^\| " "$OUT/cpu.txt" | head -20
fi
echo "all done at $((SECONDS - t0)) s"
for f in b_mn.txt b_main.txt b_hf_hybrid.txt cpu.txt t_test_cuda_hybrid.txt t_test_expert_handoff.txt \
  t_test_moe_imma.txt; do
  [ -f "$OUT/$f" ] && cp "$OUT/$f" "$final/"
done
exit 0
