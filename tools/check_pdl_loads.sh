#!/usr/bin/env bash
# check_pdl_loads.sh FILE.ptx...: in every kernel (.entry) that waits on a programmatic launch (griddepcontrol.wait),
# no non-coherent load (ld.global.nc) may follow the wait, except the resident weights' streaming loads
# (ld.global.nc.L1::no_allocate, gpu/kernels/ld_stream.cuh). What a kernel before wrote must be read with ordinary loads after
# the wait (gpu/kernels/pdl.cuh, ld_dep): a non-coherent load promises data that is read-only for the kernel's whole lifetime,
# so ptxas may schedule it ahead of the wait — on the H200 it did, and a grouped GEMV read its table's count before the
# kernel before had written it. Text order stands in for "after";
# the PTX of gpu/ is straight-line enough for it. An argument may hold several files separated by ';' (a CMake list).
# Exit status 1 with the offending kernels and lines listed.
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: $0 FILE.ptx..." >&2
  exit 2
fi
files=()
for arg in "$@"; do
  IFS=';' read -ra parts <<<"$arg"
  files+=("${parts[@]}")
done
status=0
for f in "${files[@]}"; do
  if ! awk -v file="$f" '
    /^(\.visible |\.weak )?\.entry / { name = $NF; sub(/\(.*/, "", name); waited = 0; kernels++ }
    /griddepcontrol\.wait/ { waited = 1 }
    waited && /ld\.global\.nc/ && !/L1::no_allocate/ {
      bad++
      if (bad <= 20) printf "%s: %s: non-coherent load after griddepcontrol.wait: %s\n", file, name, $0
    }
    END {
      if (kernels == 0) { printf "%s: no kernels found\n", file; exit 1 }
      if (bad > 0) exit 1
    }' "$f"; then
    status=1
  fi
done
exit "$status"
