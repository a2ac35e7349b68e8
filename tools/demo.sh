#!/usr/bin/env bash
# The README's main job after the build: start kestreld on the embedded default model (made on first start into
# the cache folder) with its OpenAI-compatible HTTP API on a free loopback port, wait until it serves, stream one
# generation from the `kestrel` client over the daemon's Unix socket and one over the shared-memory fast path, stream
# a chat completion over HTTP with curl (server-sent events as an OpenAI client receives them), show `kestrel
# status`, then stop the daemon with SIGTERM (it drains and exits 0). Sockets live in a private temporary folder, so
# this never touches a system-wide kestreld.
#
#   tools/demo.sh [BUILD_DIR]        (default build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/release}/bin
for b in kestreld kestrel; do
  [ -x "$bin/$b" ] || { echo "demo: $bin/$b is missing; build first (cmake --build --preset release)" >&2; exit 1; }
done

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/kestrel-demo.XXXXXX")
sock=$run_dir/kestreld.sock
shm=$run_dir/kestreld-shm.sock
log=$run_dir/kestreld.log
"$bin/kestreld" --socket "$sock" --shm-socket "$shm" --http 127.0.0.1:0 --log-level info >"$log" 2>&1 &
pid=$!
cleanup() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$run_dir"
}
trap cleanup EXIT

echo "demo: kestreld (pid $pid) is starting; log: $log"
for _ in $(seq 1 600); do
  if "$bin/kestrel" status --connect "unix://$sock" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "demo: kestreld exited during start-up:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.2
done
"$bin/kestrel" status --connect "unix://$sock"
http_port=$(sed -n 's/.*HTTP listening on .* (port \([0-9]*\)).*/\1/p' "$log" | head -n 1)

echo
echo "demo: streaming a generation over gRPC (unix://$sock)"
"$bin/kestrel" generate --connect "unix://$sock" --prompt "The kestrel hovers over the field and" -n 32 --seed 7
echo
echo "demo: the same request over the shared-memory fast path (shm://$shm)"
"$bin/kestrel" generate --connect "shm://$shm" --prompt "The kestrel hovers over the field and" -n 32 --seed 7
echo
echo "demo: a chat completion streamed over HTTP (POST http://127.0.0.1:$http_port/v1/chat/completions, curl)"
curl -sS -N "http://127.0.0.1:$http_port/v1/chat/completions" -H "Content-Type: application/json" -d '{
  "messages": [{"role": "system", "content": "You are a field guide."},
               {"role": "user", "content": "How does a kestrel hunt?"}],
  "max_tokens": 12, "seed": 7, "stream": true, "stream_options": {"include_usage": true}}'
echo

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
echo "demo: kestreld stopped on SIGTERM with exit status $status"
exit "$status"
