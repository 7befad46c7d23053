#!/bin/sh
# The project gates itself: a fixed fuzz campaign over the CPU models (GEMM and attention) (same seed, cases, K range
# and the small size regime every time, so the same inputs) compared with baselines/cpu_models.json. A change
# that makes a model or a reference measure differently fails here.
#
#   self_gate.sh ULPGATE OUTDIR            run the campaign and gate it
#   self_gate.sh ULPGATE OUTDIR --update   also rewrite the baseline first (after a change
#                                          whose effect on the numbers is understood)
set -eu
bin=$1
out=$2
baseline=$(cd "$(dirname "$0")/../.." && pwd)/baselines/cpu_models.json
rm -rf "$out"
"$bin" fuzz --seed 20261129 --cases 20 --max-k 512 --sizes small --time 0 --out "$out" \
  --kernel cpu.fp32_seq --kernel cpu.fp32_pairwise \
  --kernel "cpu.blockfma:block=4,frac=23,round=rz" --kernel "cpu.blockfma:block=16,frac=13,round=rz" \
  --kernel cpu.attn_naive --kernel "cpu.attn_online:block=64" \
  --kernel "cpu.attn_flash:block=64,p=fp16" --kernel "cpu.attn_flash:block=128,p=bf16"
if [ "${3:-}" = --update ]; then
  "$bin" baseline update --slack 0.25 --out "$baseline" "$out/fuzz.json"
fi
"$bin" gate --baseline "$baseline" --junit "$out/gate.xml" "$out/fuzz.json"
