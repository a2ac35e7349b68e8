#!/usr/bin/env bash
# Runs on the lent GPU machine: the quick loop of kernel work. Configures build/gpu exactly as gpu_host_run.sh does
# (Release, sm_90, the Debian packages carried in .debs/ unpacked), builds only the named targets, then runs each
# further argument as a shell command from the repository root, e.g.
#
#   tools/device/gpu_targets.sh "test_gemv_imma bench_gemv" \
#       "build/gpu/bin/test_gemv_imma" "build/gpu/bin/bench_gemv /imma/ > \$OUT/bench.txt; tail -3 \$OUT/bench.txt"
#
# Logs land in $OUT (configure.log, build.log). Building a few targets takes about a minute where the whole tree
# takes several; use gpu_host_run.sh for the full `ctest -L gpu` run a note quotes.
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 \"target ...\" [command ...]" >&2
  exit 2
fi
# shellcheck source=tools/device/gpu_configure.sh
source "$(dirname "$0")/gpu_configure.sh" || exit 1
targets=$1
shift
# shellcheck disable=SC2086  # the targets are one word each
cmake --build build/gpu -j"$(nproc)" --target $targets >"$OUT/build.log" 2>&1 ||
  { grep -E "error|Error" -A5 "$OUT/build.log" | head -60; exit 1; }
status=0
for c in "$@"; do
  echo "== $c"
  bash -c "$c" || status=$?
done
exit "$status"
