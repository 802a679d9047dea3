#!/usr/bin/env bash
# Cross-checks our aggregators against PyPI byzfl on the same inputs (agreement + timing).
# Usage: bench/byzfl_check.sh [--n 16 --len 10000000 --f 3 --repeats 2]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/bench/venv.sh" byzfl numpy torch scipy
target="${CARGO_TARGET_DIR:-$root/target-aggregate}"
CARGO_TARGET_DIR="$target" cargo build --quiet --release -p neuroshard-aggregate --example agg_file
"$PY" "$root/bench/byzfl_check.py" --bin "$target/release/examples/agg_file" "$@"
