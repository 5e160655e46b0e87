#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts infeedd on the cpu backend with 2 replicas,
# streams scikit-learn's digits data set to it with the Python producer, prints each summary as it
# arrives and ends with the accuracy.
#
#   ./demo.sh                       the demo
#   ./demo.sh --steps 1200 ...      extra flags go to infeedd (see ./build/host/infeedd --help)
set -euo pipefail
cd "$(dirname "$0")"
./scripts/deps.sh
echo "== building infeedd"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DIFD_CUDA=OFF >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target infeedd >/dev/null

# Free loopback ports for the ingest, summaries and control sockets.
read -r LISTEN PUBLISH CONTROL < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[f"tcp://127.0.0.1:{s.getsockname()[1]}" for s in socks])
PY
)
SUMMARIES=build/demo-summaries.jsonl
rm -f "$SUMMARIES"
echo "== infeedd: softmax on 2 cpu replicas, digits (64 features, 10 classes), 600 steps"
./build/host/infeedd --replicas 2 --program softmax --features 64 --classes 10 \
  --batch-size 64 --iterations-per-loop 20 --steps 600 --summary-every 50 \
  --learning-rate 0.5 --listen "$LISTEN" --publish "$PUBLISH" --control "$CONTROL" \
  --summaries "$SUMMARIES" --log-level warn "$@" &
DAEMON=$!
trap 'kill "$DAEMON" 2>/dev/null || true' EXIT
PYTHONPATH=clients/python python3 examples/digits/train_digits.py \
  --endpoint "$LISTEN" --publish "$PUBLISH"
status=0
wait "$DAEMON" || status=$?
trap - EXIT
echo "== infeedd exited with status $status; every summary is in $SUMMARIES"
exit "$status"
