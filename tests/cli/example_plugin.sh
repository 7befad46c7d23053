#!/bin/sh
# The shipped example plugin (its host kernels; device kernels need a GPU) against the CLI:
# the first thing a plugin author runs must not fail on a harness bug.
#
#   example_plugin.sh fuzz ULPGATE PLUGIN OUTDIR   the default fuzz campaign (default --cases,
#                                                  --max-k and budget) passes
#   example_plugin.sh amax ULPGATE PLUGIN OUTDIR   a replayed case with amax on FP32 B and C
#                                                  passes: amax scales FP8 operands only, and
#                                                  the plugin ABI hands FP32 operands scale 1
#                                                  (before, B and C got a scale the plugin
#                                                  never applied: D off by ~1e41x the bound)
set -eu
mode=$1
bin=$2
plugin=$3
out=$4
kernels=$("$bin" --plugin "$plugin" list | awk -v lib="(plugin $plugin)" 'index($0, lib) && $2 == "host" { print $1 }')
if [ -z "$kernels" ]; then
  echo "no host kernel of $plugin in 'ulpgate list'" >&2
  exit 1
fi
# A fresh directory: a corpus left by an earlier failing run would be replayed first.
rm -rf "$out"
mkdir -p "$out"
case $mode in
  fuzz)
    set --
    for k in $kernels; do set -- "$@" --kernel "$k"; done
    exec "$bin" --plugin "$plugin" fuzz "$@" --no-html --out "$out"
    ;;
  amax)
    for k in $kernels; do
      cat >"$out/$k.json" <<CASE
{"ulpgate_case": 1, "op": "gemm", "kernel": "$k", "gemm": {"m": 4, "n": 3, "k": 5},
 "types": {"A": "fp32", "B": "fp32", "C": "fp32", "D": "fp32", "compute": "fp32"}, "beta": 1.0,
 "dist": {"B": "amax(frac=1e-3,base=normal(0,1))", "C": "amax(frac=1e-3,base=uniform(-9,9))"}}
CASE
      "$bin" --plugin "$plugin" replay "$out/$k.json"
    done
    ;;
  *)
    echo "mode must be fuzz or amax, got '$mode'" >&2
    exit 2
    ;;
esac
