#!/usr/bin/env bash
# Shaped links between the nodes of a swarm: every node in its own network namespace, its
# uplink shaped by the kernel's token bucket (tc tbf) and every packet carried between the
# namespaces by a userspace link emulator (linkem) that adds the profile's delay, jitter and
# loss (this kernel has no netem). Not part of CI; needs root.
#
#   bench/links.sh PROFILE NODES COMMAND...
#
# PROFILE: loopback | fiber (200 Mbit/s, 10 ms) | home (20 Mbit/s up, 40 ms ± 10 ms, 0.5%
# loss) | bad-home (5 Mbit/s, 80 ms, 2% loss); the delay is one-way, added once per packet.
# COMMAND is a `neuroshard swarm` command line; `--netns PREFIX` is appended, so node i runs
# in namespace PREFIX<i> at 10.77.0.<i+1>. Make NODES one more than the swarm's --nodes when
# it uses --join-at. Example:
#
#   bench/links.sh home 4 target/release/neuroshard swarm --nodes 4 --stages 2 --steps 100
#
# Environment: LINKEM (the linkem binary, default target/release/linkem), LINKS_PREFIX
# (namespace prefix, default lk), LINKS_SEED (loss and jitter seed, default 1).
set -euo pipefail

if [[ $# -lt 3 ]]; then
    sed -n '2,20p' "$0" >&2
    exit 2
fi
profile=$1
nodes=$2
shift 2
linkem=${LINKEM:-target/release/linkem}
prefix=${LINKS_PREFIX:-lk}
seed=${LINKS_SEED:-1}

[[ $(id -u) -eq 0 ]] || { echo "links.sh: needs root (ip netns, tun)" >&2; exit 1; }
[[ -x $linkem ]] || { echo "links.sh: $linkem missing: cargo build --release -p neuroshard-linkem" >&2; exit 1; }
rate=$("$linkem" rate "$profile")

linkem_pid=
cleanup() {
    if [[ -n $linkem_pid ]]; then
        kill "$linkem_pid" 2>/dev/null || true
        wait "$linkem_pid" 2>/dev/null || true
    fi
    for ((i = 0; i < nodes; i++)); do
        ip netns del "$prefix$i" 2>/dev/null || true
    done
}
trap cleanup EXIT

for ((i = 0; i < nodes; i++)); do
    ns=$prefix$i
    ip netns del "$ns" 2>/dev/null || true
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" tuntap add dev lk0 mode tun
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev lk0
    ip -n "$ns" link set lk0 up
    if [[ $rate != none ]]; then
        # Burst: 10 ms at the rate (at least 16 KB); queue: 200 ms, a home router's buffer.
        burst=$((rate * 1000000 / 8 / 100))
        ((burst < 16384)) && burst=16384
        tc -n "$ns" qdisc add dev lk0 root tbf rate "${rate}mbit" burst "$burst" latency 200ms
    fi
done

"$linkem" "$profile" "$prefix" "$nodes" "$seed" &
linkem_pid=$!
sleep 0.5
kill -0 "$linkem_pid" || { echo "links.sh: linkem did not start" >&2; exit 1; }

"$@" --netns "$prefix"
