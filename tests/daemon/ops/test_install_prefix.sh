#!/usr/bin/env bash
# `cmake --install BUILD --prefix X` puts everything under X: the binaries, the systemd unit (its ExecStart naming
# X/bin/kestreld and X/etc/kestrel/kestreld.toml), sysusers.d, tmpfiles.d, the live configuration and the docs, and
# writes nothing elsewhere. With DESTDIR=D and --prefix /usr the unit names /usr/bin and /etc, staged under D. A
# second install keeps the configuration the administrator has.
#
#   test_install_prefix.sh BUILD_DIR
set -euo pipefail
build=$1
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kestrel-install.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$scratch/prefix
out=$(cmake --install "$build" --prefix "$prefix" 2>&1) || fail "cmake --install failed: $out"
# Every file installed or checked lies under the prefix.
outside=$(printf '%s\n' "$out" | sed -n 's/^-- \(Installing\|Up-to-date\|Keeping existing\): //p' | grep -v "^$prefix/" || true)
[ -z "$outside" ] || fail "installed outside the prefix: $outside"
for f in bin/kestreld bin/kestrel lib/systemd/system/kestreld.service lib/sysusers.d/kestrel.conf \
         lib/tmpfiles.d/kestrel.conf etc/kestrel/kestreld.toml share/doc/kestrel/kestreld.toml.example \
         share/doc/kestrel/operations.md share/kestrel/tokenizer/qwen3/tokenizer.json; do
  [ -f "$prefix/$f" ] || fail "$prefix/$f is missing"
done
grep -qx "ExecStart=$prefix/bin/kestreld --config $prefix/etc/kestrel/kestreld.toml" \
  "$prefix/lib/systemd/system/kestreld.service" || fail "the unit's ExecStart: $(grep ExecStart "$prefix/lib/systemd/system/kestreld.service")"
"$prefix/bin/kestreld" --config "$prefix/etc/kestrel/kestreld.toml" --check-config >/dev/null ||
  fail "the installed configuration does not validate"

# A configuration the administrator changed survives the next install.
echo 'engine = "cpu"' >"$prefix/etc/kestrel/kestreld.toml"
cmake --install "$build" --prefix "$prefix" >/dev/null 2>&1 || fail "second install failed"
grep -q '^engine = "cpu"' "$prefix/etc/kestrel/kestreld.toml" || fail "the second install replaced the configuration"

# Staging for a package: DESTDIR with the system prefix.
stage=$scratch/stage
DESTDIR=$stage cmake --install "$build" --prefix /usr >/dev/null 2>&1 || fail "DESTDIR install failed"
grep -qx "ExecStart=/usr/bin/kestreld --config /etc/kestrel/kestreld.toml" "$stage/usr/lib/systemd/system/kestreld.service" ||
  fail "the staged unit's ExecStart: $(grep ExecStart "$stage/usr/lib/systemd/system/kestreld.service")"
[ -f "$stage/etc/kestrel/kestreld.toml" ] || fail "the staged configuration is missing"
[ -f "$stage/usr/lib/sysusers.d/kestrel.conf" ] || fail "the staged sysusers.d entry is missing"
echo "ok: cmake --install --prefix and DESTDIR keep every file under the prefix"
