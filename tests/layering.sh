#!/usr/bin/env bash
# The dependency direction of DESIGN.md, checked on the sources: core <- distributions,
# references, kernels <- harness <- reports <- cli and python (the Python module, beside the
# CLI). Each room may include only itself and the rooms below it (include/ulpgate, the
# public C ABI, is open to all). Prints every upward include and fails if there is one.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
allowed() {  # room -> include prefixes it may use
  case $1 in
    core) echo "core" ;;
    distributions) echo "core distributions" ;;
    references) echo "core references" ;;
    kernels) echo "core kernels" ;;
    harness) echo "core distributions references kernels harness" ;;
    reports) echo "core distributions references kernels harness reports" ;;
    cli) echo "core distributions references kernels harness reports cli" ;;
    python) echo "core distributions references kernels harness reports python" ;;
  esac
}
bad=0 checked=0
for room in core distributions references kernels harness reports cli python; do
  dir=$room
  [ "$room" = cli ] && dir=harness/cli
  [ -d "$dir" ] || continue
  files=$(find "$dir" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \))
  [ "$room" = harness ] && files=$(printf '%s\n' "$files" | grep -v '^harness/cli/')
  for f in $files; do
    checked=$((checked + 1))
    while IFS= read -r inc; do
      top=${inc%%/*}
      [ "$top" = "$inc" ] && continue  # a file beside this one
      [ "$top" = ulpgate ] && continue
      # harness/cli is the top room; every other "harness/..." include is the harness's
      [ "$top" = harness ] && [ "${inc#harness/cli/}" != "$inc" ] && top=cli
      ok=0
      for a in $(allowed "$room"); do [ "$top" = "$a" ] && ok=1; done
      if [ $ok = 0 ]; then
        echo "upward include: $f ($room) includes \"$inc\" ($top)"
        bad=$((bad + 1))
      fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  done
done
echo "layering: $checked files, $bad upward includes"
[ $bad = 0 ]
