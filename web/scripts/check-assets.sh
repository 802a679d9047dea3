#!/usr/bin/env bash
# The checked-in dashboard (crates/api/dashboard, embedded in the node) must be exactly what
# `npm run build` makes from web/: rebuilds it and fails on any difference or stray file.
set -euo pipefail
cd "$(dirname "$0")/.."
npm run build --silent >/dev/null
cd ..
if ! git diff --exit-code --stat -- crates/api/dashboard ||
    [ -n "$(git status --porcelain --untracked-files=all -- crates/api/dashboard)" ]; then
    git status --short -- crates/api/dashboard
    echo "crates/api/dashboard differs from a fresh build of web/: run 'cd web && npm ci && npm run build' and commit" >&2
    exit 1
fi
echo "dashboard assets: reproduced byte for byte"
