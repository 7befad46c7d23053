#!/usr/bin/env bash
# The dependency direction of the tree (docs/dev/layout.md), checked on the sources:
#   core <- distributions, references <- kernels <- check <- campaign <- reports
#        <- api, cli, python, dev
# Each room may include only itself and the rooms below it; the C ABI (include/ulpgate/
# plugin.h) is open to all, the C++ facade ("ulpgate/ulpgate.hpp") is the api room. Also
# checks that no room holds more than 30% of the product code. Prints every upward include.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
rooms="core distributions references kernels check campaign reports api cli python dev"
allowed() {  # room -> the rooms it may include
  case $1 in
    core) echo "core" ;;
    distributions) echo "core distributions" ;;
    references) echo "core references" ;;
    kernels) echo "core kernels" ;;
    check) echo "core distributions references kernels check" ;;
    campaign) echo "core distributions references kernels check campaign" ;;
    reports) echo "core distributions references kernels check campaign reports" ;;
    api | cli | python | dev) echo "core distributions references kernels check campaign reports $1" ;;
  esac
}
room_of() {  # an include path -> its room ("" for a file beside the includer or the C ABI)
  case $1 in
    ulpgate/ulpgate.hpp) echo api ;;
    ulpgate/*) echo "" ;;
    */*) echo "${1%%/*}" ;;
    *) echo "" ;;
  esac
}
bad=0 checked=0
for room in $rooms; do
  [ -d "$room" ] || continue
  while IFS= read -r f; do
    checked=$((checked + 1))
    while IFS= read -r inc; do
      top=$(room_of "$inc")
      [ -z "$top" ] && continue
      ok=0
      for a in $(allowed "$room"); do [ "$top" = "$a" ] && ok=1; done
      if [ $ok = 0 ]; then
        echo "upward include: $f ($room) includes \"$inc\" ($top)"
        bad=$((bad + 1))
      fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  done < <(find "$room" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \))
done
# Product code per room (tests, docs and lab equipment left out): none above 30%.
total=0
declare -A lines
for room in core distributions references kernels check campaign reports api cli python include; do
  [ -d "$room" ] || continue
  n=$(find "$room" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \) \
      -exec cat {} + | wc -l)
  lines[$room]=$n
  total=$((total + n))
done
for room in "${!lines[@]}"; do
  if [ $((lines[$room] * 100)) -gt $((total * 30)) ]; then
    echo "room too large: $room holds ${lines[$room]} of $total lines of product code (over 30%)"
    bad=$((bad + 1))
  fi
done
echo "layering: $checked files, $bad problems"
[ $bad = 0 ]
