#!/usr/bin/env bash
# Installs what infeed needs to build, test and run its demo, when anything is missing: the
# Debian packages (apt-get) and the Python client's packages (pip).
# Sourced or run by ./ci.sh and ./demo.sh; safe to run again.
set -euo pipefail

# clang and libclang-rt-dev (libFuzzer's runtime): the fuzz harnesses (fuzz/run.sh).
# libxsmm-dev (optional for the build, which falls back to OpenBLAS without it): the attention's
# small products (docs/design.md, "The BLAS kernel").
IFD_DEB_PACKAGES=(build-essential cmake pkg-config libjansson-dev check libsubunit-dev
                  libopenblas-dev libzmq3-dev zlib1g-dev clang libclang-rt-dev openmpi-bin
                  libopenmpi-dev libxsmm-dev)
# tensorboardX: python -m infeed.tensorboard; matplotlib: python -m infeed.plot (the demo's PNG);
# tensorboard: the tests read the event files back with its EventAccumulator. safetensors:
# python -m infeed.export --safetensors (and the tests read its files back with it).
IFD_PY_MODULES=(zmq numpy sklearn pytest tensorboardX matplotlib tensorboard safetensors) # import names
IFD_PIP_PACKAGES=(pyzmq numpy scikit-learn pytest tensorboardX matplotlib tensorboard safetensors) # pip names

missing=()
for p in "${IFD_DEB_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y "${missing[@]}"
fi

PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "deps: installing python3"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y python3 python3-pip
fi
pip_missing=()
for i in "${!IFD_PY_MODULES[@]}"; do
  if ! "$PYTHON" -c "import ${IFD_PY_MODULES[$i]}" >/dev/null 2>&1; then
    pip_missing+=("${IFD_PIP_PACKAGES[$i]}")
  fi
done
if [ ${#pip_missing[@]} -gt 0 ]; then
  echo "deps: pip installing ${pip_missing[*]}"
  if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y python3-pip
  fi
  "$PYTHON" -m pip install --quiet "${pip_missing[@]}" ||
    "$PYTHON" -m pip install --quiet --break-system-packages "${pip_missing[@]}"
fi
