#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, build-fuzz/) and runs each for SECONDS on a scratch
# copy of its seed corpus (fuzz/corpus/<harness>/), one job each. Prints every harness's
# executions; exits non-zero on the first finding (the crashing input is kept in
# build-fuzz/findings/ and named in the output).
#
#   fuzz/run.sh SECONDS [HARNESS...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:?usage: fuzz/run.sh SECONDS [HARNESS...]}
shift
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(fuzz_ingest fuzz_config fuzz_checkpoint fuzz_wire)

command -v clang >/dev/null || { echo "fuzz/run.sh: clang is not installed (scripts/deps.sh installs it)" >&2; exit 2; }
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIFD_FUZZ=ON -DIFD_CUDA=OFF \
    -DBUILD_TESTING=OFF -DIFD_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc 2>/dev/null || echo 2)" --target "${harnesses[@]}" >/dev/null

mkdir -p build-fuzz/findings
status=0
for h in "${harnesses[@]}"; do
  work=$(mktemp -d)
  cp -r "fuzz/corpus/$h/." "$work/"
  log=build-fuzz/$h.log
  # detect_leaks stays on; -rss_limit bounds a harness's memory (the ingest's is bounded by
  # credit and consumption, a growth is a finding)
  if ! "build-fuzz/fuzz/$h" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
      -timeout=10 -artifact_prefix="build-fuzz/findings/$h-" "$work" >"$log" 2>&1; then
    echo "== $h: FINDING (log: $log)"
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  echo "== $h: $runs executions in ${secs} s"
  rm -rf "$work"
done
exit $status
