#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, in build-fuzz/) and runs each one for SECONDS on a
# scratch copy of its seed corpus (fuzz/corpus/<harness>/), one process at a time. Prints each
# harness's executions; exits 1 when any harness finds a crash, a leak, undefined behaviour, a
# timeout or an out-of-memory, and names the input it kept. See fuzz/README.md.
#
#   fuzz/run.sh SECONDS [HARNESS...]     all harnesses, or the ones named
#
# Environment: IFD_FUZZ_BUILD (build folder, default build-fuzz), IFD_FUZZ_ARGS (more libFuzzer
# flags, e.g. "-max_len=65536"), IFD_FUZZ_KEEP=1 (keep the scratch folder, say where it is).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
  echo "usage: fuzz/run.sh SECONDS [HARNESS...] (SECONDS: a whole number >= 1)" >&2
  exit 2
fi
secs=$1
shift

if ! command -v clang >/dev/null 2>&1 ||
   ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  ./scripts/deps.sh
fi

build=${IFD_FUZZ_BUILD:-build-fuzz}
jobs=$(nproc 2>/dev/null || echo 2)
start=$(date +%s)
echo "== fuzz: configure and build $build (clang, libFuzzer, ASan, UBSan)"
CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIFD_FUZZ=ON -DIFD_CUDA=OFF \
  -DBUILD_TESTING=OFF -DIFD_BUILD_BENCH=OFF -DCMAKE_C_FLAGS=-Werror >/dev/null
cmake --build "$build" -j "$jobs" --target fuzzers >/dev/null
echo "== fuzz: built in $(($(date +%s) - start)) s"

if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  mapfile -t harnesses < "$build/fuzz/harnesses.txt"
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/ifd-fuzz.XXXXXX")
if [ "${IFD_FUZZ_KEEP:-0}" != 1 ]; then
  trap 'rm -rf "$scratch"' EXIT
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for h in "${harnesses[@]}"; do
  [ -n "$h" ] || continue
  bin="$build/fuzz/$h"
  if [ ! -x "$bin" ]; then
    echo "fuzz: no harness '$h' in $build/fuzz (the harnesses: $(tr '\n' ' ' < "$build/fuzz/harnesses.txt"))" >&2
    exit 2
  fi
  corpus="$scratch/$h/corpus"
  mkdir -p "$corpus" "$scratch/$h/found"
  if [ -d "fuzz/corpus/$h" ]; then
    cp -r "fuzz/corpus/$h/." "$corpus/"
  fi
  seeds=$(find "$corpus" -type f | wc -l)
  log="$scratch/$h/log"
  rc=0
  # shellcheck disable=SC2086 # IFD_FUZZ_ARGS is a list of flags
  "$bin" "$corpus" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$scratch/$h/found/" ${IFD_FUZZ_ARGS:-} > "$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  files=$(find "$corpus" -type f | wc -l)
  found=$(find "$scratch/$h/found" -type f | head -1)
  if [ $rc -ne 0 ] || [ -n "$found" ]; then
    failed+=("$h")
    echo "$h: FINDING after ${execs:-?} executions (exit $rc)"
    grep -E "ERROR|SUMMARY|runtime error|^    #[0-9]+ " "$log" | head -40 || tail -40 "$log"
    if [ -n "$found" ]; then
      mkdir -p fuzz/findings
      cp "$found" "fuzz/findings/$h-$(basename "$found")"
      echo "$h: the input is fuzz/findings/$h-$(basename "$found") (replay: $bin fuzz/findings/$h-$(basename "$found"))"
    fi
  else
    echo "$h: ${execs:-?} executions in ${took:-$secs} s (${rate:-?}/s), corpus $seeds -> $files inputs, no finding"
  fi
done

echo "== fuzz: $(($(date +%s) - start)) s in all"
if [ "${IFD_FUZZ_KEEP:-0}" = 1 ]; then
  echo "fuzz: the scratch corpora and logs are in $scratch"
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
