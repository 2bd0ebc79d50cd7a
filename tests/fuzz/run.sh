#!/usr/bin/env bash
# Builds the bus decoder's libFuzzer target with clang and runs it for a bounded time.
#   run.sh SOURCE_DIR BUILD_INCLUDE_DIR WORK_DIR SECONDS
set -euo pipefail
src=$1 gen_include=$2 work=$3 seconds=$4
mkdir -p "$work/corpus" && cd "$work"  # crash artifacts land in $work
cxx=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$cxx" ]; then echo "clang++ is required for the fuzz test (scripts/install-deps.sh installs it)"; exit 1; fi
flags=(-std=c++20 -O1 -g -I"$src/include" -I"$gen_include")
fuzz=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
sources=("$src/src/bus/message.cpp" "$src/src/core/error.cpp" "$src/src/core/hash.cpp")
# One object per source, through ccache where there is one (as scripts/build.sh sets it up):
# a clean checkout rebuilds these in about 25 s of the test's time otherwise.
cc=("$cxx")
if command -v ccache >/dev/null; then
  cc=(ccache "$cxx")
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$src} CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-time_macros,include_file_mtime,include_file_ctime}
fi
build() {  # build OUTPUT EXTRA_FLAGS_NAME SOURCES...: compile each source, link
  local out=$1 extra=$2[@] objects=() f o
  shift 2
  for f in "$@"; do
    o="$work/obj/$(basename "$out")-$(basename "$f" .cpp).o"
    mkdir -p "$work/obj"
    "${cc[@]}" "${flags[@]}" "${!extra}" -c "$f" -o "$o"
    objects+=("$o")
  done
  "$cxx" "${!extra}" "${objects[@]}" -lfmt -o "$out"
}
none=()
build "$work/seed_corpus" none "${sources[@]}" "$src/tests/fuzz/seed_corpus.cpp"
"$work/seed_corpus" "$work/corpus"
build "$work/frame_fuzz" fuzz "${sources[@]}" "$src/tests/fuzz/frame_fuzz.cpp"
# -rss_limit_mb bounds memory: a decoder that allocates what a frame claims fails here.
"$work/frame_fuzz" -max_total_time="$seconds" -rss_limit_mb=1024 -malloc_limit_mb=512 -max_len=4096 \
  -print_final_stats=1 "$work/corpus" 2>&1 | tail -n 15
