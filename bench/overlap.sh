#!/usr/bin/env bash
# Throughput of the pipeline with and without overlapped steps (`--weight-lag 0|1`), against
# one process on the same machine in the same run: `train` first and last, then a swarm per
# (profile, lag, activations). Profiles other than `none` run every node in its own network
# namespace through bench/links.sh (root). Not part of CI.
#
#   bench/overlap.sh OUT NODES STAGES STEPS "PROFILE…" "LAG…" "ACTIVATIONS…" [swarm flags…]
#
# e.g. bench/overlap.sh runs/overlap 4 2 60 "none home" "0 1" "int8/int4" --threads 1
# Prints one line per run and writes OUT/table.md. Environment: BIN (default
# target/release/neuroshard), DATA (a genesis; default the built-in synthetic corpus),
# TRAIN_THREADS (threads of the one-process baseline, default: all cores).
set -euo pipefail

if [[ $# -lt 7 ]]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
out=$1 nodes=$2 stages=$3 steps=$4 profiles=$5 lags=$6 schemes=$7
shift 7
bin=${BIN:-target/release/neuroshard}
data=()
[[ -n ${DATA:-} ]] && data=(--data "$DATA")
threads=${TRAIN_THREADS:-$(nproc)}
mkdir -p "$out"

baseline() {
    "$bin" train "${data[@]}" --steps "$steps" --threads "$threads" --eval-every 0 \
        --eval-windows 8 --out "$out/train-$1" 2>/dev/null |
        sed -n 's/.*(\([0-9.]*\) tokens\/s.*/\1/p'
}

before=$(baseline before)
echo "one process (before): $before tokens/s"
table="$out/table.md"
{
    echo "| profile | weight lag | activations | tokens/s | × one process | engine busy per stage | bytes per driver step |"
    echo "|---|---|---|---|---|---|---|"
} >"$table"
for profile in $profiles; do
    for lag in $lags; do
        for scheme in $schemes; do
            name="$profile-lag$lag-${scheme//\//-}"
            cmd=("$bin" swarm "${data[@]}" --nodes "$nodes" --stages "$stages" --steps "$steps"
                --weight-lag "$lag" --activations "$scheme" --http "" --gen-tokens 0
                --out "$out/$name" --summary-json "$out/$name.json" "$@")
            if [[ $profile == none ]]; then
                "${cmd[@]}" >"$out/$name.log" 2>&1
            else
                bench/links.sh "$profile" "$nodes" "${cmd[@]}" >"$out/$name.log" 2>&1
            fi
            python3 - "$out/$name.json" "$before" "$profile" "$lag" "$scheme" >>"$table" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
tps, base = s["tokens_per_s"], float(sys.argv[2])
busy = " / ".join(f"{100 * v:.0f}%" for _, v in sorted(s["utilization"]["per_stage"].items()))
b = s.get("bytes_sent_per_driver_step") or 0
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {tps:.0f} | {tps / base:.2f} | {busy} | {b:,.0f} |")
EOF
            tail -1 "$table"
        done
    done
done
after=$(baseline after)
echo "one process (after): $after tokens/s"
echo "one process: $before tokens/s before, $after after" >>"$table"
