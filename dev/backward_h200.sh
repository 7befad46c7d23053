#!/usr/bin/env bash
# Attention backward on a GPU machine in one device call:
#   dev/backward_h200.sh BUILD_DIR OUT_DIR [parts...]
# parts (default all): tests speed lab campaign
#   tests     the GPU tests of the attention kernels (ours and cuDNN's, forward and backward)
#   speed     B=4 H=16 S=4096 D=128, FP16 and BF16, causal and not: `ulpgate bench --backward`
#             with our flash backward and cuDNN's in the same run, O and LSE from our flash forward (outputs not checked: the
#             exact backward at that size is out of the CPU's reach; `tests` checks them)
#   lab       dev/bench_attention_backward (ours, .det too, the tilings and dQ atomics side by side) and dev/bench_sdpa_backward.py
#             (PyTorch's cuDNN and flash backends) when python3 has torch
#   campaign  the default fuzz campaign of every GPU backward kernel (seeds 1-3, or BWD_SEEDS), and chained
#             forward + backward checks (our flash forward into our backward, cuDNN's into cuDNN's)
#   sanitize  compute-sanitizer memcheck and racecheck over the flash backward's variants at a
#             small ragged shape (B=1 H=2 S=200 D=128: partial key and query blocks)
# Raw outputs go to OUT_DIR; a summary to stdout.
source "$(dirname "$0")/parts.sh" "dev/backward_h200.sh BUILD_DIR OUT_DIR [tests speed lab campaign sanitize]" \
  "tests speed lab campaign sanitize" "$@"
u=$build/ulpgate
cudnn_bwd() { "$u" list 2>/dev/null | grep -o "cudnn\.sdpa_bwd\.$1[a-z.]*" | sort -u; }  # not grep -q: pipefail
if has tests; then
  for t in test_attention_backward_gpu test_attention_gpu; do
    t0=$(now)
    "$build"/tests/kernels/$t > "$out/$t.log" 2>&1
    echo "$t: rc $? in $(took "$t0")"
    grep -E "^\[ *(cudnn|bwd|det|OK|FAILED|PASSED|SKIPPED)|Failure" "$out/$t.log" | cut -c1-220 | head -60
  done
fi
if has speed; then
  for dt in fp16 bf16; do
    for mask in ${BWD_MASKS:-plain causal}; do  # BWD_MASKS=plain: non-causal only
      causal=""; [ "$mask" = causal ] && causal=--causal
      t0=$(now); tag=bwd_${dt}${causal:+_causal}
      kernels="--kernel cuda.attn_bwd_flash.$dt"
      for k in $(cudnn_bwd $dt); do kernels="$kernels --kernel $k"; done
      "$u" bench --backward $kernels --forward-kernel cuda.attn_flash.$dt --dtype $dt --attention 4x16x4096x4096x128 $causal --reps 25 --no-check \
        --json "$out/$tag.json" --md "$out/$tag.md" > /dev/null 2> "$out/$tag.log"
      echo "$tag: rc $? in $(took "$t0")"; grep -E "^\| (cuda|cudnn)" "$out/$tag.md" | cut -c1-220
    done
  done
fi
if has lab; then
  t0=$(now)
  "$build"/dev/bench_attention_backward --det --variants --json "$out/ours.json" > "$out/ours.log" 2>&1
  echo "bench_attention_backward: rc $? in $(took "$t0")"; cat "$out/ours.log"
  if python3 -c "import torch" 2> /dev/null; then
    t0=$(now)
    python3 dev/bench_sdpa_backward.py --json "$out/torch.json" > "$out/torch.log" 2>&1
    echo "bench_sdpa_backward.py: rc $? in $(took "$t0")"; cat "$out/torch.log"
  fi
fi
if has sanitize && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    t0=$(now)
    compute-sanitizer --tool $tool --print-limit 5 "$build"/dev/bench_attention_backward --batch 1 --heads 2 --seq 200 \
      --reps 1 --warmup 0 --det --variants > "$out/sanitize_$tool.log" 2>&1
    echo "compute-sanitizer $tool: rc $? in $(took "$t0")"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$out/sanitize_$tool.log" | head -5
  done
fi
if has campaign; then
  t0=$(now)
  for seed in ${BWD_SEEDS:-1 2 3}; do  # BWD_SEEDS="1 2": fewer seeds
    kernels="--kernel cuda.attn_bwd_naive"
    for k in fp16 bf16 fp16.det bf16.det; do kernels="$kernels --kernel cuda.attn_bwd_flash.$k"; done
    for k in $(cudnn_bwd fp16) $(cudnn_bwd bf16); do kernels="$kernels --kernel $k"; done
    "$u" fuzz $kernels --seed $seed --no-html \
      --out "$out/campaign_$seed" > "$out/campaign_$seed.log" 2>&1
    echo "campaign seed $seed: rc $? in $(took "$t0")"; grep -iE "^(kernel|  ?[a-z]+\.)|cases|failed" "$out/campaign_$seed.log" | tail -14
  done
  for pair in "cuda.attn_bwd_flash.fp16 cuda.attn_flash.fp16" "cuda.attn_bwd_flash.bf16 cuda.attn_flash.bf16" \
              "cudnn.sdpa_bwd.fp16 cudnn.sdpa.fp16" "cudnn.sdpa_bwd.bf16 cudnn.sdpa.bf16"; do
    set -- $pair; t0=$(now)
    "$u" list 2>/dev/null | grep "$1" > /dev/null || continue
    "$u" fuzz --kernel "$1" --forward-kernel "$2" --seed 1 --no-html \
      --out "$out/chained_$1" > "$out/chained_$1.log" 2>&1
    echo "chained $2 -> $1: rc $? in $(took "$t0")"; grep -iE "cases|failed|declin" "$out/chained_$1.log" | tail -4
  done
  find "$out" -path "*/cases/*" -size +4M -delete  # small replay cases come back, large ones stay there
fi
