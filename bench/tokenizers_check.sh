#!/usr/bin/env bash
# Cross-checks our genesis tokenizer and shards with the Python `tokenizers` library.
# Usage: bench/tokenizers_check.sh [GENESIS_DIR] [CORPUS_DIR]
#   GENESIS_DIR defaults to /tmp/gen-shakespeare and is built from CORPUS_DIR when it has no
#   manifest; CORPUS_DIR defaults to ../shared/corpus/shakespeare beside the repository.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
gen="${1:-/tmp/gen-shakespeare}"
corpus="${2:-$root/../shared/corpus/shakespeare}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target-data}"
source bench/venv.sh tokenizers
tool() { cargo run -q -p neuroshard-data --example genesis_tool -- "$@"; }
if [ ! -f "$gen/manifest.json" ]; then
  tool build "$gen" "$corpus"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" bench/tokenizers_check.py samples "$corpus" "$work/samples.jsonl" 500
tool encode "$gen/tokenizer.json" "$work/samples.jsonl" "$work/rust_ids.jsonl"
"$PY" bench/tokenizers_check.py compare "$gen" "$work/samples.jsonl" "$work/rust_ids.jsonl"
