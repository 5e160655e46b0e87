#!/usr/bin/env bash
# The GPU benchmark and tests, for a machine with an NVIDIA GPU: builds a Release tree of its
# own (build-gpu-bench/), runs the GPU test suite (test_gpu, test_cuda_errors), then bench_gpu:
#   - infeed host-to-device GB/s through the backend vs plain pinned cudaMemcpyAsync, by size;
#   - steps/s with CUDA Graphs off and on, and the fraction of each loop the GPU sat idle
#     waiting for infeed;
#   - the NCCL all-reduce time per step;
# and, with MPI and 2 GPUs or more, training over 2 ranks (one GPU each, one NCCL communicator)
# against 1 rank with 2 GPUs; otherwise it prints why that case was skipped.
#
#   bench/gpu.sh            build, test, bench
#   bench/gpu.sh --no-test  build, bench
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bench/gpu.sh: no NVIDIA GPU here (nvidia-smi is missing or sees no device); nothing to do" >&2
  exit 1
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "bench/gpu.sh: the CUDA toolkit (nvcc) is not installed; the cuda backend cannot be built" >&2
  exit 1
fi
export PATH="$PATH:/usr/local/cuda/bin"
nvidia-smi -L

dir=build-gpu-bench
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DIFD_CUDA=ON
cmake --build "$dir" -j "$jobs"

if [ "${1:-}" != "--no-test" ]; then
  echo "== GPU tests"
  (cd "$dir" && ctest --output-on-failure -R 'test_gpu|test_cuda_errors') | tee "$dir/gpu-tests.log"
  # ctest counts a skipped test as not failed: with a GPU here a skip is an error.
  if grep -q "Skipped" "$dir/gpu-tests.log"; then
    echo "bench/gpu.sh: test_gpu skipped although nvidia-smi sees a GPU" >&2
    exit 1
  fi
fi

# Several hosts on the cuda backend (docs/multihost.md): 2 ranks under mpirun, one GPU each, one
# NCCL communicator over both, against 1 rank with both GPUs (tests/e2e/test_multihost.py).
echo "== several hosts (cuda)"
ngpu=$(nvidia-smi -L | grep -c '^GPU' || true)
if ! command -v mpirun >/dev/null 2>&1; then
  echo "bench/gpu.sh: several hosts: skipped: mpirun is not installed (scripts/deps.sh installs" \
       "openmpi-bin libopenmpi-dev)"
elif [ "$ngpu" -lt 2 ]; then
  echo "bench/gpu.sh: several hosts: skipped: $ngpu GPU here; the 2-rank case needs 2 (one a rank)"
elif ! OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       mpirun -np 2 "$dir/host/infeedd" --version >/dev/null 2>&1; then
  echo "bench/gpu.sh: several hosts: skipped: infeedd was built without MPI (libopenmpi-dev missing)"
else
  IFD_TEST_CUDA_HOSTS=1 INFEEDD="$dir/host/infeedd" PYTHONPATH=clients/python \
    python3 -m pytest -q -rs -p no:cacheprovider tests/e2e/test_multihost.py -k cuda \
    | tee "$dir/gpu-hosts.log"
  if grep -qi "skipped" "$dir/gpu-hosts.log"; then
    echo "bench/gpu.sh: the 2-rank cuda case skipped although MPI and $ngpu GPUs are here" >&2
    exit 1
  fi
fi

echo "== bench_gpu"
"$dir/device/cuda/bench_gpu"
