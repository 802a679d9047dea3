#!/usr/bin/env bash
# Streams completions from a running node's API with the official `openai` client (PyPI).
# Usage: bench/openai_stream.sh BASE_URL [ARGS...]   (see bench/openai_stream.py)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/bench/venv.sh" openai
exec "$PY" "$root/bench/openai_stream.py" "$@"
