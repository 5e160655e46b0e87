#!/usr/bin/env bash
# Trains the example plugin mlp2 (two hidden layers, tanh then ReLU, L2 weight decay) on
# scikit-learn's digits, as ../../demo.sh trains the built-in softmax: builds and installs infeed
# into build/prefix, builds this folder out of tree against that prefix (find_package(infeed)),
# starts infeedd --program-lib on 2 cpu replicas and streams the digits to it with the Python
# producer, printing each summary.
#
#   examples/custom_program/train.sh                    the run
#   examples/custom_program/train.sh --steps 1200 ...   extra flags go to infeedd
#   MLP2=path/to/mlp2.so examples/custom_program/train.sh
#                                                       skip the builds, use this plugin
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=$PWD/build/prefix
PLUGIN_BUILD=$PWD/build/custom_program
JOBS=$(nproc 2>/dev/null || echo 2)
if [ -z "${MLP2:-}" ]; then
  echo "== building and installing infeed into $PREFIX"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DIFD_CUDA=OFF >/dev/null
  cmake --build build -j "$JOBS" >/dev/null
  cmake --install build --prefix "$PREFIX" >/dev/null
  echo "== building the plugin out of tree: $PLUGIN_BUILD"
  cmake -S examples/custom_program -B "$PLUGIN_BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
  cmake --build "$PLUGIN_BUILD" -j "$JOBS" >/dev/null
  MLP2=$PLUGIN_BUILD/mlp2.so
fi
INFEEDD=${INFEEDD:-$PREFIX/bin/infeedd}
[ -x "$INFEEDD" ] || INFEEDD=build/host/infeedd

# infeedd binds loopback ports the system chooses and names them in its ready file.
source scripts/infeedd-ready.sh
READY=build/custom-program-infeedd.ready.json
SUMMARIES=build/custom-program-summaries.jsonl
rm -f "$SUMMARIES"
export PYTHONPATH=clients/python

echo "== train: mlp2 from $MLP2 on 2 cpu replicas, digits (64 features, 10 classes, hidden 32)"
"$INFEEDD" --program-lib "$MLP2" --program mlp2 --features 64 --classes 10 --hidden 32 \
  --replicas 2 --batch-size 64 --iterations-per-loop 20 --steps 600 --summary-every 50 \
  --learning-rate 0.1 --listen 'tcp://127.0.0.1:*' --publish 'tcp://127.0.0.1:*' \
  --control 'tcp://127.0.0.1:*' --ready-file "$READY" --log-level warn \
  --summaries "$SUMMARIES" "$@" &
daemon=$!
trap 'kill "$daemon" 2>/dev/null || true' EXIT
status=0
if infeedd_ready "$READY" "$daemon"; then
  python3 examples/digits/train_digits.py --endpoint "$LISTEN" --publish "$PUBLISH" \
    --program mlp2 --hidden 32 || status=$?
fi
wait "$daemon" || status=$?
trap - EXIT
echo "== done (exit $status): every summary is in $SUMMARIES"
exit "$status"
