#!/usr/bin/env bash
# The numerically sensitive unit tests (tag [numerics]: tolerances between two paths, learning
# tests) under each ATen CPU capability this machine supports, so that a developer sees here
# what another CPU would compute: ATen picks its vectorised kernels (softmax, reductions, exp
# and log) by capability, and their rounding differs. docs/NUMERICS.md says why.
#   capabilities.sh RLX_TESTS_BINARY [CATCH_ARGS...]
set -uo pipefail
tests=$1
shift
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
caps=(default)
[[ " $flags " == *" avx2 "* && " $flags " == *" fma "* ]] && caps+=(avx2)
[[ " $flags " == *" avx512f "* && " $flags " == *" avx512bw "* && " $flags " == *" avx512vl "* && " $flags " == *" avx512dq "* ]] && caps+=(avx512)
echo "capabilities of this CPU: ${caps[*]}"
failed=()
for cap in "${caps[@]}"; do
  echo "== ATEN_CPU_CAPABILITY=$cap"
  ATEN_CPU_CAPABILITY=$cap "$tests" "[numerics]" "$@" || failed+=("$cap")
done
[ ${#failed[@]} -eq 0 ] || { echo "FAIL: [numerics] tests failed under ATEN_CPU_CAPABILITY=${failed[*]}"; exit 1; }
echo "ok: [numerics] tests pass under ${caps[*]}"
