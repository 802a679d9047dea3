#!/usr/bin/env bash
# Learning value of depth growth at equal training compute (6·N FLOPs per token, N the
# parameters in matrix products): a fixed 4-layer run of 400 steps, a fixed 2-layer run of the
# same compute (640 steps) and a run that grows 2 → 4 layers at half that compute (320 steps at
# 2 layers, then 200 at 4). d_model 256, vocab 4096, 8×128 tokens a step, cosine schedule over
# each run's own length. Prints each run's validation loss and held-out bits/byte.
#
# usage: bench/grow_experiment.sh BIN GENESIS HELDOUT.txt OUTDIR [SEED]
set -euo pipefail
bin=$1 data=$2 heldout=$3 out=$4 seed=${5:-0}
mkdir -p "$out"
common=(--data "$data" --d-model 256 --heads 4 --eval-every 40 --threads 2 --seed "$seed")
run() {
  local name=$1; shift
  "$bin" train "${common[@]}" "$@" --out "$out/$name" --json-log "$out/$name.jsonl" \
    | tee "$out/$name.train.txt"
  "$bin" eval --checkpoint "$out/$name" --text "$heldout" --json > "$out/$name.heldout.json"
  "$bin" eval --checkpoint "$out/$name" --data "$data" --json > "$out/$name.val.json"
}
run fixed4 --layers 4 --steps 400
run grow2to4 --layers 2 --steps 520 --grow-at 320:4
run fixed2 --layers 2 --steps 640
for name in fixed2 grow2to4 fixed4; do
  echo "$name: val $(cat "$out/$name.val.json" | tr -d '\n')"
  echo "$name: held-out $(cat "$out/$name.heldout.json" | tr -d '\n')"
done
