#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test with CTest, then runs
# the suites again under AddressSanitizer, ThreadSanitizer and UndefinedBehaviorSanitizer builds
# (the CUDA code is compiled in the plain build only), after the libFuzzer harnesses ran for 15 s
# each (fuzz/run.sh; fuzz/README.md).
#
#   ./ci.sh              everything
#   ./ci.sh --quick      the plain build's tests only
set -euo pipefail
cd "$(dirname "$0")"

./scripts/deps.sh

jobs=$(nproc 2>/dev/null || echo 2)
run_build() { # name, extra cmake args...
  local dir="build-ci-$1"
  shift
  echo "== configure $dir $*"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
  cmake --build "$dir" -j "$jobs"
  echo "== test $dir"
  (cd "$dir" && ctest --output-on-failure -j "$jobs")
}

run_build plain -DCMAKE_C_FLAGS=-Werror
if [ "${1:-}" != "--quick" ]; then
  echo "== fuzz"
  fuzz/run.sh 15
  run_build asan -DIFD_SANITIZE=address -DIFD_BUILD_BENCH=OFF -DIFD_CUDA=OFF
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
    run_build tsan -DIFD_SANITIZE=thread -DIFD_BUILD_BENCH=OFF -DIFD_CUDA=OFF
  UBSAN_OPTIONS="print_stacktrace=1" \
    run_build ubsan -DIFD_SANITIZE=undefined -DIFD_BUILD_BENCH=OFF -DIFD_CUDA=OFF
fi
echo "== all tests passed"
