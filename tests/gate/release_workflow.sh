#!/bin/sh
# The release workflow of docs/concepts/gate.md, end to end, on a kernel whose accuracy can regress
# (planted.release from the planted test plugin: pairwise summation, or sequential with
# PLANTED_REGRESSION=1, both within tolerance):
#   campaign -> baseline -> gate passes; the regressed kernel -> gate exit 1 ("regressed");
#   a rebuilt plugin (other bytes, the same kernels) -> judged: gate exit 0 unchanged, 1 regressed;
#   a run cut short by its time budget -> fuzz exit 1 and gate exit 1 ("not run");
#   another campaign (seed) -> gate exit 2.
#
#   release_workflow.sh ULPGATE PLANTED_PLUGIN OUTDIR
set -u
bin=$1
plugin=$2
out=$3
rm -rf "$out"
mkdir -p "$out"
fail() { echo "release_workflow: $*" >&2; exit 1; }
expect() {  # expect CODE what... command
  want=$1; shift
  what=$1; shift
  "$@" > "$out/last.log" 2>&1
  got=$?
  [ "$got" = "$want" ] || { cat "$out/last.log" >&2; fail "$what: exit $got, expected $want"; }
}
campaign="--plugin $plugin fuzz --kernel planted.release --dtype fp32 --seed 20261201 --cases 20 --max-k 512 --no-html"

# 1. On the release branch: a complete campaign and its baseline.
expect 0 "baseline campaign" "$bin" $campaign --time 0 --out "$out/release"
expect 0 "baseline update" "$bin" baseline update "$out/release/fuzz.json" --out "$out/baseline.json"

# 2. In CI, the same campaign on an unchanged kernel: the gate passes, every case matched.
expect 0 "unchanged campaign" "$bin" $campaign --time 0 --out "$out/ci"
expect 0 "gate on the unchanged kernel" "$bin" gate --baseline "$out/baseline.json" --junit "$out/gate.xml" "$out/ci/fuzz.json"
grep -q "20 matched, 0 regressed" "$out/last.log" || fail "unchanged: not 20 cases matched: $(tail -1 "$out/last.log")"
grep -q 'failures="0"' "$out/gate.xml" || fail "unchanged: JUnit reports failures"

# 3. A regression within tolerance (every case still passes its verdict) is caught.
PLANTED_REGRESSION=1 expect 0 "regressed campaign (verdicts pass)" "$bin" $campaign --time 0 --out "$out/regressed"
expect 1 "gate on the regressed kernel" "$bin" gate --baseline "$out/baseline.json" --junit "$out/gate-regressed.xml" \
  "$out/regressed/fuzz.json"
grep -q "regressed" "$out/last.log" || fail "regression not named"
grep -q '<failure message="regressed"' "$out/gate-regressed.xml" || fail "regression not in the JUnit XML"

# 3b. The kernel rebuilt (the plugin's bytes differ, its kernels' names do not): the gate
# judges it against the previous build's baseline.
mkdir -p "$out/rebuilt"
cp "$plugin" "$out/rebuilt/$(basename "$plugin")"
printf 'rebuilt' >> "$out/rebuilt/$(basename "$plugin")"
rebuilt=$(echo "$campaign" | sed "s|--plugin $plugin|--plugin $out/rebuilt/$(basename "$plugin")|")
expect 0 "rebuilt campaign" "$bin" $rebuilt --time 0 --out "$out/ci-rebuilt"
expect 0 "gate on the rebuilt, unchanged kernel" "$bin" gate --baseline "$out/baseline.json" "$out/ci-rebuilt/fuzz.json"
grep -q "20 matched, 0 regressed" "$out/last.log" || fail "rebuilt: not 20 cases matched: $(tail -1 "$out/last.log")"
grep -q "plugin rebuilt: $(basename "$plugin")" "$out/last.log" || fail "rebuilt plugin not named"
PLANTED_REGRESSION=1 expect 0 "rebuilt, regressed campaign" "$bin" $rebuilt --time 0 --out "$out/ci-rebuilt-regressed"
expect 1 "gate on the rebuilt, regressed kernel" "$bin" gate --baseline "$out/baseline.json" \
  "$out/ci-rebuilt-regressed/fuzz.json"
grep -q "regressed" "$out/last.log" || fail "rebuilt: regression not named"

# 4. A run cut short by its budget is refused: by fuzz (exit 1) and by the gate.
expect 1 "partial campaign" "$bin" $campaign --time 0.000001 --out "$out/partial"
grep -q "PARTIAL" "$out/last.log" || fail "partial run not announced"
expect 1 "gate on a partial run" "$bin" gate --baseline "$out/baseline.json" "$out/partial/fuzz.json"
grep -q "not run" "$out/last.log" || fail "not-run cases not named"

# 5. Another campaign (seed) is not compared: exit 2, the difference named on one line.
expect 0 "other seed" "$bin" $(echo "$campaign" | sed 's/--seed 20261201/--seed 7/') --time 0 --out "$out/other"
expect 2 "gate on another campaign" "$bin" gate --baseline "$out/baseline.json" "$out/other/fuzz.json"
grep -q "seed: 20261201 in the baseline, 7 in the run" "$out/last.log" || fail "difference not named"
echo "release_workflow: all steps behaved"
