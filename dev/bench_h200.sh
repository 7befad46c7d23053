#!/usr/bin/env bash
# Speed measurements with `ulpgate bench` in one device call:
#   dev/bench_h200.sh BUILD_DIR OUT_DIR [parts...]
# parts (default all): attention ladder_square ladder_llm ladder_tc sweeps
#   attention      B=4 H=16 S=4096 D=128, FP16 and BF16, causal and not: the naive, online
#                  and flash kernels (every output checked against the exact reference)
#   ladder_square  the FP32 ladder and cuBLAS SGEMM (baseline) at 1024..8192 squared
#   ladder_llm     the same at the LLM shapes (4096x4096x11008, ..., 8192^3)
#   ladder_tc      the tensor-core steps next to cuBLAS of their type (FP16, BF16, TF32) at 1024..8192 squared
#   sweeps         ulpgate sweep --vary seq_kv=128:65536 for the attention kernels (cuDNN's where built), FP16 and
#                  BF16, on realistic logits: logits(std=3) (large scores) and sink(logit=16) (an
#                  attention sink)
# Raw outputs (Markdown and JSON per part) go to OUT_DIR; a summary to stdout.
source "$(dirname "$0")/parts.sh" "dev/bench_h200.sh BUILD_DIR OUT_DIR [attention ladder_square ladder_llm ladder_tc sweeps]" \
  "attention ladder_square ladder_llm ladder_tc sweeps" "$@"
u=$build/ulpgate
if has attention; then
  for dt in fp16 bf16; do
    for causal in "" --causal; do
      t0=$(now); tag=attn_${dt}${causal:+_causal}
      "$u" bench --kernel cuda.attn_flash.$dt --kernel cuda.attn_online --kernel cuda.attn_naive --dtype $dt \
        --attention 4x16x4096x4096x128 $causal --reps 20 --json "$out/$tag.json" --md "$out/$tag.md" > /dev/null 2> "$out/$tag.log"
      echo "$tag: rc $? in $(took "$t0")"; grep -E "^\| cuda" "$out/$tag.md" | cut -c1-220
    done
  done
fi
for preset in square llm; do
  has ladder_$preset || continue
  t0=$(now)
  "$u" bench --baseline cublas.fp32 --kernel ladder. --shapes $preset --reps 20 --json "$out/ladder_$preset.json" \
    --md "$out/ladder_$preset.md" > /dev/null 2> "$out/ladder_$preset.log"
  echo "ladder_$preset: rc $? in $(took "$t0")"; grep -E "^\| " "$out/ladder_$preset.md" | cut -c1-200
done
if has ladder_tc; then
  for dt in fp16 bf16 tf32; do
    t0=$(now)
    kernels="--kernel ladder.mma_$dt"; [ $dt = tf32 ] || kernels="--kernel ladder.wgmma_$dt $kernels --kernel ladder.wmma_$dt"
    "$u" bench --baseline cublas.$dt $kernels --dtype $dt --shapes square --reps 20 --json "$out/ladder_tc_$dt.json" \
      --md "$out/ladder_tc_$dt.md" > /dev/null 2> "$out/ladder_tc_$dt.log"
    echo "ladder_tc_$dt: rc $? in $(took "$t0")"; grep -E "^\| " "$out/ladder_tc_$dt.md" | cut -c1-200
  done
fi
if has sweeps; then
  for dt in fp16 bf16; do
    t0=$(now)
    cudnn=""; "$u" list 2>/dev/null | grep "cudnn.sdpa.$dt" > /dev/null && cudnn="--kernel cudnn.sdpa.$dt"  # not grep -q: pipefail
    "$u" sweep $cudnn --kernel cuda.attn_flash.$dt --kernel cuda.attn_online --kernel cuda.attn_naive --dtype $dt \
      --vary seq_kv=128:65536 --dist 'logits(std=3)' --dist 'sink(logit=16,key=0,std=1)' --seed 1 --out "$out/sweep_$dt" > "$out/sweep_$dt.log" 2>&1
    echo "sweep $dt: rc $? in $(took "$t0")"; grep -E "growth" "$out/sweep_$dt.log" | cut -c1-200
    rm -rf "$out/sweep_$dt/cases"
  done
fi
