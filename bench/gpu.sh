#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and the CUDA toolkit (nvcc, cuBLAS, NCCL), CMake,
# a C compiler and Python 3 with numpy and pytest, and nothing else of infeed's: no libzmq,
# Jansson, OpenBLAS, Check, zlib headers, pkg-config or pyzmq, and no package registry. Those come
# from the folder bench/gpu-prep.sh filled on the development machine (.gpu-deps/, carried
# along), unpacked under a private prefix in the build folder (bench/gpu_deps.py; never into /).
#
#   bash bench/gpu.sh              build, then the GPU tests, cuda against cpu through infeedd,
#                                  and bench_gpu
#   bash bench/gpu.sh --no-test    build, then bench_gpu
#   bash bench/gpu.sh --rehearse   without a GPU (the development machine): the same unpacking,
#                                  build and dependency check, then a smoke test that ends at
#                                  the first CUDA call (bench/gpu-rehearse.sh runs it with the
#                                  system's copies of those packages hidden)
#
# Steps:
#   1. unpack .gpu-deps into build-gpu-bench/gpu-deps; pyzmq into its site/ (PYTHONPATH);
#   2. a Release build in build-gpu-bench/ with the cuda backend (IFD_CUDA=ON) and without MPI
#      (IFD_MPI=OFF: Open MPI is not carried, and the several-hosts case needs 2 GPUs; with 2
#      GPUs and an installed mpirun, IFD_MPI=AUTO finds that machine's MPI), finding
#      the libraries in the prefix only (CMAKE_PREFIX_PATH, the carried pkgconf on the prefix's
#      .pc files), every program and library linked with the prefix's library folders as RPATH
#      (so nothing needs LD_LIBRARY_PATH); NCCL from the toolkit, else from Python's
#      nvidia-nccl package;
#   3. every carried library must resolve inside the prefix (ldd), and pyzmq from it;
#   4. the GPU tests (test_cuda_nn_ops: the transformer's ops on cuda against device/nn_cpu.c,
#      called directly, first and on its own; test_gpu: cuda against cpu on the same runs, 20 and
#      400 steps, eval and predict; test_cuda_errors), where a skip is a failure;
#   5. tests/e2e/test_cuda.py: infeedd --backend cuda against --backend cpu through the Python
#      client, every step's loss (a skip is a failure);
#   6. several hosts on cuda (tests/e2e/test_multihost.py), where MPI and 2 GPUs are present
#      (hosts.log); otherwise it says why not;
#   7. bench_gpu (bench/gpu_bench.c): host-to-device GB/s through the backend against plain
#      pinned cudaMemcpyAsync by shard size, steps/s with CUDA Graphs off and on with the GPU's
#      idle fraction, and the NCCL all-reduce time;
#   8. bench_blas (bench/blas.c): this machine's CPU, its OpenBLAS kernel as shipped and as
#      corrected, beside every other kernel it runs (a second CPU model for docs/design.md's
#      BLAS table).
# Every step runs under a time limit (all together about 10 minutes at most; a run on one H100
# should take a few) and the later steps run after a failed one; the exit status is 1 when any
# failed. Results: $OUT if set (the device tool's folder), else
# build-gpu-bench/results: gpu.log (all this script printed, ending with one line a step),
# build.log, nn_ops.log, tests.log, e2e.log, bench_gpu.txt, bench_blas.txt, deps.txt.
#
# Environment: OUT (results), IFD_GPU_DEPS (default .gpu-deps), IFD_GPU_BUILD (default
# build-gpu-bench), IFD_GPU_NO_DPKG=1 (unpack with Python even where dpkg-deb exists).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

mode=gpu
tests=1
for a in "$@"; do
  case "$a" in
    --rehearse) mode=rehearse ;;
    --no-test) tests=0 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "bench/gpu.sh: unknown argument '$a': expected --rehearse, --no-test or --help" >&2
      exit 2
      ;;
  esac
done

deps=${IFD_GPU_DEPS:-.gpu-deps}
dir=${IFD_GPU_BUILD:-build-gpu-bench}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
out=${OUT:-$dir/results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee "$out/gpu.log") 2>&1
tee_pid=$!
t0=$(date +%s)
results=()
failed=0
record() { # step, ok|FAILED|skipped, detail
  results+=("$(printf '%-10s %-7s %s' "$1" "$2" "$3")")
  if [ "$2" = FAILED ]; then failed=1; fi
  echo "bench/gpu.sh: $1: $2${3:+: $3}"
}
finish() {
  echo
  echo "== bench/gpu.sh ($mode) after $(($(date +%s) - t0)) s; results in $out"
  printf '%s\n' "${results[@]}"
  if [ "$failed" = 1 ]; then echo "bench/gpu.sh: FAILED"; else echo "bench/gpu.sh: ok"; fi
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null || true # tee has written all of it before this script ends
  exit "$failed"
}
die() { # step, detail: a step the rest cannot do without
  record "$1" FAILED "$2"
  finish
}

# ---- 0. what is here
echo "== bench/gpu.sh $mode on $(uname -m), $(ldd --version 2>/dev/null | head -1 || echo 'glibc ?')"
if [ "$mode" = gpu ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "bench/gpu.sh: no NVIDIA GPU here (nvidia-smi is missing or sees no device); on a" \
         "machine without one, run bash bench/gpu.sh --rehearse" >&2
    exit 1
  fi
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
export PATH="$PATH:/usr/local/cuda/bin"
for tool in nvcc cmake python3 cc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    die setup "$tool is not installed; the GPU check needs the CUDA toolkit, CMake, a C compiler and python3"
  fi
done
echo "nvcc: $(nvcc --version | tail -1); cmake: $(cmake --version | head -1);" \
     "cc: $(cc --version | head -1); python3: $(python3 --version 2>&1) at $(command -v python3)"
if ! python3 -c 'import numpy, pytest' 2>/dev/null; then
  echo "bench/gpu.sh: python3 lacks numpy or pytest: the e2e step will fail"
fi
if [ ! -d "$deps/debs" ]; then
  die setup "$deps/debs is missing: run bench/gpu-prep.sh on the development machine and carry $deps"
fi

# ---- 1. the private prefix
prefix=$dir/gpu-deps
unpack=(python3 bench/gpu_deps.py unpack --deps "$deps" --prefix "$prefix")
if [ "${IFD_GPU_NO_DPKG:-0}" = 1 ]; then unpack+=(--no-dpkg); fi
if ! "${unpack[@]}"; then die unpack "bench/gpu_deps.py failed (above)"; fi
# shellcheck source=/dev/null
. "$prefix/env.sh"
record unpack ok "$(find "$deps/debs" -name '*.deb' | wc -l) packages into $prefix"

# ---- 2. build
ninja=$(command -v ninja || true)
if [ -z "$ninja" ] || ! "$ninja" --version >/dev/null 2>&1; then ninja=$prefix/usr/bin/ninja; fi
if ! "$ninja" --version >/dev/null 2>&1; then ninja=""; fi
gen=()
if [ -n "$ninja" ]; then gen=(-G Ninja "-DCMAKE_MAKE_PROGRAM=$ninja"); fi

# NCCL: the toolkit's (as CMake finds it), else Python's nvidia-nccl wheel (PyTorch's images)
cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
nccl=()
toolkit_nccl=""
for f in "$cuda_root"/lib*/libnccl.so "$cuda_root"/targets/*/lib/libnccl.so \
         /usr/lib/x86_64-linux-gnu/libnccl.so; do
  if [ -s "$f" ]; then toolkit_nccl=$f; break; fi
done
if [ -z "$toolkit_nccl" ]; then
  wheel=$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0] if s else "")' 2>/dev/null || true)
  lib=$(compgen -G "$wheel/lib/libnccl.so*" | head -1 || true)
  if [ -n "$wheel" ] && [ -n "$lib" ] && [ -f "$wheel/include/nccl.h" ]; then
    echo "bench/gpu.sh: NCCL from Python's nvidia-nccl: $lib"
    nccl=("-DIFD_NCCL_LIBRARY=$lib" "-DIFD_NCCL_INCLUDE_DIR=$wheel/include")
  else
    echo "bench/gpu.sh: no libnccl.so in $cuda_root nor a Python nvidia-nccl package; CMake will say"
  fi
fi

# MPI: only where the several-hosts case can run (2 GPUs and mpirun here, with its own MPI);
# Open MPI is not carried, so on the one-GPU machine the build has none.
ngpu=0
if [ "$mode" = gpu ]; then ngpu=$(nvidia-smi -L | grep -c '^GPU' || true); fi
mpi=OFF
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then mpi=AUTO; fi

ldflags="-Wl,--disable-new-dtags -Wl,-rpath,$IFD_DEPS_LIBDIRS -Wl,-rpath-link,$IFD_DEPS_LIBDIRS"
jobs=$(nproc 2>/dev/null || echo 2)
echo "== configure and build ($jobs jobs; log: $out/build.log)"
if ! cmake -S . -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DIFD_CUDA=ON "-DIFD_MPI=$mpi" \
     "-DCMAKE_PREFIX_PATH=$prefix/usr" "-DPKG_CONFIG_EXECUTABLE=$IFD_DEPS_PKG_CONFIG" \
     "-DPython3_EXECUTABLE=$(command -v python3)" "${nccl[@]}" \
     "-DCMAKE_EXE_LINKER_FLAGS=$ldflags" "-DCMAKE_SHARED_LINKER_FLAGS=$ldflags" \
     "-DCMAKE_MODULE_LINKER_FLAGS=$ldflags" >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  die configure "cmake failed (the end of build.log above)"
fi
grep -E '^-- (infeed|Found|Checking for module)|jansson|openblas|libzmq|check' "$out/build.log" | sort -u || true
bt0=$(date +%s)
if ! cmake --build "$dir" -j "$jobs" >>"$out/build.log" 2>&1; then
  grep -E 'error|Error' "$out/build.log" | head -30
  tail -20 "$out/build.log"
  die build "the build failed (build.log)"
fi
record build ok "$(($(date +%s) - bt0)) s"

# ---- 3. every carried library from the prefix
{
  echo "# ldd of the programs and libraries the GPU check runs; * = carried in $deps"
  carried=$(for d in ${IFD_DEPS_LIBDIRS//:/ }; do ls "$d"; done | grep '\.so' | sort -u)
  bad=0
  for f in "$dir/host/infeedd" "$dir/libinfeed.so" "$dir/tests/gpu/test_gpu" \
           "$dir/tests/gpu/test_cuda_nn_ops" "$dir/tests/gpu/test_cuda_errors" \
           "$dir/device/cuda/bench_gpu" "$dir/tests/plugins/ifd_mlp2.so"; do
    echo "== ${f#"$dir"/}"
    while read -r name arrow path _; do
      [ "$arrow" = "=>" ] || continue
      mark=" "
      if grep -qxF "$name" <<<"$carried"; then
        mark="*"
        case "$path" in "$prefix"/*) ;; *) mark="!"; bad=1 ;; esac
      fi
      if [ "$path" = not ]; then mark="!"; bad=1; fi
      echo "$mark $name => $path"
    done < <(ldd "$f")
  done
  echo "bad=$bad"
} >"$out/deps.txt" 2>&1
site_zmq=$(PYTHONPATH="$IFD_DEPS_SITE" python3 -c 'import zmq; print(zmq.__file__, zmq.zmq_version())' 2>&1 || true)
echo "pyzmq: $site_zmq" >>"$out/deps.txt"
if grep -q '^bad=0$' "$out/deps.txt" && [[ "$site_zmq" == "$IFD_DEPS_SITE"/* ]]; then
  record deps ok "every carried library resolves in $prefix (deps.txt); pyzmq ${site_zmq##* }"
else
  grep -E '^(==|!)|pyzmq' "$out/deps.txt"
  record deps FAILED "a library outside the prefix or not found (! in deps.txt), or pyzmq: $site_zmq"
fi

e2e_env=(env "INFEEDD=$dir/host/infeedd" "INFEEDCTL=$dir/tools/infeedctl"
         "PYTHONPATH=$IFD_DEPS_SITE:$root/clients/python" PYTHONDONTWRITEBYTECODE=1)

# ---- rehearsal: the smoke test, up to the first CUDA call
if [ "$mode" = rehearse ]; then
  echo "== smoke test (no GPU)"
  if v=$(timeout 20 "$dir/host/infeedd" --version 2>&1); then record infeedd ok "$v"
  else record infeedd FAILED "$v"; fi
  set +e
  timeout 60 "$dir/tests/gpu/test_cuda_errors" >"$out/tests.log" 2>&1
  rc=$?
  timeout 60 "$dir/tests/gpu/test_gpu" >>"$out/tests.log" 2>&1
  rc_gpu=$?
  timeout 60 "$dir/tests/gpu/test_cuda_nn_ops" >>"$out/tests.log" 2>&1
  rc_nn=$?
  set -e
  cat "$out/tests.log"
  if [ "$rc" = 0 ]; then record cuda_errors ok "the no-GPU error path (test_cuda_errors)"
  else record cuda_errors FAILED "test_cuda_errors exit $rc"; fi
  why=$(grep -o 'no usable GPU (.*)' "$out/tests.log" | head -1)
  if [ "$rc_gpu" = 77 ]; then record first_cuda ok "test_gpu stops at the first CUDA call: $why"
  else record first_cuda FAILED "test_gpu exit $rc_gpu, expected 77 (no GPU: skipped)"; fi
  if [ "$rc_nn" = 77 ]; then record nn_ops ok "test_cuda_nn_ops stops at the first CUDA call"
  else record nn_ops FAILED "test_cuda_nn_ops exit $rc_nn, expected 77 (no GPU: skipped)"; fi
  # the Python client (carried pyzmq) against infeedd on cpu, and the cuda flag without a GPU
  if timeout 240 "${e2e_env[@]}" python3 -m pytest -q -rs -p no:cacheprovider \
       tests/e2e/test_training.py tests/e2e/test_cuda.py \
       "tests/e2e/test_cli.py::test_cuda_backend_without_gpu" >"$out/e2e.log" 2>&1; then
    record e2e ok "$(tail -1 "$out/e2e.log")"
  else
    tail -30 "$out/e2e.log"
    record e2e FAILED "$(tail -1 "$out/e2e.log")"
  fi
  # step 8's program, briefly: it runs on the carried OpenBLAS
  if timeout 60 "$dir/bench/bench_blas" --kernels keep,auto --reps 1 --seconds 0.05 \
       >"$out/bench_blas.txt" 2>&1; then
    record bench_blas ok "$(grep -c GFLOP "$out/bench_blas.txt") products (bench_blas.txt)"
  else
    tail -5 "$out/bench_blas.txt"
    record bench_blas FAILED "bench_blas.txt"
  fi
  finish
fi

# ---- 4. the GPU tests
# ctest_step STEP REGEX LIMIT LOG: the tests matching REGEX under a time limit of LIMIT seconds
# (each test LIMIT - 10), their output in LOG; a skipped test fails the step (ctest counts a
# skip as not failed, but with a GPU here a skip is an error).
ctest_step() {
  local step=$1 regex=$2 limit=$3 log=$4 rc
  set +e
  (cd "$dir" && timeout "$limit" ctest -V --timeout "$((limit - 10))" -R "$regex") >"$log" 2>&1
  rc=$?
  set -e
  grep -E '^[0-9]+/[0-9]+ Test|tests passed|:[FE]:|test_[a-z_]+: ' "$log" || true
  if [ "$rc" != 0 ]; then
    grep -E ':[FE]:' "$log" | head -20
    record "$step" FAILED "ctest exit $rc (${log##*/})"
  elif grep -q "Skipped\|Not Run" "$log"; then
    record "$step" FAILED "a test skipped although nvidia-smi sees a GPU (${log##*/})"
  elif ! grep -q '% tests passed' "$log"; then
    record "$step" FAILED "no test matches $regex (${log##*/})"
  else
    record "$step" ok "$(grep -E '% tests passed' "$log")"
  fi
}
if [ "$tests" = 1 ]; then
  # the transformer's ops first, on their own (seconds), so that their result stands even when
  # the longer suite below runs out of time
  echo "== the transformer's ops on cuda against nn_cpu (log: $out/nn_ops.log)"
  ctest_step nn_ops '^test_cuda_nn_ops$' 90 "$out/nn_ops.log"
  echo "== GPU tests (log: $out/tests.log)"
  ctest_step gpu_tests '^(test_gpu|test_cuda_errors)$' 250 "$out/tests.log"

  echo "== cuda against cpu through infeedd (log: $out/e2e.log)"
  set +e
  timeout 150 "${e2e_env[@]}" python3 -m pytest -v -rs -p no:cacheprovider \
    -o faulthandler_timeout=120 tests/e2e/test_cuda.py >"$out/e2e.log" 2>&1
  rc=$?
  set -e
  tail -5 "$out/e2e.log"
  if [ "$rc" != 0 ]; then
    record e2e_cuda FAILED "pytest exit $rc (e2e.log)"
  elif grep -qi "skipped" "$out/e2e.log"; then
    record e2e_cuda FAILED "tests/e2e/test_cuda.py skipped although nvidia-smi sees a GPU"
  else
    record e2e_cuda ok "$(tail -1 "$out/e2e.log")"
  fi
fi

# ---- 6. several hosts on cuda (docs/multihost.md): 2 ranks under mpirun, one GPU each, one NCCL
# communicator over both, against 1 rank with both GPUs (tests/e2e/test_multihost.py)
if [ "$tests" = 0 ]; then
  record hosts skipped "--no-test"
elif [ "$ngpu" -lt 2 ]; then
  record hosts skipped "$ngpu GPU here; the 2-rank case needs 2 (one a rank)"
elif [ "$mpi" = OFF ]; then
  record hosts skipped "mpirun is not installed (scripts/deps.sh installs openmpi-bin libopenmpi-dev)"
elif ! OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       mpirun -np 2 "$dir/host/infeedd" --version >/dev/null 2>&1; then
  record hosts skipped "infeedd was built without MPI (its -dev package is missing)"
else
  set +e
  timeout 300 "${e2e_env[@]}" IFD_TEST_CUDA_HOSTS=1 python3 -m pytest -q -rs -p no:cacheprovider \
    tests/e2e/test_multihost.py -k cuda >"$out/hosts.log" 2>&1
  rc=$?
  set -e
  tail -5 "$out/hosts.log"
  if [ "$rc" != 0 ]; then record hosts FAILED "pytest exit $rc (hosts.log)"
  elif grep -qi "skipped" "$out/hosts.log"; then
    record hosts FAILED "the 2-rank cuda case skipped although MPI and $ngpu GPUs are here"
  else record hosts ok "$(tail -1 "$out/hosts.log")"; fi
fi

# ---- 7. bench_gpu
echo "== bench_gpu (table: $out/bench_gpu.txt)"
set +e
timeout 120 "$dir/device/cuda/bench_gpu" >"$out/bench_gpu.txt" 2>&1
rc=$?
set -e
cat "$out/bench_gpu.txt"
if [ "$rc" = 0 ]; then record bench_gpu ok "bench_gpu.txt"
else record bench_gpu FAILED "exit $rc"; fi

# ---- 8. bench_blas: the CPU's kernels (one thread; about half a minute)
echo "== bench_blas (table: $out/bench_blas.txt)"
set +e
lscpu | grep -E '^(Model name|CPU family|Model|Flags):' | cut -c1-200 >"$out/bench_blas.txt"
timeout 120 "$dir/bench/bench_blas" >>"$out/bench_blas.txt" 2>&1
rc=$?
set -e
cat "$out/bench_blas.txt"
if [ "$rc" = 0 ]; then record bench_blas ok "bench_blas.txt"
else record bench_blas FAILED "exit $rc"; fi
finish
