#!/usr/bin/env bash
# Export a small trained NeuroLLM to a Hugging Face folder, load it with transformers and compare
# logits with ours (goal: max abs diff <= 1e-4).  Usage: bench/hf_compare.sh [workdir]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$root/runs/hf-compare}"
cd "$root"
source bench/venv.sh torch transformers safetensors numpy
cargo build --release -q -p neuroshard
bin="$root/target/release/neuroshard"
# Start clean: genesis build refuses to overwrite an existing dataset.
rm -rf "$work/genesis" "$work/model" "$work/hf"
mkdir -p "$work"
"$bin" genesis build --synthetic --out "$work/genesis" >/dev/null
# A grouped-query model so the export exercises the kv-head layout too.
"$bin" train --data "$work/genesis" --steps 30 --out "$work/model" --seq 64 --batch 4 \
  --layers 2 --d-model 128 --heads 4 --kv-heads 2 --eval-every 0 >/dev/null
"$bin" export --checkpoint "$work/model" --out "$work/hf"
tokens=$("$PY" -c "import random; random.seed(1); print(','.join(str(random.randrange(300)) for _ in range(48)))")
"$bin" logits --checkpoint "$work/model" --tokens "$tokens" > "$work/ours.json"
"$PY" bench/hf_compare.py "$work/hf" "$work/ours.json"
