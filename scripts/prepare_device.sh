#!/usr/bin/env bash
# Everything a CUDA lease needs from this (Debian) machine, in .device/ (ignored by git,
# carried with `carry: [".device"]`): the dependencies' .deb files and setup.sh
# (../shared/device/fetch-debs.sh), and TensorBoard event files of a short CPU run with rlx's
# own reading of them, for `scripts/cuda_check.sh OUT tensorboard` (the image has the
# tensorboard package; Debian has none).
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
rm -rf "$work"
echo "prepare_device: .device ready ($(du -sh .device | cut -f1)); TensorBoard files of 3 steps in .device/tb"
