#!/usr/bin/env bash
# The split-KV combine on a GPU machine in one device call:
#   dev/combine_h200.sh BUILD_DIR OUT_DIR [parts...]
# parts (default all): tests fuzz sanitize bench
#   tests     test_attention_combine_gpu: cuda.attn_combine.* against the CPU model
#   fuzz      the default campaign of cuda.attn_combine.fp32, .fp16 and .bf16 (seed 1, or COMBINE_SEEDS)
#   sanitize  compute-sanitizer memcheck over a small campaign (empty splits, 129 splits, odd head sizes)
#   bench     decode shapes, B=64 H=32 D=128: one query with 16 and 64 splits, four queries with 16
#             (`ulpgate bench --combine`, outputs not checked at that size: `fuzz` checks them)
# Raw outputs go to OUT_DIR; a summary to stdout.
source "$(dirname "$0")/parts.sh" "dev/combine_h200.sh BUILD_DIR OUT_DIR [tests fuzz sanitize bench]" \
  "tests fuzz sanitize bench" "$@"
u=$build/ulpgate
kernels="--kernel cuda.attn_combine.fp32 --kernel cuda.attn_combine.fp16 --kernel cuda.attn_combine.bf16"
if has tests; then
  t0=$(now)
  "$build"/tests/kernels/test_attention_combine_gpu > "$out/test_attention_combine_gpu.log" 2>&1
  echo "test_attention_combine_gpu: rc $? in $(took "$t0")"
  grep -E "^\[ *(OK|FAILED|PASSED|SKIPPED)|Failure" "$out/test_attention_combine_gpu.log" | cut -c1-220 | head -20
fi
if has fuzz; then
  for seed in ${COMBINE_SEEDS:-1}; do
    t0=$(now)
    $u fuzz $kernels --seed "$seed" --no-html --out "$out/fuzz_$seed" > "$out/fuzz_$seed.log" 2>&1
    echo "fuzz seed $seed: rc $? in $(took "$t0")"; grep -E "FAIL|cases," "$out/fuzz_$seed.log" | cut -c1-250 | head -12
  done
fi
if has sanitize && command -v compute-sanitizer > /dev/null; then
  t0=$(now)
  compute-sanitizer --tool memcheck --print-limit 5 $u fuzz $kernels --cases 8 --seed 2 --in-process --no-html \
    --out "$out/sanitize" > "$out/sanitize.log" 2>&1
  echo "compute-sanitizer memcheck: rc $? in $(took "$t0")"; grep -E "ERROR SUMMARY|cases," "$out/sanitize.log" | head -5
fi
if has bench; then
  t0=$(now)
  $u bench --kernel cuda.attn_combine.fp32 --combine 64x32x1x128x16 --combine 64x32x1x128x64 \
    --combine 64x32x4x128x16 --reps 25 --no-check --json "$out/bench.json" --md "$out/bench.md" > /dev/null 2> "$out/bench.log"
  echo "bench: rc $? in $(took "$t0")"; grep -E "^\| (cuda|kernel)" "$out/bench.md" | cut -c1-220
fi
