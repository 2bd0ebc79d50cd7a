#!/usr/bin/env bash
# Installs the built rlx into a scratch prefix, then configures, builds and runs an
# outside project that finds it with find_package(rlx).
#   run.sh BUILD_DIR PROJECT_DIR WORK_DIR
set -euo pipefail
build=$1 project=$(cd "$2" && pwd) work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$project/project" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" > "$work/configure.log"
cmake --build "$work/build" -j2 > "$work/build.log"
out=$("$work/build/consumer")
echo "$out"
grep -qE '^rlx [0-9.]+ logits \[1, 4, 512\]$' <<<"$out"
# The outside trainer: its environment and its algorithm (with its own option) for 4 steps,
# every role a process of that binary.
cd "$work"
"$work/build/my_trainer" run "$project/project/run.yaml" > trainer.log 2>&1 || { tail -20 trainer.log; exit 1; }
python3 - runs/outside/metrics.jsonl <<'P'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert [x["step"] for x in m] == [1, 2, 3, 4], m
assert all(x["samples"] == 8 for x in m), m
print("my_trainer: 4 steps of count_a with scaled_grpo")
P
# Its option is checked like every key: a misspelt one is named, with the declared one.
if out=$("$work/build/my_trainer" run "$project/project/run.yaml" run.name=bad "algorithm.options={scal: 2}" 2>&1); then
  echo "a misspelt algorithm option was accepted"; exit 1
fi
grep -q "algorithm.options.scal" <<<"$out" && grep -q 'did you mean "scale"' <<<"$out" || { echo "$out"; exit 1; }
echo "my_trainer: algorithm.options.scal refused, naming scale"
