#!/usr/bin/env bash
# Runs every cargo-fuzz (libFuzzer) target in fuzz/ for a fixed time each (see .ci/fuzz.sh,
# which builds, seeds and runs them). Usage:
#
#   bench/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]     # default 30 s, all targets
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
FUZZ_SECONDS=$secs exec .ci/fuzz.sh "$@"
