#!/usr/bin/env bash
# Installs rlx's build and test dependencies on Debian 12 with apt.
# Idempotent: installs only what is missing, and does nothing (no apt-get
# update, no root needed) when everything is already there.
#
#   scripts/install-deps.sh             # install what is missing
#   scripts/install-deps.sh --check     # list what is missing, exit 1 if anything is
#   scripts/install-deps.sh --main-job  # only what building rlx and the quickstart need
set -euo pipefail

# What building rlx and running the main job (scripts/quickstart.sh) need.
packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread       # LibTorch 1.13 (CPU) + a fast BLAS behind it
  libzmq3-dev cppzmq-dev                  # trajectory bus
  libcereal-dev libxxhash-dev             # message serialisation and checksums
  libhdf5-dev                             # trajectory store
  libfmt-dev libyaml-cpp-dev              # logging, configs
  nlohmann-json3-dev                      # safetensors headers, config.json, tokenizer.json
  libpcre2-dev libicu-dev                 # tokenizer pre-tokenization regexes and NFC
  libcli11-dev catch2                     # command line; the tests' framework (CMake's configure looks for it)
  libcpp-httplib-dev                      # rlx serve: the OpenAI-compatible HTTP server
  libprotobuf-dev protobuf-compiler       # TensorBoard event files
  libseccomp-dev                          # sandbox
  libgloo-dev                             # headers of the Gloo that LibTorch's c10d links (CPU collectives)
  python3 python3-matplotlib              # plots of a run's curves (scripts/plot_metrics.py)
)
mode=${1:-}
if [ "$mode" != --main-job ]; then
  packages+=(
    clang-14 libclang-rt-14-dev             # libFuzzer + sanitizers for the bus decoder's fuzz test
    python3-yaml                            # manifest checks
    python3-jinja2                          # chat-template parity fixtures: jinja2 as transformers drives it
    munge slurmctld slurmd slurm-client     # a real single-node Slurm for the `rlx run` under Slurm test
  )
  # node + npm make the tokenizer parity fixtures (scripts/make_tokenizer_fixtures.sh);
  # a machine that already has them (from any source) keeps its own.
  command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done

if [ "$mode" = --check ]; then
  if [ ${#missing[@]} -eq 0 ]; then echo "install-deps: all ${#packages[@]} packages present"; exit 0; fi
  echo "install-deps: missing: ${missing[*]}"; exit 1
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"
