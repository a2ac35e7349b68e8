# shellcheck shell=bash
# Sourced by gpu_host_run.sh and gpu_targets.sh on the lent GPU machine (bash, repository root): unpacks the Debian
# packages carried in .debs/ (gpu_deps.sh), exports OUT (default /tmp/out) and LD_LIBRARY_PATH, and configures
# build/gpu (Release, CUDA for sm_90, no daemon, no Google Benchmark). Returns non-zero, with the tail of
# $OUT/configure.log printed, when configuring fails.
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# shellcheck source=tools/device/gpu_deps.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_deps.sh" || return 1
libdir=$deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$libdir:${LD_LIBRARY_PATH:-}
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKESTREL_CUDA=ON -DKESTREL_DAEMON=OFF \
  -DKESTREL_BENCH=OFF -DKESTREL_NATIVE=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$deps/usr" \
  -DPCRE2_INCLUDE_DIR="$deps/usr/include" -DPCRE2_LIBRARY="$libdir/libpcre2-8.so" >"$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log"; false; }
