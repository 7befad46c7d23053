# Shared by the dev/*.sh scripts that run named parts on a machine with a GPU:
#   source "$(dirname "$0")/parts.sh" "usage line" "default parts" "$@"
# sets build (absolute), out (absolute, created) and parts, and defines has PART,
# now and took T0 ("12.3 s" since T0). The lab programs the parts run are not in the default
# build: it builds them (`--target lab`) first.
set -uo pipefail
_usage=$1; _default=$2; shift 2
[ $# -ge 2 ] || { echo "usage: $_usage" >&2; exit 2; }
build=$(cd "$1" && pwd); out=$2; shift 2
mkdir -p "$out"; out=$(cd "$out" && pwd)
parts=${*:-$_default}
cmake --build "$build" --target lab > "$out/build-lab.log" 2>&1 || { echo "building the lab programs failed: $out/build-lab.log" >&2; exit 1; }
has() { [[ " $parts " == *" $1 "* ]]; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
