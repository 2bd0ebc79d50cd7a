#!/usr/bin/env bash
# Builds the bus decoder's libFuzzer target with clang and runs it for a bounded time.
#   run.sh SOURCE_DIR BUILD_INCLUDE_DIR WORK_DIR SECONDS
set -euo pipefail
src=$1 gen_include=$2 work=$3 seconds=$4
mkdir -p "$work/corpus" && cd "$work"  # crash artifacts land in $work
cxx=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$cxx" ]; then echo "clang++ is required for the fuzz test (scripts/install-deps.sh installs it)"; exit 1; fi
flags=(-std=c++20 -O1 -g -I"$src/include" -I"$gen_include")
sources=("$src/src/bus/message.cpp" "$src/src/core/error.cpp" "$src/src/core/hash.cpp")
"$cxx" "${flags[@]}" "${sources[@]}" "$src/tests/fuzz/seed_corpus.cpp" -lfmt -o "$work/seed_corpus"
"$work/seed_corpus" "$work/corpus"
"$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "${sources[@]}" "$src/tests/fuzz/frame_fuzz.cpp" -lfmt -o "$work/frame_fuzz"
# -rss_limit_mb bounds memory: a decoder that allocates what a frame claims fails here.
"$work/frame_fuzz" -max_total_time="$seconds" -rss_limit_mb=1024 -malloc_limit_mb=512 -max_len=4096 \
  -print_final_stats=1 "$work/corpus" 2>&1 | tail -n 15
