#!/usr/bin/env bash
# CI's chaos soak: bench/soak.sh made short (4 nodes, 80 s of chaos, `home` links, no
# baseline runs; under 3 minutes). Builds linkem (release, two small dependencies); runs the
# debug binary `cargo test --workspace` leaves in target/debug (.ci/run's), building it with
# `cargo build --bin neuroshard` if it is missing. Where network namespaces (root, iproute2, tc, /dev/net/tun) are not
# available it says so and exits 0.
#   bash .ci/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=cisk
skip() {
    echo "soak: SKIPPED: $* (the chaos soak needs Linux network namespaces)"
    exit 0
}
[[ $(id -u) -eq 0 ]] || skip "not root"
command -v ip >/dev/null || skip "no ip (iproute2)"
command -v tc >/dev/null || skip "no tc (iproute2)"
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun"
probe=${prefix}probe$$
ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace"
probe_ok=1
ip -n "$probe" tuntap add dev lk0 mode tun 2>/dev/null &&
    tc -n "$probe" qdisc add dev lk0 root tbf rate 20mbit burst 25000 latency 200ms 2>/dev/null ||
    probe_ok=0
ip netns del "$probe"
[[ $probe_ok == 1 ]] || skip "no tun device or tbf qdisc inside a namespace"

cleanup() {
    # bench/links.sh removes its namespaces; this catches any left by a run killed hard.
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup

cargo build --release -q -p neuroshard-linkem
[[ -x target/debug/neuroshard ]] || cargo build -q --bin neuroshard
out=$(mktemp -d)
SOAK_SECS=80 SOAK_NODES=4 SOAK_KILL=20-30 SOAK_PARTITION=15 SOAK_BASELINE=0 \
    SOAK_STEPS=${SOAK_STEPS:-300} SOAK_OUT="$out" LINKS_PREFIX=$prefix \
    bench/soak.sh
rm -rf "$out"
