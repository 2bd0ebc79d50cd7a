#!/usr/bin/env bash
# Installs the built rlx into a scratch prefix, then configures, builds and runs an
# outside project that finds it with find_package(rlx).
#   run.sh BUILD_DIR PROJECT_DIR WORK_DIR
set -euo pipefail
build=$1 project=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$project/project" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" > "$work/configure.log"
cmake --build "$work/build" -j2 > "$work/build.log"
out=$("$work/build/consumer")
echo "$out"
grep -qE '^rlx [0-9.]+ logits \[1, 4, 512\]$' <<<"$out"
