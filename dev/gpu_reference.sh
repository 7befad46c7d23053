#!/usr/bin/env bash
# The GPU exact reference's figures (docs/results/gpu_reference_h200.md) and the
# open goal, in one run on a machine with a CUDA device:
#   dev/gpu_reference.sh BUILD_DIR OUT_DIR [parts...]
# parts (default all): tests table crossover sweep probe
#   tests      test_sliced_gemm_gpu (the GPU path against the emulation and the superaccumulator)
#   table      bench_gpu_reference: M = N = 8192, K = 1024..65536, FP16/BF16/FP32, DGEMM side by side
#   crossover  the whole GEMM reference on the CPU and through the GPU, M = N = K = 128..2048
#   sweep      the six cuBLASLt kernels x normal(0,1), uniform(0,1) x K = 2^8..2^16 at M = N = 4096
#              (goal: within 127 s), a progress line per point in OUT_DIR/sweep4096.log
#   probe      ulpgate probe on every cuBLAS/cuBLASLt kernel, each with its own input type
# Raw outputs go to OUT_DIR; a summary to stdout.
source "$(dirname "$0")/parts.sh" "dev/gpu_reference.sh BUILD_DIR OUT_DIR [tests table crossover sweep probe]" "tests table crossover sweep probe" "$@"
if has tests; then
  t0=$(now); "$build/tests/references/test_sliced_gemm_gpu" > "$out/test_sliced_gemm_gpu.txt" 2>&1
  echo "tests: rc $? in $(took "$t0")"; grep -E "OK|FAILED|elements|certified" "$out/test_sliced_gemm_gpu.txt"
fi
if has table; then
  t0=$(now)
  "$build/dev/bench_gpu_reference" --formats fp16,bf16,fp32 --reps 3 --cpu-rows 64 > "$out/bench.md" 2> "$out/bench.json"
  echo "table: rc $? in $(took "$t0")"; cat "$out/bench.md"
fi
if has crossover; then
  t0=$(now)
  "$build/dev/bench_gpu_reference" --crossover 128,256,320,406,512,768,1024,2048 --reps 5 > "$out/crossover.md" 2>&1
  echo "crossover: rc $? in $(took "$t0")"; cat "$out/crossover.md"
fi
if has sweep; then
  t0=$(now)
  timeout "${SWEEP_LIMIT:-600}" "$build/ulpgate" sweep --kernel cublaslt.fp32 --kernel cublaslt.tf32 --kernel cublaslt.fp16 \
    --kernel cublaslt.bf16 --kernel cublaslt.fp8 --kernel cublaslt.fp8_fast --dist 'normal(0,1)' --dist 'uniform(0,1)' \
    --vary K=256:65536 --mn 4096 --seed 1 --out "$out/sweep4096" > "$out/sweep4096.log" 2>&1
  echo "sweep M = N = 4096: rc $? in $(took "$t0") (goal: 127 s)"; grep -c "points," "$out/sweep4096.log"
fi
if has probe; then
  t0=$(now); : > "$out/probe.txt"
  for k in cublas.fp32 cublas.tf32 cublas.fp16 cublas.bf16 cublaslt.fp32 cublaslt.tf32 cublaslt.fp16 cublaslt.bf16 \
           cublaslt.fp8 cublaslt.fp8_fast; do  # one call each: a kernel refusing the probe's case exits 2 alone
    "$build/ulpgate" probe --kernel "$k" >> "$out/probe.txt" 2>&1 || echo "  ($k: exit $?)" >> "$out/probe.txt"
  done
  echo "probe: $(took "$t0")"; cat "$out/probe.txt"
fi
