#!/usr/bin/env bash
# One training step of the same model in NeuroShard (burn-flex) and PyTorch CPU, at 1 and 2
# threads, and the ratio of tokens/s.  Usage: bench/compare_step.sh [extra bench-step flags]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
source bench/venv.sh torch numpy
cargo build --release -q -p neuroshard
bin="$root/target/release/neuroshard"
for t in ${THREADS:-1 2}; do
  ours=$("$bin" bench step --threads "$t" --json "$@")
  theirs=$("$PY" bench/torch_step.py --threads "$t" "$@")
  echo "threads=$t neuroshard: $ours"
  echo "threads=$t pytorch:    $theirs"
  "$PY" - "$ours" "$theirs" <<'PYEOF'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"threads={a['threads']}: neuroshard {a['tokens_per_s']:.0f} tok/s, "
      f"pytorch {b['tokens_per_s']:.0f} tok/s, ratio {a['tokens_per_s'] / b['tokens_per_s']:.2f}x")
PYEOF
done
