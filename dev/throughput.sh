#!/usr/bin/env bash
# The throughput table of docs/results/throughput_h200.md, measured in one run:
#   dev/throughput.sh BUILD_DIR OUT_DIR [parts...]
# parts (default all): pytorch modes sweep reference breakdown
#   pytorch    examples/pytorch/pytorch_loop.py for PYTORCH_SECONDS (10), where torch and a GPU are
#   modes      ulpgate fuzz on KERNEL (cublas.bf16 with a GPU, else cpu.fp32_seq), bf16, CASES
#              (1000) cases, --max-k 256, --sizes SIZES (default small: the shapes of the PyTorch
#              loop; realistic adds the large regime): default (isolated, relations, a worker per core),
#              --jobs 1, --in-process, --in-process --no-metamorphic; cases/s = cases / wall
#              seconds of the whole command (start, workers, report included)
#   sweep      the six cuBLASLt kernels x normal(0,1), uniform(0,1) x K = 2^8..2^16, M = N = 128
#   reference  bench_references: ns/term (one thread) against the MPFR oracle; the GEMM reference
#              at 1024^3 on 1 thread and all cores, 4096^3 and 8192^3 on all cores
#   breakdown  bench_check: each phase of the check path on KERNEL's first 200 cases
# Raw outputs go to OUT_DIR; the table (Markdown) to stdout and OUT_DIR/table.md.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: dev/throughput.sh BUILD_DIR OUT_DIR [pytorch modes sweep reference breakdown]" >&2; exit 2; }
build=$(cd "$1" && pwd); out=$2; shift 2
mkdir -p "$out"; out=$(cd "$out" && pwd)
parts=${*:-pytorch modes sweep reference breakdown}
# bench_references and bench_check are not in the default build.
cmake --build "$build" --target lab > "$out/build-lab.log" 2>&1 || { echo "building the lab programs failed: $out/build-lab.log" >&2; exit 1; }
src=$(cd "$(dirname "$0")/.." && pwd)
ulp=$build/ulpgate
gpu=0; nvidia-smi -L > /dev/null 2>&1 && gpu=1
kernel=${KERNEL:-$([ $gpu = 1 ] && echo cublas.bf16 || echo cpu.fp32_seq)}
cases=${CASES:-1000}
table=$out/table.md
now() { date +%s.%N; }
row() { echo "$*" | tee -a "$table"; }
: > "$table"
row "| what | figure | notes |"
row "|---|---|---|"

has() { [[ " $parts " == *" $1 "* ]]; }

if has pytorch && [ $gpu = 1 ] && python3 -c "import torch" 2> /dev/null; then
  python3 "$src/examples/pytorch/pytorch_loop.py" --seconds "${PYTORCH_SECONDS:-10}" > "$out/pytorch.json" 2> "$out/pytorch.err"
  row "| PyTorch loop (bf16, M,N,K <= 256, FP64 reference, assert_close) | $(python3 -c "import json;d=json.load(open('$out/pytorch.json'));print(f\"{d['cases_per_s']:,.0f} cases/s\")") | $(python3 -c "import json;d=json.load(open('$out/pytorch.json'));print(f\"{d['false_alarms']} false alarms in {d['cases']} cases\")") |"
fi

if has modes; then
  i=0
  for mode in "" "--jobs 1" "--in-process" "--in-process --no-metamorphic"; do
    i=$((i + 1))
    t0=$(now)
    "$ulp" fuzz --kernel "$kernel" --dtype bf16 --cases "$cases" --max-k 256 --sizes "${SIZES:-small}" --time 0 --no-html \
      --allow-partial --out "$out/fuzz$i" $mode > "$out/fuzz$i.log" 2>&1
    rc=$?
    t1=$(now)
    summary=$(grep -m1 -E '^[0-9]+ cases, [0-9]+ failed' "$out/fuzz$i.log")
    rate=$(awk -v c="$cases" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", c / (b - a) }')
    campaign=$(sed -n 's/^throughput: .*s, \([0-9]*\) cases\/s (.*awaited \([0-9]*%\).*/\1 cases\/s in the campaign, results awaited \2/p' "$out/fuzz$i.log")
    row "| ulpgate fuzz $kernel bf16 --sizes ${SIZES:-small} ${mode:-(default: isolated, relations, --jobs per core)} | $rate cases/s | exit $rc; $summary; $campaign |"
  done
fi

if has sweep && [ $gpu = 1 ]; then
  t0=$(now)
  "$ulp" sweep --kernel cublaslt.fp32 --kernel cublaslt.tf32 --kernel cublaslt.fp16 --kernel cublaslt.bf16 \
    --kernel cublaslt.fp8 --kernel cublaslt.fp8_fast --dist 'normal(0,1)' --dist 'uniform(0,1)' --vary K=256:65536 \
    --mn 128 --seed 1 --out "$out/sweep" > "$out/sweep.log" 2>&1
  rc=$?
  t1=$(now)
  row "| sweep: 6 cuBLASLt kernels x 2 dists x K = 2^8..2^16, M = N = 128 | $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f s", b - a }') | exit $rc (failures are findings, see sweep.log) |"
fi

if has reference; then
  "$build/dev/bench_references" --benchmark_filter="${REFERENCE_FILTER:-.}" --benchmark_format=json --benchmark_out="$out/references.json" \
    --benchmark_out_format=json > "$out/references.txt" 2>&1
  python3 - "$out/references.json" << 'PY' | tee -a "$table"
import json, sys
runs = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
def ns(name): return runs[name]["ns_per_term"]
for k in (256, 4096, 65536):
    o, f = ns(f"BM_OracleDot/{k}"), ns(f"BM_FastDot/{k}")
    simd = ("scalar", "AVX2", "AVX-512")[int(runs[f"BM_FastDot/{k}"].get("simd", 0))]
    print(f"| exact dot, K = {k}, one thread ({simd}) | {f:.2f} ns/term | MPFR oracle {o:.1f} ns/term: {o / f:.0f}x |")
    if f"BM_FastDotKnownRanges/{k}" in runs:
        g = ns(f"BM_FastDotKnownRanges/{k}")
        print(f"| exact dot as in the GEMM reference (exponent ranges known), K = {k} | {g:.2f} ns/term | {o / g:.0f}x the oracle |")
one = ns("BM_GemmReference/1024/1/iterations:3/real_time")
for size, name in ((1024, "BM_GemmReference/1024/0/iterations:3/real_time"), (4096, "BM_GemmReference/4096/0/iterations:1/real_time"),
                   (8192, "BM_GemmReference/8192/0/iterations:1/real_time")):
    if name not in runs: continue
    r = runs[name]
    print(f"| GEMM reference {size}^3, {r['threads']:.0f} threads | {r['real_time'] / 1e3:.2f} s | {ns(name):.2f} ns/term per core; "
          f"parallel efficiency {one / ns(name) * 100:.0f}% (1 thread at 1024^3: {one:.2f} ns/term) |")
PY
  tail -n +1 "$table" | grep -E "exact dot|GEMM reference" > /dev/null || echo "(bench_references failed: see $out/references.txt)"
fi

if has breakdown; then
  ULPGATE_BENCH_KERNEL=$kernel "$build/tests/campaign/bench_check" --benchmark_min_time=1 > "$out/breakdown.txt" 2>&1
  echo; echo "check-path breakdown ($kernel, bf16, first 200 cases): $out/breakdown.txt"
  grep -E "^BM_" "$out/breakdown.txt" | awk '{ printf "  %-36s %s/s\n", $1, $NF }' | sed 's/items_per_second=//; s|/s/s|/s|'
fi
