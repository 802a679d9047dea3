#!/usr/bin/env bash
# One training step of the same model in NeuroShard (burn-flex) and PyTorch CPU, at 1 and 2
# threads, and the ratio of tokens/s.
#
# Usage: bench/compare_step.sh [extra flags for both, e.g. --steps 31]
#   THREADS="1 2"  thread counts to compare
#   ROUNDS=3       alternating runs of each engine per thread count; on a shared, noisy machine
#                  the median over rounds of each run's median step time is what is compared
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
source bench/venv.sh torch numpy
cargo build --release -q -p neuroshard
bin="$root/target/release/neuroshard"
rounds="${ROUNDS:-3}"
for t in ${THREADS:-1 2}; do
  runs=()
  for _ in $(seq "$rounds"); do
    ours=$("$bin" bench step --threads "$t" --json "$@")
    theirs=$("$PY" bench/torch_step.py --threads "$t" "$@")
    echo "threads=$t neuroshard: $ours"
    echo "threads=$t pytorch:    $theirs"
    runs+=("$ours" "$theirs")
  done
  "$PY" - "${runs[@]}" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(a) for a in sys.argv[1:]]
ours, theirs = runs[0::2], runs[1::2]
tok = ours[0]["tokens_per_step"]
med = lambda rs: statistics.median(r["median_step_s"] for r in rs)
a, b = tok / med(ours), tok / med(theirs)
per_round = ", ".join("%.2f" % (y["median_step_s"] / x["median_step_s"]) for x, y in zip(ours, theirs))
print(f"threads={ours[0]['threads']} over {len(ours)} alternating rounds: "
      f"neuroshard {a:.0f} tok/s, pytorch {b:.0f} tok/s, ratio {a / b:.2f}x (per round: {per_round})")
PYEOF
done
