#!/usr/bin/env bash
# The official `openai` Python client (PyPI) against a live 4-node swarm that is still
# training: one streamed completion, then 50 concurrent streaming clients for 30 s. Fails on
# any client error, or if the drivers did not step during the soak.
# Usage: .ci/serve_clients.sh [SOAK_SECONDS] [CLIENTS]   (needs target/debug/neuroshard)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
soak="${1:-30}"
clients="${2:-50}"
bin="$root/target/debug/neuroshard"
source "$root/bench/venv.sh" openai
work="$(mktemp -d)"
swarm_pid=""
cleanup() {
  if [ -n "$swarm_pid" ]; then
    # Ctrl-C stops the swarm and its nodes; whatever of its process group is left is killed.
    kill -INT "$swarm_pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$swarm_pid" 2>/dev/null || break; sleep 0.5; done
    if pgrep -g "$swarm_pid" >/dev/null; then kill -KILL -- "-$swarm_pid" 2>/dev/null || true; fi
  fi
  rm -rf "$work"
}
trap cleanup EXIT
tiny=(--layers 3 --d-model 64 --heads 4 --seq 32 --batch 4)
"$bin" genesis build --synthetic --synthetic-tokens 60000 --out "$work/g" >/dev/null
# Far more steps than the soak lasts: the swarm trains all along.
RUST_LOG=warn setsid "$bin" swarm --data "$work/g" --out "$work/model" --nodes 4 --stages 2 \
  --steps 1000000 "${tiny[@]}" >"$work/out.log" 2>"$work/err.log" &
swarm_pid=$!
url=""
for _ in $(seq 1 180); do
  url="$(grep -o 'API: http://[0-9.:]*/v1' "$work/err.log" "$work/out.log" 2>/dev/null | head -1 | sed 's/.*API: //')" || true
  [ -n "$url" ] && break
  kill -0 "$swarm_pid" || { cat "$work/err.log"; echo "the swarm died"; exit 1; }
  sleep 1
done
[ -n "$url" ] || { cat "$work/err.log"; echo "no API URL within 180 s"; exit 1; }
base="${url%/v1}"
step() {
  "$PY" -c 'import json,sys,urllib.request as u; print(json.load(u.urlopen(sys.argv[1], timeout=10))["step"])' "$base/api/status"
}
# Wait until the drivers train (the pipeline needs every stage's replicas).
for _ in $(seq 1 120); do
  s="$(step 2>/dev/null || echo 0)"
  [ "$s" -gt 0 ] && break
  sleep 1
done
before="$(step)"
"$PY" "$root/bench/openai_stream.py" "$url" --concurrency 1 --max-tokens 8
"$PY" "$root/bench/openai_stream.py" "$url" --soak "$soak" --clients "$clients" --max-tokens 16
after="$(step)"
echo "driver steps during the soak: $before -> $after"
[ "$after" -gt "$before" ] || { echo "training stopped while serving"; exit 1; }
