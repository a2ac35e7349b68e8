#!/usr/bin/env bash
# Packs what tools/device/engine_check.sh runs on the lent GPU machine: every gpu-labelled test (the hybrid
# placement's included), the CPU tests and benchmarks (the expert backend's included), the CUDA engine's benchmark
# and runner, kestrel-mkmodel, kestreld, the kestrel CLI, the daemon's integration test and its soak benchmark,
# stripped, with the shared libraries
# they need beyond libc/libstdc++/CUDA (gRPC, protobuf, spdlog, ...), into dev/carry.tar.xz. Build the release preset
# here first (nvcc present: CUDA on, sm_90); the device then needs no compiler and no Debian -dev packages.
#   tools/device/pack_carry.sh && (device) carry ["dev/carry.tar.xz"], run tools/device/engine_check.sh test bench
set -euo pipefail
bin=build/release/bin
rm -rf dev/carry && mkdir -p dev/carry/bin dev/carry/lib
gpu_tests=(test_get_rows test_gemv test_gdn_decode test_gemv_imma test_weight_pool test_state_slots test_rms_norm
           test_argmax test_attention_decode test_attention_prompt test_moe test_moe_imma test_moe_hybrid test_gdn_runs
           test_tile_device test_cuda_engine test_cuda_hybrid test_expert_handoff)
progs=("${gpu_tests[@]}" test_cpu_act_q8 test_cpu_gemv test_cpu_delta_rule test_cpu_worker_pool test_cpu_populate
       test_cpu_blocks test_cpu_engine test_cpu_expert_backend test_cpu_expert_backend_threads bench_cpu_gemv
       bench_cpu_engine bench_cpu_expert_backend
       bench_engine kestrel-engine-run kestrel-mkmodel kestreld kestrel itest_client
       test_daemon_integration bench_soak)
for b in "${progs[@]}"; do strip -o "dev/carry/bin/$b" "$bin/$b"; done
for b in "${progs[@]}"; do ldd "$bin/$b"; done | awk '/=>/ {print $3}' | sort -u |
  grep -vE 'lib(c|m|gcc_s|stdc\+\+|pthread|dl|rt|cuda|cudart)\.so|ld-linux' | while read -r f; do cp -L "$f" dev/carry/lib/; done
tar -C dev/carry -cf - bin lib | xz -T0 -9 >dev/carry.tar.xz
ls -la dev/carry.tar.xz
