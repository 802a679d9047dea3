#!/usr/bin/env bash
# Runs every cargo-fuzz (libFuzzer) target in fuzz/ for a bounded time and fails on any crash,
# panic, timeout or out-of-memory. Usage:
#
#   bench/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]     # default 30 s, all targets
#
# Needs `cargo install cargo-fuzz` and a C++ compiler. cargo-fuzz passes unstable rustc flags,
# so on a stable toolchain this sets RUSTC_BOOTSTRAP=1. Builds use release optimisations with
# debug assertions and overflow checks on (cargo-fuzz's default); SANITIZER (default `none`:
# the decoders are safe Rust, so AddressSanitizer mostly costs time) may be set to `address`.
# Seeds are valid messages written by `fuzz/src/bin/make_seeds.rs`; each target's corpus in
# fuzz/corpus/<target> grows across runs, crash inputs land in fuzz/artifacts/<target>.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-30}
shift || true
all=(proof_wire proof_payload ledger_op ledger_slash train_compressed data_manifest data_shard model_meta)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")
sanitizer=${SANITIZER:-none}

command -v cargo-fuzz >/dev/null || { echo "fuzz.sh: needs cargo-fuzz (cargo install cargo-fuzz)" >&2; exit 2; }
export RUSTC_BOOTSTRAP=1

cargo run --quiet --manifest-path fuzz/Cargo.toml --bin make-seeds -- fuzz/corpus

logs=$(mktemp -d)
failed=()
printf '%-18s %10s %10s %8s  %s\n' target execs exec/s seconds result
for t in "${targets[@]}"; do
  features=()
  [[ $t == model_meta ]] && features=(--features model)
  mkdir -p "fuzz/corpus/$t"
  start=$(date +%s)
  # -rss_limit_mb and -malloc_limit_mb turn an absurd allocation into a reported crash.
  if (cd fuzz && cargo fuzz run -s "$sanitizer" "${features[@]}" "$t" "corpus/$t" -- \
      -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
      -print_final_stats=1) >"$logs/$t.log" 2>&1; then
    result=ok
  else
    result=CRASH
    failed+=("$t")
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$' || echo "?")
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$' || echo "?")
  printf '%-18s %10s %10s %8s  %s\n' "$t" "$execs" "$rate" "$(( $(date +%s) - start ))" "$result"
  if [[ $result != ok ]]; then
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$logs/$t.log" | head -n 8 | sed 's/^/    /'
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: crashes in: ${failed[*]} (logs in $logs, inputs in fuzz/artifacts/)" >&2
  exit 1
fi
rm -rf "$logs"
echo "fuzz.sh: no crashes"
