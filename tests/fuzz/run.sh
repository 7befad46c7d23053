#!/usr/bin/env bash
# Runs every harness of a fuzz build directory from the checked-in seeds, one after another:
#   tests/fuzz/run.sh BUILD_DIR [libFuzzer flags...]
#   tests/fuzz/run.sh build-fuzz -max_total_time=12          (CI: ctest -L fuzz)
#   tests/fuzz/run.sh build-fuzz -runs=10000000              (docs/results/fuzzers.md)
# FUZZERS="case spec" picks harnesses. New corpus entries go to BUILD_DIR/fuzz-corpus/H,
# reproducers to BUILD_DIR/fuzz-artifacts/H/, the log to BUILD_DIR/fuzz-logs/H.log.
# Exit status 1 when any harness reported a crash, hang, leak or UB.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: tests/fuzz/run.sh BUILD_DIR [libFuzzer flags...]" >&2; exit 2; }
build=$(cd "$1" && pwd); shift
src=$(cd "$(dirname "$0")/../.." && pwd)
status=0
for h in ${FUZZERS:-case spec record baseline journal dots npy}; do
  seeds=("$src/tests/fuzz/corpus/$h")
  [ "$h" = case ] && seeds+=("$src/tests/data")
  mkdir -p "$build/fuzz-corpus/$h" "$build/fuzz-artifacts/$h" "$build/fuzz-logs"
  log="$build/fuzz-logs/$h.log"
  start=$(date +%s)
  "$build/tests/fuzz/fuzz_$h" "$build/fuzz-corpus/$h" "${seeds[@]}" -max_len=4096 -timeout=60 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$h/" "$@" >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  found=$(grep -m1 -oE 'ERROR: libFuzzer: [a-z -]+|ERROR: AddressSanitizer: [a-z-]+|ERROR: LeakSanitizer: [a-z ]+|runtime error: .*|ulpgate fuzz finding: .*' "$log")
  printf 'fuzz_%-9s %10s runs %7s/s %5ss  %s\n' "$h" "${runs:-?}" "${rate:-?}" "$(( $(date +%s) - start ))" \
    "$([ $rc -eq 0 ] && echo ok || echo "FINDING (exit $rc): ${found:-see $log}")"
  [ $rc -eq 0 ] || { status=1; ls "$build/fuzz-artifacts/$h/"; }
done
exit $status
