#!/usr/bin/env bash
# Issue 4's compression line at length: top-k 1% + 2-bit values + error feedback against dense
# DiLoCo, 4 replicas, H = 10, 200 outer steps on the built-in synthetic corpus, with and without
# the blockwise DCT, for the given seeds.
# Usage: bench/compression_long.sh [BIN] [OUTER] [SEEDS...]   (default: release binary, 200, 0 1)
# Writes runs/compression/*.json and prints each run's final validation loss and ratio.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/target/release/neuroshard}"
outer="${2:-200}"
shift $(( $# > 2 ? 2 : $# ))
seeds=("${@:-0 1}")
out="$root/runs/compression"
mkdir -p "$out"
data="$out/genesis-synthetic"
[ -f "$data/manifest.json" ] || "$bin" genesis build --synthetic --out "$data" >/dev/null
run() {
  local name="$1"; shift
  "$bin" experiment diloco --data "$data" --replicas 4 --inner-steps 10 --outer-steps "$outer" \
    --json-out "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  printf '%-24s %s  %s\n' "$name" "$(tail -1 "$out/$name.log")" \
    "$(grep -o '[0-9.]*x)' "$out/$name.log" | tail -1)"
}
for seed in ${seeds[@]}; do
  run "dense-s$seed" --seed "$seed"
  run "dense-m08-s$seed" --seed "$seed" --outer-momentum 0.8
  run "topk1-int2-m08-s$seed" --seed "$seed" --compress topk:0.01:int2 --outer-momentum 0.8
  run "topk1-int2-dct-m08-s$seed" --seed "$seed" --compress topk:0.01:int2:dct --outer-momentum 0.8
done
