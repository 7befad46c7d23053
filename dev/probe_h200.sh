#!/usr/bin/env bash
# The accumulation probe's H200 measurements in one call (docs/results/probe_h200.md):
#   dev/probe_h200.sh BUILD_DIR OUT_DIR [parts...]
# parts (default all): tests instructions kernels dumps sweep campaign
#   tests         test_mma_unit_gpu (fragments; the f16/bf16/tf32 models on 100,000 dot products)
#   instructions  ulpgate probe --instruction on every mma.sync, 10^6 dot products each (JSON too),
#                 then every wgmma (10^5 each, with dumps of 20,000 for offline fitting)
#   kernels       ulpgate probe --kernel on the cuBLASLt tensor-core kernels at M = N = 256
#   dumps         random dot products and the unit's results for offline model fitting
#                 (ulpgate probe --dump): the FP8 and FP16-accumulating instructions, cuBLASLt BF16/FP8 kernels
#   sweep         the FP8 kernels' sweeps with the declared arithmetic and fitted effective bits
#                 (M = N = 128, K = 2^8..2^16, two distributions): spread across K per series
#   campaign      the default fuzz campaign (every kernel here), exit code and failures
# Raw outputs go to OUT_DIR; a summary to stdout.
source "$(dirname "$0")/parts.sh" "dev/probe_h200.sh BUILD_DIR OUT_DIR [tests instructions kernels dumps sweep campaign]" "tests instructions kernels dumps sweep campaign" "$@"
if has tests; then
  t0=$(now); "$build/tests/kernels/test_mma_unit_gpu" > "$out/test_mma_unit_gpu.txt" 2>&1
  echo "tests: rc $? in $(took "$t0")"; grep -E "agree|OK|FAILED" "$out/test_mma_unit_gpu.txt" | cut -c1-240
fi
if has instructions; then
  t0=$(now)
  "$build/ulpgate" probe --instruction mma.f16 --instruction mma.bf16 --instruction mma.tf32 --instruction mma.e4m3 \
    --instruction mma.e5m2 --instruction mma.f16.f16acc --json "$out/mma_models.json" > "$out/probe_mma.txt" 2>&1
  echo "instructions: rc $? in $(took "$t0")"; cut -c1-300 "$out/probe_mma.txt"
  t0=$(now)
  "$build/ulpgate" probe --instruction wgmma.f16 --instruction wgmma.bf16 --instruction wgmma.tf32 --instruction wgmma.e4m3 \
    --instruction wgmma.e5m2 --validate 100000 --json "$out/wgmma_models.json" --dump "$out/dumps" > "$out/probe_wgmma.txt" 2>&1
  echo "wgmma: rc $? in $(took "$t0")"; cut -c1-300 "$out/probe_wgmma.txt"
fi
if has kernels; then
  t0=$(now); : > "$out/probe_kernels.txt"
  for k in cublas.fp16 cublas.bf16 cublas.tf32 cublaslt.fp16 cublaslt.bf16 cublaslt.tf32 cublaslt.fp8 cublaslt.fp8_fast; do
    "$build/ulpgate" probe --kernel "$k" --mn 256 --validate 2000 --json "$out/probe_$k.json" >> "$out/probe_kernels.txt" 2>&1 \
      || echo "  ($k: exit $?)" >> "$out/probe_kernels.txt"
  done
  echo "kernels: $(took "$t0")"; cut -c1-300 "$out/probe_kernels.txt"
fi
if has dumps; then
  t0=$(now)
  "$build/ulpgate" probe --instruction mma.e4m3 --instruction mma.e5m2 --instruction mma.f16.f16acc --validate 0 \
    --dump "$out/dumps" > "$out/dumps.txt" 2>&1
  for k in cublaslt.bf16 cublaslt.fp8 cublaslt.fp8_fast; do
    "$build/ulpgate" probe --kernel "$k" --mn 256 --validate 0 --dump "$out/dumps" >> "$out/dumps.txt" 2>&1
  done
  echo "dumps: $(took "$t0")"; grep written "$out/dumps.txt"
fi
if has sweep; then
  t0=$(now)
  "$build/ulpgate" sweep --kernel cublaslt.fp8 --kernel cublaslt.fp8_fast --dist 'normal(0,1)' --dist 'uniform(0,1)' \
    --vary K=256:65536 --mn 128 --seed 1 --out "$out/sweep_fp8" > "$out/sweep_fp8.log" 2>&1
  echo "sweep: rc $? in $(took "$t0")"; grep -E "growth|FAIL" "$out/sweep_fp8.log" | cut -c1-240
  rm -rf "$out/sweep_fp8/cases"
fi
if has campaign; then
  t0=$(now)
  "$build/ulpgate" fuzz --seed 1 --no-html --out "$out/campaign" > "$out/campaign.log" 2>&1
  echo "campaign: rc $? in $(took "$t0")"; tail -4 "$out/campaign.log"; grep -E "^- .*FAIL|failed" "$out/campaign/report.md" | head -20
  rm -rf "$out/campaign/cases"
fi
