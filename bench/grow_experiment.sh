#!/usr/bin/env bash
# Learning value of depth growth at equal training compute (6·N FLOPs per token, N the
# parameters in matrix products: the blocks and the LM head): a fixed 4-layer run of STEPS4
# steps, a fixed 2-layer run of the same compute and a run that grows 2 → 4 layers at half
# that compute (then STEPS4/2 steps at 4 layers). 8×128 tokens a step, cosine schedule over
# each run's own length. Prints each run's validation loss and bits/byte, and held-out
# bits/byte on HELDOUT.txt ("-": none).
#
# usage: [D_MODEL=256 HEADS=4 STEPS4=400] bench/grow_experiment.sh BIN GENESIS HELDOUT.txt OUTDIR [SEED]
#
# The defaults reproduce the README's d_model-256 table (400 / 640 / 320 + 200 steps).
set -euo pipefail
bin=$1 data=$2 heldout=$3 out=$4 seed=${5:-0}
d=${D_MODEL:-256} heads=${HEADS:-4} steps4=${STEPS4:-400}
vocab=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['manifest']; print(m['tokenizer']['vocab_size'])" "$data/manifest.json")
# ffn = 8/3 · d_model rounded up to 16 (the CLI's default); kv heads = heads.
read -r steps2 grow_at grow_steps < <(python3 - "$d" "$vocab" "$steps4" <<'EOF'
import math, sys
d, vocab, s4 = (int(x) for x in sys.argv[1:])
ffn = math.ceil(8 * d / 3 / 16) * 16
block = 4 * d * d + 3 * d * ffn
n2, n4 = 2 * block + d * vocab, 4 * block + d * vocab
# fixed 2: the same compute; growth: half of it at 2 layers, the rest (s4/2 steps) at 4.
print(round(s4 * n4 / n2), round(s4 * n4 / (2 * n2)), round(s4 * n4 / (2 * n2)) + s4 // 2)
EOF
)
mkdir -p "$out"
echo "d_model $d, vocab $vocab: fixed4 $steps4 steps, fixed2 $steps2, grow 2→4 at $grow_at of $grow_steps" | tee "$out/plan.txt"
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
run grow2to4 --layers 2 --steps "$grow_steps" --grow-at "$grow_at:4"
run fixed2 --layers 2 --steps "$steps2"
for name in fixed2 grow2to4 fixed4; do
  echo "$name: val $(tr -d '\n' < "$out/$name.val.json")"
  if [ "$heldout" != "-" ]; then
    echo "$name: held-out $(tr -d '\n' < "$out/$name.heldout.json")"
  fi
done
