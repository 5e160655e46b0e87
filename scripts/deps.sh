#!/usr/bin/env bash
# Installs the Debian packages infeed needs to build and test, when any is missing.
# Sourced or run by ./ci.sh and ./demo.sh; safe to run again.
set -euo pipefail

IFD_DEB_PACKAGES=(build-essential cmake pkg-config libjansson-dev check libsubunit-dev
                  libopenblas-dev)

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
