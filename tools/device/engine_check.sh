#!/usr/bin/env bash
# Runs on the lent GPU machine, from the repository root, with dev/carry.tar.xz (tools/device/pack_carry.sh) carried:
#   test    the CUDA engine against the reference engine (test_cuda_engine), test_attention_decode, test_gdn_decode
#   gputests  every gpu-labelled test (what ctest -L gpu runs), one line each
#   bench   writes the 35B-A3B preset with --types q4_0 (and with the Q4_K_M mix for bench-km) and runs bench_engine
#           (bench-nopdl: the same without programmatic launches; bench-long: 1 and 8 sessions after 4000-token prompts)
#   cputests  the CPU kernels, pool, blocks and engine tests (every ISA level this host has: avx512, avxvnni, avx2 and
#             scalar on the H200 box's Sapphire Rapids), then the engine's int8 checks once per lower level
#   cpubench  bench_cpu_gemv and bench_cpu_engine (all physical cores) on the Q4_0 and the Q4_K_M 35B-A3B files
#   daemon  kestreld --engine cuda on the Q4_0 35B-A3B file: status, generate over gRPC and shm; then the daemon's
#           integration tests with KESTREL_ITEST_ENGINE=cuda (their default tiny model)
#   hybrid  routed experts on the CPU (issue 32): test_moe_hybrid, test_cuda_hybrid, the CPU expert backend's tests,
#           then bench_engine on the Q4_0 35B-A3B file at 1 and 32 sessions with --n-cpu-moe 40 (every layer's
#           experts on the CPU), --n-cpu-moe 20 (half) and --gpu-memory 12G (the planner's choice)
#   upload  long prompt passes with host experts uploaded (gpu/engine/expert_upload.h): test_tile_device, the upload
#           tests of test_cuda_hybrid, then bench_engine pp128/256/512 on the Q4_0 35B-A3B file with --n-cpu-moe 40
#           and with --gpu-memory 12G, each with --expert-upload 1 (every prompt pass) and 0 (UPLOAD_S caps each
#           bench, default 150 s)
#   hybrid-daemon  kestreld --engine cuda --gpu-memory 12G (HD_PLACEMENT replaces the placement flags, e.g.
#           "--n-cpu-moe 40") on the Q4_0 35B-A3B file: the plan it logs, status, a generation over gRPC and over shm
#   cpu-daemon  kestreld --engine cpu on the same file: status, a generation over gRPC and over shm
#   sanitize  compute-sanitizer memcheck and racecheck over the kernel tests (SAN_TESTS overrides the list), then
#           memcheck over test_cuda_engine and test_cuda_hybrid; each run capped at SAN_S seconds (default 150);
#           SAN_RUNS="tool test;tool test" replaces the whole list; SAN_FILTER is passed as --gtest_filter
#   ncu     Nsight Compute's per-kernel durations over whole decode steps of bench_engine on the Q4_0 file at
#           NCU_SESSIONS (default 1,32) sessions; tools/device/ncu_step.py sums them per kernel and per step
#   ncu-pp  the same over prompt passes of NCU_PP tokens (default 512; decode graphs profiled whole): the last prompt
#           pass's kernels by name
#   contend  the gpu tests beside other GPU processes: test_gemv_imma, test_gdn_decode and test_moe_imma, two
#           processes each, in loops for CONTEND_S seconds (default 150) while `gputests` runs
#   model   only writes the Q4_0 35B-A3B file (/tmp/q4_0.gguf), so that `soak` fits the device's 600 s per command
#   soak    bench_soak: kestreld --engine cuda on that file, 64 clients (gRPC, shm and HTTP in turn) for SOAK_S seconds
#           (default 480), then SIGTERM (docs/benchmarks.md, the soak rows)
# Outputs land in $OUT. The binaries carry this machine's build paths (/work/main/...), so the tree is linked there;
# binaries built in another checkout (a worktree) name it in KESTREL_SOURCE_ROOT, which is linked too.
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for root in /work/main ${KESTREL_SOURCE_ROOT:-}; do
  [ -e "$root" ] || { mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"; }
done
k=/tmp/kestrel-carry
# Extracted once per carry (several instances of this script may run side by side on one warm machine).
sum=$(md5sum dev/carry.tar.xz | cut -d' ' -f1)
if [ "$(cat $k/.carry 2>/dev/null)" != "$sum" ]; then
  rm -rf $k && mkdir -p $k && tar -xJf dev/carry.tar.xz -C $k && echo "$sum" >$k/.carry
fi
export LD_LIBRARY_PATH=$k/lib:${LD_LIBRARY_PATH:-}
mkdir -p build/release/bin
for f in $k/bin/*; do ln -sf "$f" build/release/bin/; done
B=$k/bin
status=0
model_q4=/tmp/q4_0.gguf
make_q4() {
  [ -f $model_q4 ] && return 0
  local t0=$SECONDS
  $B/kestrel-mkmodel --preset qwen35moe-35b-a3b --types q4_0 -o $model_q4 -q || return 1
  echo "wrote $model_q4 in $((SECONDS - t0)) s"
}
# kestreld with the given engine flags on the Q4_0 file in folder $2, logging to $OUT/kestreld_$1.log: the lines of
# its log matching $3, status, one generation over gRPC and one over shm ($OUT/status_$1.txt, generate_$1.txt); it
# keeps serving (its pid in $served) until serve_stop.
serve_start() {
  local name=$1 d=$2 pattern=$3
  shift 3
  mkdir -p "$d"
  $B/kestreld "$@" --model $model_q4 --socket $d/k.sock --shm-socket $d/k-shm.sock --cache-dir $d/cache \
    --log-format text >"$OUT/kestreld_$name.log" 2>&1 &
  served=$!
  for _ in $(seq 1 600); do grep -q "serving" "$OUT/kestreld_$name.log" && break; sleep 0.5; done
  grep -E "$pattern" "$OUT/kestreld_$name.log" | head -30
  $B/kestrel status --connect unix://$d/k.sock 2>&1 | tee "$OUT/status_$name.txt"
  $B/kestrel generate --connect unix://$d/k.sock --prompt "Hello" -n 24 --temp 0 2>&1 | tee "$OUT/generate_$name.txt"
  $B/kestrel generate --connect shm://$d/k-shm.sock --prompt "Hello" -n 24 --temp 0 2>&1 | tee -a "$OUT/generate_$name.txt"
}
serve_stop() {
  kill -TERM $served
  wait $served
  echo "kestreld exited $?"
}
for step in "$@"; do
  echo "== $step"
  case $step in
    test)
      $B/test_cuda_engine 2>&1 | tee "$OUT/test_cuda_engine.log" | grep -E "^\[ |FAILED|PASSED|OK \]|rel diff|Failure|Expected|Which|actual" | head -80
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      $B/test_attention_decode --gtest_brief=1 2>&1 | tail -3
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      $B/test_gdn_decode --gtest_brief=1 2>&1 | tail -3
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      $B/test_gdn_runs --gtest_brief=1 2>&1 | tail -3
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      grep -E "^\[  (PASSED|FAILED) " "$OUT/test_cuda_engine.log" ;;
    gputests)
      for t in test_get_rows test_gemv test_gdn_decode test_gemv_imma test_weight_pool test_state_slots test_rms_norm \
               test_argmax test_attention_decode test_attention_prompt test_moe test_moe_imma test_moe_hybrid test_gdn_runs \
               test_tile_device test_cuda_engine \
               test_cuda_hybrid test_expert_handoff; do
        mkdir -p /tmp/gputests && log=/tmp/gputests/$t.log
        if $B/$t --gtest_brief=1 >"$log" 2>&1; then r=passed; else r=FAILED; status=1; fi
        echo "$t: $r ($(grep -E '^\[==========\] [0-9]+ tests' "$log" | tail -1 | sed 's/\[==========\] //'))"
        [ $r = passed ] || grep -E "Failure|FAILED" -A4 "$log" | head -20
      done ;;
    bench)
      make_q4 || { status=1; continue; }
      $B/bench_engine --model $model_q4 --sessions 1,8,32 2>&1 | tee "$OUT/bench_q4_0.txt" || status=1 ;;
    bench-long)
      make_q4 || { status=1; continue; }
      $B/bench_engine --model $model_q4 --sessions 1,8 --prompt 4000 --steps 32 2>&1 | tee "$OUT/bench_q4_0_long.txt" || status=1 ;;
    bench-nopdl)
      make_q4 || { status=1; continue; }
      $B/bench_engine --model $model_q4 --sessions 1,8,32 --no-pdl 2>&1 | tee "$OUT/bench_q4_0_nopdl.txt" || status=1 ;;
    bench-km)
      rm -f $model_q4
      $B/kestrel-mkmodel --preset qwen35moe-35b-a3b -o /tmp/q4_k_m.gguf -q || { status=1; continue; }
      $B/bench_engine --model /tmp/q4_k_m.gguf --sessions 1,8,32 2>&1 | tee "$OUT/bench_q4_k_m.txt" || status=1
      rm -f /tmp/q4_k_m.gguf ;;
    cputests)
      lscpu | grep -E "Model name|^CPU\(s\)|Thread|Flags" | sed 's/Flags:.*\(avx512[a-z_0-9]*\).*/avx512: yes/' | head -4
      for t in test_cpu_act_q8 test_cpu_gemv test_cpu_delta_rule test_cpu_worker_pool test_cpu_populate test_cpu_blocks \
        test_cpu_engine; do
        if $B/$t --gtest_brief=1 >"$OUT/$t.log" 2>&1; then r=passed; else r=FAILED; status=1; fi
        echo "$t: $r ($(grep -E '^\[==========\] [0-9]+ tests' "$OUT/$t.log" | tail -1 | sed 's/\[==========\] //'))"
        [ $r = passed ] || grep -E "Failure|FAILED" -A4 "$OUT/$t.log" | head -20
      done
      for level in avxvnni avx2 scalar; do
        echo -n "test_cpu_engine at $level: "
        KESTREL_CPU_ISA=$level $B/test_cpu_engine --gtest_brief=1 \
          --gtest_filter='*BitIdentical*:*BatchAndChunking*:*CloneSnapshot*' 2>&1 | tail -1
      done ;;
    cpubench)
      make_q4 || { status=1; continue; }
      # The host's topology: whether its 16 CPUs are cores or hyper-threads decides what "16 threads" means.
      lscpu | grep -E "^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket|Model name|L3" | tee "$OUT/lscpu.txt"
      echo "siblings (cpu:list): $(grep -H . /sys/devices/system/cpu/cpu*/topology/thread_siblings_list |
        sed 's|.*/cpu\([0-9]*\)/topology/thread_siblings_list:|\1:|' | tr '\n' ' ')"
      $B/bench_cpu_gemv --benchmark_min_time=0.3 2>&1 | tee "$OUT/bench_cpu_gemv.txt" | grep -E "BM_|Run on|CPU Caches" | head -60
      $B/bench_cpu_engine --model $model_q4 --sessions 1,8 --steps 8 --pp 512 --profile 2>&1 |
        tee "$OUT/bench_cpu_engine_q4_0.txt" || status=1
      rm -f $model_q4
      $B/kestrel-mkmodel --preset qwen35moe-35b-a3b -o /tmp/q4_k_m.gguf -q || { status=1; continue; }
      $B/bench_cpu_engine --model /tmp/q4_k_m.gguf --sessions 1,8 --steps 8 --pp 512 --profile 2>&1 |
        tee "$OUT/bench_cpu_engine_q4_k_m.txt" || status=1
      rm -f /tmp/q4_k_m.gguf ;;
    daemon)
      make_q4 || { status=1; continue; }
      serve_start cuda /tmp/kd "engine|placement|cuda:|serving" --engine cuda
      $B/kestrel bench --connect unix:///tmp/kd/k.sock --shm shm:///tmp/kd/k-shm.sock 2>&1 | tail -8 |
        tee "$OUT/bench_roundtrip.txt"
      serve_stop
      KESTREL_ITEST_ENGINE=cuda $B/test_daemon_integration 2>&1 | tee "$OUT/integration.log" | tail -30
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    hybrid)
      for t in test_moe_hybrid test_cuda_hybrid test_cpu_expert_backend test_cpu_expert_backend_threads; do
        if $B/$t --gtest_brief=1 >"$OUT/$t.log" 2>&1; then r=passed; else r=FAILED; status=1; fi
        echo "$t: $r ($(grep -E '^\[==========\] [0-9]+ tests' "$OUT/$t.log" | tail -1 | sed 's/\[==========\] //'))"
        [ $r = passed ] || grep -E "Failure|FAILED" -A4 "$OUT/$t.log" | head -20
      done
      grep -E "greedy tokens equal|hidden max rel diff" "$OUT/test_cuda_hybrid.log" | head -40
      make_q4 || { status=1; continue; }
      for p in "--n-cpu-moe 40" "--n-cpu-moe 20" "--gpu-memory 12G"; do
        echo "-- bench_engine $p"
        $B/bench_engine --model $model_q4 --sessions 1,32 --pp 512 --ttft 0 $p 2>&1 | tee "$OUT/bench_hybrid_${p// /_}.txt" || status=1
      done ;;
    upload)
      $B/test_tile_device --gtest_brief=1 2>&1 | tail -2
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      $B/test_cuda_hybrid --gtest_brief=1 --gtest_filter='*Upload*:*PageLocked*' 2>&1 | tee "$OUT/test_cuda_hybrid_upload.log" |
        grep -E "prompt pass|Failure|FAILED|PASSED|SKIPPED" | head -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      make_q4 || { status=1; continue; }
      for p in "--n-cpu-moe 40" "--gpu-memory 12G"; do
        for u in 1 0; do
          echo "-- bench_engine $p --expert-upload $u"
          # Line-buffered, so a run cut short by the cap still shows how far it came. 128, 256 and 512 tokens: around
          # where the upload starts to pay (tuning.h), and the issue's figure.
          timeout "${UPLOAD_S:-150}" stdbuf -oL $B/bench_engine --model $model_q4 --sessions 1 --steps 2 --pp 128,256,512 \
            --ttft 0 $p --expert-upload $u 2>&1 | tee "$OUT/bench_upload_${p// /_}_$u.txt" | grep -vE "^\s*$" | tail -40
          [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        done
      done ;;
    hybrid-daemon)
      make_q4 || { status=1; continue; }
      # shellcheck disable=SC2086  # HD_PLACEMENT holds several flags
      serve_start hybrid /tmp/kdh "placement|cuda:|expert backend|routed experts|predicted|routing counts|side read" \
        --engine cuda ${HD_PLACEMENT:---gpu-memory 12G}
      serve_stop ;;
    cpu-daemon)
      make_q4 || { status=1; continue; }
      serve_start cpu /tmp/kdc "engine|cpu|serving" --engine cpu
      serve_stop ;;
    sanitize)
      cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
      kernel_tests="test_get_rows test_gemv test_gdn_decode test_gdn_runs test_gemv_imma test_rms_norm test_argmax \
                    test_attention_decode test_moe test_moe_imma test_moe_hybrid test_state_slots test_weight_pool"
      runs=()
      for t in ${SAN_TESTS:-$kernel_tests}; do runs+=("memcheck $t" "racecheck $t"); done
      runs+=("memcheck test_cuda_engine" "memcheck test_cuda_hybrid")
      [ -n "${SAN_RUNS:-}" ] && IFS=';' read -ra runs <<<"$SAN_RUNS"
      for r in "${runs[@]}"; do
        set -- $r
        log="$OUT/san_$1_$2.log"
        timeout "${SAN_S:-150}" "$cs" --tool "$1" --error-exitcode 9 "$B/$2" --gtest_filter="${SAN_FILTER:-*}" >"$log" 2>&1
        rc=$?
        echo "$1 $2: rc $rc; $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1); $(grep -cE '^\[       OK \]' "$log") tests passed; $(grep -E '^\[==========\] [0-9]+ tests' "$log" | tail -1)"
        case $rc in 0) ;; 124) echo "  (cut at ${SAN_S:-150} s)" ;; *) status=1; grep -E "^=========" "$log" | head -12 ;; esac
      done ;;
    contend)
      mkdir -p /tmp/contend
      for i in 1 2; do
        for t in test_gemv_imma test_gdn_decode test_moe_imma; do
          (n=0; f=0; end=$((SECONDS + ${CONTEND_S:-150}))
           while [ $SECONDS -lt $end ]; do
             $B/$t --gtest_brief=1 >/tmp/contend/$t.$i.$n.log 2>&1 || f=$((f + 1)); n=$((n + 1))
           done
           echo "contender $t #$i: $n runs, $f failed"; [ $f -eq 0 ]) &
        done
      done
      bash "$0" gputests || status=1
      for j in $(jobs -p); do wait "$j" || status=1; done
      grep -l FAILED /tmp/contend/*.log 2>/dev/null | head -3 | xargs -r grep -h -A3 Failure | head -20 ;;
    model)
      make_q4 || status=1 ;;
    ncu)
      make_q4 || { status=1; continue; }
      nc=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      ns=${NCU_SESSIONS:-1,32}
      for s in ${ns//,/ }; do
        timeout "${NCU_S:-200}" "$nc" --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
          --log-file "$OUT/ncu_$s.csv" --launch-count "${NCU_N:-2500}" \
          $B/bench_engine --model $model_q4 --sessions "$s" --steps 2 --prompt 1 --pp 0 --ttft 0 >"$OUT/ncu_bench_$s.txt" 2>&1
        echo "ncu at $s sessions: rc $?"
        python3 tools/device/ncu_step.py "$OUT/ncu_$s.csv" | tee "$OUT/ncu_step_$s.txt"
      done ;;
    ncu-pp)
      make_q4 || { status=1; continue; }
      nc=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      pp=${NCU_PP:-512}
      timeout "${NCU_S:-300}" "$nc" --clock-control none --graph-profiling graph --metrics gpu__time_duration.sum --csv \
        --log-file "$OUT/ncu_pp$pp.csv" --launch-count "${NCU_N:-5000}" \
        $B/bench_engine --model $model_q4 --sessions 1 --steps 1 --prompt 1 --pp "$pp" --ttft 0 >"$OUT/ncu_bench_pp$pp.txt" 2>&1
      echo "ncu over pp$pp: rc $?"
      python3 tools/device/ncu_step.py "$OUT/ncu_pp$pp.csv" | tee "$OUT/ncu_step_pp$pp.txt" ;;
    soak)
      make_q4 || { status=1; continue; }
      $B/bench_soak --kestreld $B/kestreld --engine cuda --model $model_q4 --clients 64 --duration "${SOAK_S:-480}" \
        --transports grpc,shm,http 2>&1 | tee "$OUT/soak_cuda.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
