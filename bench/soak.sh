#!/usr/bin/env bash
# The chaos soak (issue 20): a swarm of real node processes, each in its own network namespace
# on shaped links (bench/links.sh), trains while `swarm --chaos` SIGKILLs a random node every
# 30–60 s and restarts it from its checkpoint, takes one node's link down for 20 s, and floods
# one node from a hostile process (raw junk TCP connections and a libp2p peer publishing junk
# gossip). At the end the swarm judges the run (training progressed, every kill recovered in
# time, no accepted ledger entry lost, all ledgers on one state hash, peak memory per node
# under the bound, the flood victim kept stepping) and writes it all to soak.json.
#
#   bench/soak.sh            # 10 minutes of chaos, 6 nodes, `home` links (root)
#
# Environment (defaults in brackets): SOAK_SECS [600] chaos window; SOAK_NODES [6];
# SOAK_STAGES [2]; SOAK_STEPS [4 × SOAK_SECS: drivers step about 3 times a second on `home`
# links, so training outlasts the window];
# SOAK_KILL [30-60] seconds between kills; SOAK_PARTITION [20] seconds; SOAK_SEED [1];
# SOAK_PROFILE [home]; SOAK_BOUNDS [recover-ms=60000,mem-mb=256,loss-drop=0.3];
# SOAK_BASELINE [1]: first train SOAK_BASELINE_STEPS [200] steps without chaos on loopback
# and on the shaped links, for tokens/s; SOAK_OUT [runs/soak]; NEUROSHARD
# [target/debug/neuroshard]; LINKEM [target/release/linkem]; LINKS_PREFIX [sk].
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${SOAK_SECS:-600}
nodes=${SOAK_NODES:-6}
stages=${SOAK_STAGES:-2}
steps=${SOAK_STEPS:-$((secs * 4))}
kill_every=${SOAK_KILL:-30-60}
partition=${SOAK_PARTITION:-20}
seed=${SOAK_SEED:-1}
profile=${SOAK_PROFILE:-home}
bounds=${SOAK_BOUNDS:-recover-ms=60000,mem-mb=256,loss-drop=0.3}
baseline=${SOAK_BASELINE:-1}
baseline_steps=${SOAK_BASELINE_STEPS:-200}
out=${SOAK_OUT:-runs/soak}
exe=${NEUROSHARD:-target/debug/neuroshard}
export LINKEM=${LINKEM:-target/release/linkem}
export LINKS_PREFIX=${LINKS_PREFIX:-sk}

[[ -x $exe ]] || { echo "soak: $exe missing: cargo build --workspace" >&2; exit 1; }
[[ -x $LINKEM ]] || { echo "soak: $LINKEM missing: cargo build --release -p neuroshard-linkem" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
# The tiny test model: six of them train on two cores beside the chaos.
tiny=(--layers 3 --d-model 64 --heads 4 --seq 32 --batch 4)
common=(--data "$out/genesis" --nodes "$nodes" --stages "$stages" "${tiny[@]}" --gen-tokens 0
    --http "")
"$exe" genesis build --synthetic --synthetic-tokens 60000 --out "$out/genesis" >/dev/null

if [[ $baseline == 1 ]]; then
    echo "soak: baseline without chaos: $baseline_steps steps on loopback, then on $profile links"
    RUST_LOG=warn "$exe" swarm "${common[@]}" --steps "$baseline_steps" --out "$out/loopback/model" \
        --summary-json "$out/loopback.json" >"$out/loopback.log" 2>&1
    RUST_LOG=warn bench/links.sh "$profile" "$nodes" "$exe" swarm "${common[@]}" \
        --steps "$baseline_steps" --out "$out/shaped/model" --summary-json "$out/shaped.json" \
        >"$out/shaped.log" 2>&1
fi

spec="secs=$secs,seed=$seed,kill=$kill_every,restart-ms=3000,partition-s=$partition,flood=on,$bounds"
echo "soak: $nodes nodes on $profile links, --chaos $spec, $steps steps per driver"
status=0
# One namespace more than nodes: the hostile process lives there.
RUST_LOG=warn bench/links.sh "$profile" $((nodes + 1)) "$exe" swarm "${common[@]}" \
    --steps "$steps" --out "$out/model" --checkpoint-secs 10 --settle-s 60 \
    --timeout-s $((secs * 2 + 300)) --chaos "$spec" --summary-json "$out/soak.json" \
    >"$out/soak.log" 2>&1 || status=$?

if [[ ! -s $out/soak.json ]]; then
    tail -n 30 "$out/soak.log" >&2
    echo "soak: FAILED: the swarm wrote no summary (exit $status); see $out/soak.log" >&2
    exit 1
fi
python3 - "$out" "$status" <<'EOF'
import json, os, sys
out, status = sys.argv[1], int(sys.argv[2])
s = json.load(open(os.path.join(out, "soak.json")))
k = s["soak"]
def tps(name):
    p = os.path.join(out, name)
    return json.load(open(p))["tokens_per_s"] if os.path.exists(p) else None
print(f"soak: {k['window_s']:.0f} s of chaos; {s['driver_steps']} driver steps in {s['train_s']:.0f} s")
print(f"  kills survived: {k['kills_recovered']} of {k['kills']}; recovery (restart to first step) "
      f"median {k['recovery_ms']['median']} ms, max {k['recovery_ms']['max']} ms")
for p in k["partitions"]:
    print(f"  partition: node {p['node']} down {p['down_ms']} ms, stepped {p['first_step_after_heal_ms']} ms after heal")
led = k["ledger"]
lost = k["checks"]["no_entry_lost"]["detail"]
print(f"  ledger: {led['accepted_seen']} entries seen accepted, {lost['lost']} lost, "
      f"missing per node {lost['missing_per_node']}; all on one state hash: {k['checks']['ledgers_agree']['ok']}")
print("  peak memory (MB): " + ", ".join(f"node {i} {m:.0f}" for i, m in k["peak_memory_mb"].items()))
f = k.get("flood")
if f:
    sent = f["sent"] or {}
    print(f"  flood on node {f['victim']} for {f['secs']} s: {sent.get('tcp_connections')} junk connections, "
          f"{(sent.get('junk_bytes') or 0) / 1e6:.1f} MB junk, {sent.get('gossip_sent')} junk gossip messages; "
          f"victim stepped {f['victim_steps_during_flood']} times, dropped {f['victim_events_dropped']} inbound events")
print(f"  tokens/s: {s['tokens_per_s']:.0f} under chaos on shaped links; without chaos: "
      f"loopback {tps('loopback.json')}, shaped {tps('shaped.json')}")
print(f"  validation loss {s['initial_val_loss']} -> {s['final_val_loss']}")
ok = k["pass"] and not s["timed_out"] and status == 0
if not ok:
    print(f"soak: FAILED: {k['failed']}, timed out: {s['timed_out']}, swarm exit {status}", file=sys.stderr)
    sys.exit(1)
print("soak: passed")
EOF
