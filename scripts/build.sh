#!/usr/bin/env bash
# Configures and builds rlx (Release) into BUILD_DIR (default build/release), with
# ccache and precompiled headers: every target, or only the TARGETs named (quickstart.sh
# builds the `rlx` command alone). Used by test.sh and quickstart.sh.
#
#   scripts/build.sh [BUILD_DIR [TARGET...]]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
shift $(( $# > 0 ? 1 : 0 ))
targets=()
for t in "$@"; do targets+=(--target "$t"); done
# ccache must ignore what changes between identical PCH builds.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
# Paths are hashed relative to the checkout, so a second clone reuses the first one's objects;
# one build writes about 1.5 GB (three precompiled headers among it), hence the larger cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-20G}
jobs=${RLX_JOBS:-$(nproc)}
mkdir -p "$(dirname "$build")"
# Ninja starts a target's compiles before the libraries it links are built (make waits), which
# keeps both cores busy to the end of a cold build; a build directory keeps its first generator.
generator=()
if [ ! -f "$build/CMakeCache.txt" ] && [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja > /dev/null; then
  generator=(-G Ninja)
fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release ${RLX_CMAKE_ARGS:-} > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"$jobs" "${targets[@]}"
