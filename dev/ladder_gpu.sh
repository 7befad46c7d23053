#!/usr/bin/env bash
# The GEMM ladder's kernels (ladder.*) on a machine with a CUDA device:
#   dev/ladder_gpu.sh BUILD_DIR OUT_DIR [parts...]
# parts (default: tests fuzz timing):
#   tests     tests/kernels/test_ladder_gpu (every ladder kernel through the check path, steps
#             1-7 bit for bit equal to cpu.fp32_seq, misaligned buffers)
#   fuzz      ulpgate fuzz on every ladder.* kernel, 100 cases each, seed 1, no time budget
#             (--time 0: all cases run), record and reports in OUT_DIR/fuzz (--no-html: the
#             machine may lack gnuplot; `ulpgate report OUT_DIR/fuzz/fuzz.json --html F` later)
#   timing    ulpgate bench: each FP32 SIMT step beside cuBLAS SGEMM at 4096^3, median of 20
#             runs after 3 warm-up runs, L2 evicted before each, every output checked
#             (OUT_DIR/timing.md; the tensor-core steps: dev/bench_h200.sh ladder_tc)
#   sanitize  compute-sanitizer memcheck and racecheck on the GPU test's smaller tests
# Raw outputs go to OUT_DIR, a summary to stdout; exit 1 if a part failed.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: dev/ladder_gpu.sh BUILD_DIR OUT_DIR [tests fuzz timing sanitize]" >&2; exit 2; }
build=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
out=$(cd "$2" && pwd)
shift 2
parts=${*:-tests fuzz timing}
has() { [[ " $parts " == *" $1 "* ]]; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
status=0
test_bin=$build/tests/kernels/test_ladder_gpu
if has tests; then
  t0=$(now)
  "$test_bin" > "$out/test_ladder_gpu.txt" 2>&1
  rc=$?
  echo "tests: rc $rc in $(took "$t0")"
  grep -E "^\[ (device|ladder) \]|OK \]|FAILED|SKIPPED" "$out/test_ladder_gpu.txt"
  [ $rc -eq 0 ] || status=1
fi
if has fuzz; then
  # --kernel takes exact names (repeatable), so the ladder's are read from `ulpgate list`.
  kernels=$("$build/ulpgate" list | awk '$1 ~ /^ladder\./ { printf " --kernel %s", $1 }')
  if [ -z "$kernels" ]; then
    echo "fuzz: no ladder.* kernels here (they need a CUDA device)"; status=1
  else
    t0=$(now)
    rm -rf "$out/fuzz"  # a fresh campaign (an earlier unfinished journal would be refused)
    # shellcheck disable=SC2086
    "$build/ulpgate" fuzz $kernels --cases 100 --seed 1 --time 0 --no-html --out "$out/fuzz" > "$out/fuzz.log" 2>&1
    rc=$?
    echo "fuzz: rc $rc in $(took "$t0"), $(grep -m1 -E '^[0-9]+ cases, [0-9]+ failed' "$out/fuzz.log")"
    [ $rc -eq 0 ] || status=1
  fi
fi
if has timing; then
  t0=$(now)
  simt=$("$build/ulpgate" list | awk '$1 ~ /^ladder\.fp32_/ { printf " --kernel %s", $1 }')
  # shellcheck disable=SC2086
  "$build/ulpgate" bench --baseline cublas.fp32 $simt --gemm 4096x4096x4096 --reps 20 --warmup 3 \
    --md "$out/timing.md" > "$out/timing.log" 2>&1
  rc=$?
  echo "timing: rc $rc in $(took "$t0")"; cat "$out/timing.md"
  [ $rc -eq 0 ] || status=1
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    filter='LadderGpu.MisalignedBuffersTakeTheScalarPath'
    [ $tool = memcheck ] && filter="$filter:LadderGpu.InOrderStepsEqualTheSequentialModelBitForBit"
    t0=$(now)
    compute-sanitizer --tool $tool --error-exitcode 97 "$test_bin" --gtest_filter="$filter" > "$out/$tool.log" 2>&1
    rc=$?
    echo "$tool: rc $rc in $(took "$t0"), $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.log" | tail -1)"
    [ $rc -eq 0 ] || status=1
  done
fi
exit $status
