#!/usr/bin/env bash
# The test command: installs missing dependencies, builds, fetches the tokenizer
# parity fixtures (cached under the build directory), and runs every test with ctest.
#
#   scripts/test.sh                 # everything in the default suite
#   scripts/test.sh -R tokenizer    # extra arguments go to ctest
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${RLX_BUILD_DIR:-$root/build/release}
"$root/scripts/install-deps.sh"
mkdir -p "$(dirname "$build")"
"$root/scripts/build.sh" "$build"
"$root/scripts/make_tokenizer_fixtures.sh" "$build/fixtures"
"$root/scripts/make_chat_template_fixtures.sh" "$build/fixtures/chat"
# Each rlx process re-executes itself once to give OpenBLAS this CPU's kernels
# (rlx::prepare_blas): the choice made once here, the suite's thousand processes inherit it
# and start once (0.4 s of CPU each). They start OpenBLAS with one thread, as the processes
# rlx starts do: those that compute ask for their threads (rlx::set_compute_threads).
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$("$build/rlx" --version | sed -n 's/^OpenBLAS core: //p')}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
cd "$build"
ctest --output-on-failure -j"${RLX_JOBS:-$(nproc)}" --timeout 900 "$@"
