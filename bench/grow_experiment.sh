#!/usr/bin/env bash
# Learning value of depth growth at equal training compute (6·N FLOPs per token, N the
# parameters in matrix products: the blocks and the LM head): a fixed 4-layer run of STEPS4
# steps, a fixed 2-layer run of the same compute, and runs that grow 2 → 4 layers after a
# fraction f of that compute (each f in GROW_FRACS, default 0.5; then (1 − f)·STEPS4 steps at
# 4 layers). 8×128 tokens a step, cosine schedule over each run's own length. Prints each
# run's validation loss and bits/byte, and held-out bits/byte on HELDOUT.txt ("-": none).
#
# usage: [D_MODEL=256 HEADS=4 STEPS4=400 GROW_FRACS="0.5 0.25"] \
#          bench/grow_experiment.sh BIN GENESIS HELDOUT.txt OUTDIR [SEED]
#
# The defaults reproduce the README's d_model-256 table (400 / 640 / 320 + 200 steps).
set -euo pipefail
bin=$1 data=$2 heldout=$3 out=$4 seed=${5:-0}
d=${D_MODEL:-256} heads=${HEADS:-4} steps4=${STEPS4:-400}
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['manifest']['tokenizer']['vocab_size'])" "$data/manifest.json")
# ffn = 8/3 · d_model rounded up to 16 (the CLI's default); kv heads = heads.
steps2=$(python3 -c "
import math, sys
d, vocab, s4 = (int(x) for x in sys.argv[1:])
ffn = math.ceil(8 * d / 3 / 16) * 16
block = 4 * d * d + 3 * d * ffn
n2, n4 = 2 * block + d * vocab, 4 * block + d * vocab
print(round(s4 * n4 / n2))" "$d" "$vocab" "$steps4")
mkdir -p "$out"
echo "d_model $d, vocab $vocab: fixed4 $steps4 steps, fixed2 $steps2" | tee "$out/plan.txt"
common=(--data "$data" --d-model "$d" --heads "$heads" --eval-every 40 --threads 2 --seed "$seed")
run() {
  local name=$1; shift
  "$bin" train "${common[@]}" "$@" --out "$out/$name" --json-log "$out/$name.jsonl" \
    | tee "$out/$name.train.txt"
  if [ "$heldout" != "-" ]; then
    "$bin" eval --checkpoint "$out/$name" --text "$heldout" --json > "$out/$name.heldout.json"
  fi
  "$bin" eval --checkpoint "$out/$name" --data "$data" --json > "$out/$name.val.json"
}
run fixed4 --layers 4 --steps "$steps4"
names=(fixed2)
for f in ${GROW_FRACS:-0.5}; do
  # f of the compute at 2 layers (f · the fixed 2-layer steps), the rest at 4.
  read -r at total < <(python3 -c "
import sys
f, s4, s2 = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
at = round(f * s2)
print(at, at + round((1 - f) * s4))" "$f" "$steps4" "$steps2")
  echo "grow 2→4 after $f of the compute: at step $at of $total" | tee -a "$out/plan.txt"
  run "grow2to4-$f" --layers 2 --steps "$total" --grow-at "$at:4"
  names+=("grow2to4-$f")
done
run fixed2 --layers 2 --steps "$steps2"
names+=(fixed4)
for name in "${names[@]}"; do
  echo "$name: val $(tr -d '\n' < "$out/$name.val.json")"
  if [ "$heldout" != "-" ]; then
    echo "$name: held-out $(tr -d '\n' < "$out/$name.heldout.json")"
  fi
done
