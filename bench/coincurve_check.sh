#!/usr/bin/env bash
# Cross-check our secp256k1 signatures with libsecp256k1 through PyPI coincurve.
# Usage: bench/coincurve_check.sh   (from the repository root; reuses bench/.venv)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-proof}"
if [ ! -x bench/.venv/bin/python ]; then
    python3 -m venv bench/.venv
fi
bench/.venv/bin/pip install --quiet coincurve
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# CARGO_PROFILE=release reuses an existing release build instead of building debug.
profile="${CARGO_PROFILE:-dev}"
cargo build --quiet --profile "$profile" -p neuroshard-proof --example vectors
dir=debug
[ "$profile" = dev ] || dir="$profile"
vectors="$CARGO_TARGET_DIR/$dir/examples/vectors"
"$vectors" emit 256 > "$work/rust.jsonl"
bench/.venv/bin/python bench/coincurve_check.py "$work/rust.jsonl" "$work/py.jsonl"
"$vectors" verify "$work/py.jsonl"
echo "coincurve $(bench/.venv/bin/python -c 'import coincurve, importlib.metadata as m; print(m.version("coincurve"))')"
