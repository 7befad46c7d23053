#!/usr/bin/env bash
# install.find_package: `cmake --install` of this build tree into WORK/prefix, then the
# project in this folder (the manual's C++ API example, docs/guide/cpp.md, which must be these files
# word for word) configured with find_package(ulpgate) against it, built and run.
# The project compiles and links with the build's compiler and flags (a sanitized build's
# libraries need the sanitizers' run-time libraries at the link).
# Usage: find_package.sh CMAKE GENERATOR BUILD_DIR WORK CXX_COMPILER [PREFIX_PATH (colon-separated)
#        [CXX_FLAGS [EXE_LINKER_FLAGS]]]
set -euo pipefail
cmake=$1 generator=$2 build=$3 work=$4 cxx=$5 prefix_path=${6:-} cxx_flags=${7:-} exe_linker_flags=${8:-}
here=$(cd "$(dirname "$0")" && pwd)
readme=$here/../../docs/guide/cpp.md

for f in CMakeLists.txt main.cpp; do  # the page's blocks follow a "<!-- tests/install/FILE -->" line
  if ! awk -v m="<!-- tests/install/$f -->" '$0 == m { on = 1; getline; next } on && /^```$/ { exit } on' \
       "$readme" | diff -u - "$here/$f"; then
    echo "docs/guide/cpp.md's tests/install/$f differs from the file (diff above: page -, file +)"
    exit 1
  fi
done

rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log" || { cat "$work/install.log"; exit 1; }
"$work/prefix/bin/ulpgate" --version  # the installed CLI runs (its shared libraries found)
export CMAKE_PREFIX_PATH=$work/prefix${prefix_path:+:$prefix_path}
"$cmake" -S "$here" -B "$work/build" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="$cxx_flags" -DCMAKE_EXE_LINKER_FLAGS="$exe_linker_flags"
"$cmake" --build "$work/build"
"$work/build/test_my_gemm"
