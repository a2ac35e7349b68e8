#!/usr/bin/env bash
# Runs on the lent GPU machine (CUDA, CMake, Python with torch + transformers; no Debian -dev packages): unpacks the
# Debian packages carried in .debs/ (GoogleTest, PCRE2, nlohmann-json, CLI11), builds core + gpu + tests for sm_90,
# runs the `gpu` tests, and with --golden regenerates the golden fixtures with transformers and checks the reference
# against them. Results land in $OUT (golden.tar, logs).
#
#   tools/device/gpu_host_run.sh [--golden] [--bench] [--no-unit]
# --bench runs every bench/gpu executable that was built (output in $OUT/bench_*.txt); --no-unit skips the CPU tests.
# Prepare .debs/ here first:  (mkdir -p .debs && cd .debs && apt-get download libgtest-dev libgmock-dev googletest \
#   libpcre2-dev libpcre2-8-0 nlohmann-json3-dev libcli11-dev libbenchmark-dev libbenchmark1debian)
set -uo pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# shellcheck source=tools/device/gpu_configure.sh
source "$(dirname "$0")/gpu_configure.sh" || exit 1
cmake --build build/gpu -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|Error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "== gpu tests"
ctest --test-dir build/gpu -L gpu --output-on-failure 2>&1 | tee "$OUT/ctest-gpu.log" | tail -25

if [[ " $* " == *" --golden "* ]]; then
  echo "== golden fixtures (transformers $(python3 -c 'import transformers; print(transformers.__version__)'))"
  mkdir -p build/golden
  for p in golden-qwen35moe golden-qwen35 golden-qwen3next; do
    build/gpu/bin/kestrel-mkmodel --preset "$p" -o "build/golden/$p.gguf" -q || exit 1
  done
  PYTHONUNBUFFERED=1 python3 tools/golden/make_golden.py build/golden/*.gguf --out build/golden/fixtures 2>&1 |
    tee "$OUT/golden.log" | tail -40
  for p in golden-qwen35moe golden-qwen35 golden-qwen3next; do
    [ -d "build/golden/fixtures/$p" ] && cp "build/golden/$p.gguf" "build/golden/fixtures/$p/"
  done
  tar -C build/golden -cf "$OUT/golden.tar" fixtures
  rm -rf tests/golden/fixtures && cp -r build/golden/fixtures tests/golden/fixtures
  cmake --build build/gpu --target test_golden >/dev/null 2>&1
  echo "== golden test"
  build/gpu/bin/test_golden 2>&1 | tee "$OUT/test-golden.log" | grep -E "golden |FAIL|PASS|Failure|error" | head -40
fi
if [[ " $* " == *" --bench "* ]]; then
  for b in build/gpu/bin/bench_*; do
    [ -x "$b" ] || continue
    n=$(basename "$b")
    echo "== $n"
    timeout 240 "$b" > "$OUT/$n.txt" 2>&1; echo "exit $?" >> "$OUT/$n.txt"
    tail -40 "$OUT/$n.txt"
  done
fi
[[ " $* " == *" --no-unit "* ]] && exit 0
echo "== unit and golden tests (this build: -O3 -march=native)"
ctest --test-dir build/gpu -L 'unit|golden' -j8 --output-on-failure > "$OUT/ctest-unit.log" 2>&1
grep -E "tests passed|Failure|FAILED|Expected|Which is|rel|error" "$OUT/ctest-unit.log" | head -40
