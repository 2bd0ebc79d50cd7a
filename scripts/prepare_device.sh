#!/usr/bin/env bash
# Everything a CUDA lease needs from this (Debian) machine, in .device/ (ignored by git,
# carried with `carry: [".device"]`): the dependencies' .deb files and setup.sh
# (../shared/device/fetch-debs.sh), and TensorBoard event files of a short CPU run with rlx's
# own reading of them, for `scripts/cuda_check.sh OUT tensorboard` (the image has the
# tensorboard package; Debian has none), and a reward model and a LoRA run for
# `scripts/cuda_check.sh OUT readers` (transformers, PEFT).
#   scripts/prepare_device.sh [RLX_BINARY]     (default build/release/rlx)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rlx=${1:-build/release/rlx}
EXTRA_DEBS="nlohmann-json3-dev libcli11-dev libicu-dev libicu72 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
libpcre2-posix3 libseccomp-dev libseccomp2 libxxhash-dev libxxhash0 pkgconf pkgconf-bin libpkgconf3 pkg-config libsodium-dev \
libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 zlib1g-dev libbrotli-dev libbrotli1 libprotobuf-dev libprotobuf32 \
libprotoc32 libprotobuf-lite32 protobuf-compiler" ../shared/device/fetch-debs.sh
work=$(mktemp -d)
"$rlx" run tests/e2e/grpo.yaml run.out_dir="$work" train.steps=3 learner.checkpoint_every=0 log.tensorboard=true > "$work/run.log" 2>&1 \
  || { tail -5 "$work/run.log"; exit 1; }
rm -rf .device/tb && mkdir -p .device/tb
cp "$work"/clean/tensorboard/events.out.tfevents.* .device/tb/
"$rlx" inspect tensorboard .device/tb > .device/tb.expected.jsonl
# A reward model and a LoRA run, for `scripts/cuda_check.sh OUT readers` (transformers and
# PEFT read them there): a 20-step SFT base, a 20-step reward model with rlx's scores of a few
# sequences, and 3 GRPO steps with LoRA (final/ merged, final/adapter PEFT's).
r=.device/readers
rm -rf $r && mkdir -p $r
"$rlx" sft tests/e2e/grpo.yaml run.out_dir="$work" run.name=base model.arch=qwen2 sft.steps=20 sft.eval_tasks=5 > /dev/null 2>&1
"$rlx" rm tests/e2e/grpo.yaml run.out_dir="$work" run.name=rm model.path="$work/base/final" rm.steps=20 rm.eval_pairs=10 \
  > /dev/null 2>&1
"$rlx" run tests/e2e/grpo.yaml run.out_dir="$work" run.name=lora model.path="$work/base/final" model.lora.rank=4 train.steps=3 \
  learner.checkpoint_every=0 > "$work/lora.log" 2>&1 || { tail -5 "$work/lora.log"; exit 1; }
cp -r "$work/base/final" $r/base && cp -r "$work/rm/final" $r/rm && cp -r "$work/lora/final" $r/lora
tokens='[[1,2,3,4,5],[7],[3,9,11,2,2,2,8,1,4],[10,20,30]]'
"$rlx" model score --model $r/rm --tokens "$tokens" | python3 -c "import json, sys; print(json.dumps({'tokens': $tokens, **json.loads(sys.stdin.read())}))" > $r/rm_expected.json
rm -rf "$work"
echo "prepare_device: .device ready ($(du -sh .device | cut -f1)); TensorBoard files of 3 steps in .device/tb, reward model and LoRA outputs in $r"
