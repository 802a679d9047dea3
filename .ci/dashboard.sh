#!/usr/bin/env bash
# The dashboard in a browser: Debian's headless Chromium driven by playwright-core, first
# against a stand-in node (hostile peer strings), then against a live 4-node swarm of the
# debug binary (`cargo build --bin neuroshard` first). Also checks that the checked-in assets
# are what `npm run build` makes. Screenshot: target/dashboard.png. Bounded: every wait has
# a timeout, and the swarm is always stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=$root/target/debug/neuroshard
shot=$root/target/dashboard.png

if [ ! -x /usr/bin/chromium ]; then
    echo "dashboard: installing Debian's chromium"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
[ -x "$bin" ] || { echo "dashboard: $bin is missing: cargo build --bin neuroshard" >&2; exit 1; }

(cd web && timeout 300 npm ci --no-audit --no-fund --loglevel=error)
timeout 120 bash web/scripts/check-assets.sh

(cd web && timeout 60 node e2e/dashboard.mjs --mock --screenshot "$root/target/dashboard-mock.png")

work=$(mktemp -d)
swarm=
stop_swarm() {
    if [ -n "$swarm" ]; then
        # Ctrl-C: the swarm stops its nodes. Whatever of its process group (setsid below made
        # it the leader) is left after 20 s, nodes included, is killed.
        kill -INT "$swarm" 2>/dev/null || true
        for _ in $(seq 40); do kill -0 "$swarm" 2>/dev/null || break; sleep 0.5; done
        if pgrep -g "$swarm" >/dev/null; then kill -KILL -- "-$swarm" 2>/dev/null || true; fi
    fi
    rm -rf "$work"
}
trap stop_swarm EXIT

RUST_LOG=warn timeout 60 "$bin" genesis build --synthetic --synthetic-tokens 60000 \
    --out "$work/g" >/dev/null
# The tiny model of the CLI tests (crates/cli/tests/common): a few seconds of training.
# DiLoCo rounds every 10 steps: the drivers score held-out windows after each (the validation curve).
RUST_LOG=warn setsid "$bin" swarm --nodes 4 --stages 2 --steps 30 --sync-every 10 --settle-s 1 --serve \
    --gen-tokens 0 --layers 3 --d-model 64 --heads 4 --seq 32 --batch 4 \
    --data "$work/g" --out "$work/model" >"$work/swarm.log" 2>&1 &
swarm=$!

url=
for _ in $(seq 120); do
    url=$(grep -o 'dashboard: http://[^ ]*' "$work/swarm.log" | head -n1 | cut -d' ' -f2 || true)
    [ -n "$url" ] && break
    kill -0 "$swarm" 2>/dev/null || break
    sleep 0.5
done
if [ -z "$url" ]; then
    echo "dashboard: the swarm printed no dashboard URL in 60 s:" >&2
    cat "$work/swarm.log" >&2
    exit 1
fi
echo "dashboard: $url"

status=0
(cd web && timeout 150 node e2e/dashboard.mjs --url "$url" --nodes 4 --screenshot "$shot") || status=$?
if [ "$status" -ne 0 ]; then
    echo "dashboard: the swarm's output:" >&2
    tail -n 40 "$work/swarm.log" >&2
fi
exit "$status"
