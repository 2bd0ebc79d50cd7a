#!/usr/bin/env bash
# The main job, on CPU. Until the end-to-end GRPO quickstart exists (issue 9) this
# runs the most complete real path there is: install, build, create a small
# Qwen2-shaped model with a character tokenizer, sample from it through the KV
# cache, validate what was written, and measure the model's throughput.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${RLX_BUILD_DIR:-$root/build/release}
run=${RLX_RUN_DIR:-$root/runs/quickstart}
"$root/scripts/install-deps.sh"
mkdir -p "$(dirname "$build")" "$run"
"$root/scripts/build.sh" "$build"
rlx="$build/rlx"

echo "== 1. a character tokenizer for arithmetic, and a model with random weights"
printf '{"type": "char", "alphabet": "0123456789+-*= \\n", "special_tokens": ["<pad>", "<bos>", "<eos>", "<unk>"]}\n' > "$run/char.json"
"$rlx" model init --arch qwen2 --preset small --seed 0 --tokenizer "$run/char.json" --out "$run/model"
echo "== 2. tokenize a prompt"
"$rlx" tokenize --tokenizer "$run/char.json" "12+34="
echo "== 3. sample 24 tokens through the KV cache (random weights: random digits)"
"$build/examples/rlx_example_generate" "$run/model" "12+34=" 24
echo "== 4. validate the checkpoint"
"$rlx" inspect safetensors "$run/model/model.safetensors" | tail -n 1
echo "== 5. throughput"
"$rlx" bench model --preset small --batch 8 --seq 128 --iters 3
echo "quickstart: done; the model directory is $run/model (HF format: transformers can load it)"
