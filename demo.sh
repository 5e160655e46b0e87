#!/usr/bin/env bash
# The demo: installs what is missing, builds, and trains the softmax program in-process on 2 cpu
# replicas over a synthetic stream, printing each JSON summary as it arrives.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target infeed-demo >/dev/null
exec ./build/infeed-demo --replicas 2 --steps 300 "$@"
