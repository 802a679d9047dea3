#!/usr/bin/env bash
# Creates (once) and reuses the virtualenv that every comparison script under bench/ uses.
# Usage: source bench/venv.sh PACKAGE...   (installs only what is missing)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
fi
missing=()
for pkg in "$@"; do
  mod="${pkg%%[=<>]*}"
  "$venv/bin/pip" show --quiet "$mod" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  "$venv/bin/pip" install --quiet "${missing[@]}"
fi
PY="$venv/bin/python"
export PY
