#!/usr/bin/env bash
# Issue 4 acceptance experiments at small settings (2-layer, d_model 64 model on the built-in
# synthetic corpus). Usage: [PARTS="ddp compression attacks"] bench/diloco_experiments.sh [BIN] [H] [OUTER]
# The session-2 compression figures used H = 10, OUTER = 40; bench/compression_long.sh runs
# the top-k 1% line at 200 outer steps.
# Writes runs/diloco/*.json and prints one line per run with its final validation loss.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/target/release/neuroshard}"
h="${2:-50}"
outer="${3:-6}"
out="$root/runs/diloco"
mkdir -p "$out"
run() {
  local name="$1"; shift
  "$bin" experiment diloco --inner-steps "$h" --outer-steps "$outer" --json-out "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1
  printf '%-28s %s\n' "$name" "$(tail -1 "$out/$name.log")"
}
parts="${PARTS:-ddp compression attacks}"
want() { [[ " $parts " == *" $1 "* ]]; }
# 1. DiLoCo vs DDP at equal tokens, 4 replicas.
if want ddp; then
run ddp4 --replicas 4 --baseline ddp
run diloco4 --replicas 4
fi
if want compression; then
# 2. Compression with error feedback kept in the replicas' parameters (the default), against
#    dense DiLoCo at the same outer momentum; then the old placement of the residual.
run diloco4-m08 --replicas 4 --outer-momentum 0.8
run diloco4-randk25-sign-m08 --replicas 4 --compress randk:0.25:sign --outer-momentum 0.8
run diloco4-randk25-sign --replicas 4 --compress randk:0.25:sign
run diloco4-topk3-int2-m08 --replicas 4 --compress topk:0.03:int2 --outer-momentum 0.8
run diloco4-topk1-int2-m08 --replicas 4 --compress topk:0.01:int2 --outer-momentum 0.8
run diloco4-topk1-int2-accumulate --replicas 4 --compress topk:0.01:int2 --error-feedback accumulate
fi
if want attacks; then
# 3. 2 of 8 replicas attacking.
run clean8-mean --replicas 8
for attack in sign-flip alie ipm:0.1 gaussian:1.0; do
  for agg in mean trimmed-mean centered-clipping; do
    run "byz2of8-${attack%%:*}-$agg" --replicas 8 --byzantine 2 --attack "$attack" --aggregator "$agg"
  done
done
fi
