#!/usr/bin/env bash
# CI: builds every cargo-fuzz (libFuzzer) target in fuzz/ once, writes the seed corpus, runs
# each target for a bounded time and fails on any crash, panic, timeout or out-of-memory.
#
#   .ci/fuzz.sh [TARGET ...]            # all targets by default
#
# FUZZ_BUDGET (default 600 s) bounds the whole script, build included: what the build leaves
# is split evenly across the targets, with a floor of FUZZ_MIN_SECONDS (default 10 s) each, so
# a cold build (about 30 min on 2 cores: burn, libp2p, arrow) overruns the budget by the
# floors only. Keep fuzz/target between runs to stay inside it. FUZZ_SECONDS, if set, is the
# time per target instead. Each target's corpus in fuzz/corpus/<target> grows across runs;
# crash inputs land in fuzz/artifacts/<target>/ (replay: the target binary with the file).
#
# FUZZ_PROFILE=dev builds without optimisation: about 10 minutes cold instead of 30, at a
# few times fewer executions per second. CI uses it (see .ci/run).
#
# Needs cargo-fuzz and a nightly toolchain (or RUSTC_BOOTSTRAP=1 on stable, set here when no
# nightly is installed). No sanitizer by default (SANITIZER=address to add one): the decoders
# are safe Rust, so AddressSanitizer mostly costs executions; debug assertions and overflow
# checks are on in these builds (cargo-fuzz's default).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
budget=${FUZZ_BUDGET:-600}
floor=${FUZZ_MIN_SECONDS:-10}
sanitizer=${SANITIZER:-none}
all=(proof_wire proof_payload ledger_op train_compressed data_manifest data_shard
  model_meta net_frame node_wire node_sync node_records ledger_sync replica_state audit_evidence finality_wire)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")

command -v cargo-fuzz >/dev/null || { echo "fuzz.sh: needs cargo-fuzz (cargo install cargo-fuzz)" >&2; exit 2; }
toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
else
  export RUSTC_BOOTSTRAP=1
fi

profile=()
bin=fuzz/target/x86_64-unknown-linux-gnu/release
if [[ ${FUZZ_PROFILE:-release} == dev ]]; then
  profile=(--dev)
  bin=fuzz/target/x86_64-unknown-linux-gnu/debug
fi
# One build of every target (and of the seed writer) with every feature.
(cd fuzz && cargo "${toolchain[@]}" fuzz build "${profile[@]}" -s "$sanitizer" --features node)
# libFuzzer's notes about sanitizer hooks a build without a sanitizer lacks are noise here.
"$bin/make-seeds" fuzz/corpus 2> >(grep -v '^WARNING: Failed to find function' >&2)

if [[ -n ${FUZZ_SECONDS:-} ]]; then
  secs=$FUZZ_SECONDS
else
  left=$(( budget - ($(date +%s) - start) ))
  # Less a second each for libFuzzer's start-up and final report.
  secs=$(( left / ${#targets[@]} - 1 ))
  if (( secs < floor )); then secs=$floor; fi
fi
echo "fuzz.sh: ${#targets[@]} targets, ${secs} s each (build took $(( $(date +%s) - start )) s)"

logs=$(mktemp -d)
failed=()
printf '%-18s %12s %10s %8s  %s\n' target execs exec/s seconds result
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  t0=$(date +%s)
  # -rss_limit_mb and -malloc_limit_mb turn an absurd allocation into a reported crash.
  if "$bin/$t" "fuzz/corpus/$t" -artifact_prefix="fuzz/artifacts/$t/" \
      -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
      -print_final_stats=1 >"$logs/$t.log" 2>&1; then
    result=ok
  else
    result=CRASH
    failed+=("$t")
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$' || echo "?")
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$' || echo "?")
  printf '%-18s %12s %10s %8s  %s\n' "$t" "$execs" "$rate" "$(( $(date +%s) - t0 ))" "$result"
  if [[ $result != ok ]]; then
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$logs/$t.log" | head -n 8 | sed 's/^/    /'
  fi
done

echo "fuzz.sh: $(( $(date +%s) - start )) s in all"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: crashes in: ${failed[*]} (logs in $logs, inputs in fuzz/artifacts/)" >&2
  exit 1
fi
rm -rf "$logs"
echo "fuzz.sh: no crashes"
