# shellcheck shell=bash
# Run or sourced on the lent GPU machine (repository root): unpacks the Debian packages carried in .debs/ into
# /tmp/kestrel-deps ($deps) once — a stamp of the packages' names and sizes skips the unpacking when they are already
# there (several trees configuring at once, as ab_bench.sh builds them, unpacked over each other and dpkg-deb
# failed; ab_bench.sh runs this once before its parallel builds). gpu_configure.sh sources it.
deps=/tmp/kestrel-deps
mkdir -p "$deps"
debs_signature=$(stat -c '%n %s' .debs/*.deb) || return 1 2>/dev/null || exit 1
if [ "$(cat "$deps/.unpacked" 2>/dev/null)" != "$debs_signature" ]; then
  for f in .debs/*.deb; do dpkg -x "$f" "$deps"; done
  printf '%s\n' "$debs_signature" >"$deps/.unpacked"
fi
