#!/usr/bin/env bash
# Runs on the lent GPU machine: compute-sanitizer's memcheck, racecheck and synccheck over GPU tests, each a test
# binary of build/gpu/bin with an optional GoogleTest filter (small cases: the tools slow kernels down 10–100×).
# Configures and builds like gpu_targets.sh; logs land in $OUT (san_<test>_<tool>.txt). Exits non-zero if any tool
# reports an error or a test fails, e.g.
#
#   tools/device/gpu_sanitize.sh "test_gdn_decode:GdnDecode.OddShapes:GdnDecode.TinyQwen35Tiled" \
#       "test_moe_imma:MoeImma.OddShapesQ4_0"
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 \"test[:filter[:filter...]]\" ..." >&2
  exit 2
fi
export PATH=$PATH:/usr/local/cuda/bin
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found" >&2; exit 1; }
targets=""
for spec in "$@"; do targets="$targets ${spec%%:*}"; done
# shellcheck disable=SC2086  # the targets are one word each
bash "$(dirname "$0")/gpu_targets.sh" "$targets" || exit 1
status=0
for spec in "$@"; do
  test=${spec%%:*}
  filter=()
  [ "$spec" != "$test" ] && filter=("--gtest_filter=${spec#*:}")
  for tool in memcheck racecheck synccheck; do
    log="$OUT/san_${test}_${tool}.txt"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "build/gpu/bin/$test" "${filter[@]}" >"$log" 2>&1
    rc=$?
    echo "$test $tool: rc $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
    [ "$rc" -ne 0 ] && status=1
  done
done
exit "$status"
