#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts infeedd on the cpu backend with 2 replicas,
# streams scikit-learn's digits data set to it with the Python producer (all but 297 held-out
# rows), prints each summary as it arrives and the training accuracy, checkpointing as it goes.
# Then it evaluates the last checkpoint on the held-out rows (eval mode) and predicts their
# classes (predict mode), each with its own infeedd, and draws the training run into a PNG
# (python -m infeed.plot).
#
#   ./demo.sh                       the demo
#   ./demo.sh --steps 1200 ...      extra flags go to the training infeedd (./build/host/infeedd
#                                   --help lists them)
#
# Environment: INFEEDD=PATH runs that infeedd instead of installing and building one (the tests
# do); DEMO_OUT=DIR puts the summaries, checkpoints, predictions and plot there (default build).
set -euo pipefail
cd "$(dirname "$0")"
if [ -z "${INFEEDD:-}" ]; then
  ./scripts/deps.sh
  echo "== building infeedd and the libraries (cmake --install build then installs them)"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DIFD_CUDA=OFF >/dev/null
  cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target install-set >/dev/null
  INFEEDD=./build/host/infeedd
fi
OUT=${DEMO_OUT:-build}
mkdir -p "$OUT"

# Each infeedd binds loopback ports the system chooses and names them in its ready file
# (scripts/infeedd-ready.sh): no port is picked here that another program could take first.
source scripts/infeedd-ready.sh
READY=$OUT/demo-infeedd.ready.json

SUMMARIES=$OUT/demo-summaries.jsonl
CHECKPOINTS=$OUT/demo-checkpoints
PREDICTIONS=$OUT/demo-predictions.jsonl
HOLDOUT=297 # of digits' 1797 rows: 1500 to train on
rm -rf "$SUMMARIES" "$CHECKPOINTS" "$PREDICTIONS"
MODEL=(--replicas 2 --program softmax --features 64 --classes 10 --batch-size 64)
# The flags that define the model (and so the checkpoint) go to every phase, the rest to the
# training run only: ./demo.sh --program mlp --hidden 32 trains, evaluates and predicts an mlp.
TRAIN=()
while [ $# -gt 0 ]; do
  case "$1" in
    --program=* | --hidden=* | --features=* | --classes=* | --replicas=* | --batch-size=*)
      MODEL+=("$1") ;;
    --program | --hidden | --features | --classes | --replicas | --batch-size)
      MODEL+=("$1" "${2:?$1 needs a value}"); shift ;;
    *) TRAIN+=("$1") ;;
  esac
  shift
done
ENDPOINTS=(--listen 'tcp://127.0.0.1:*' --publish 'tcp://127.0.0.1:*' --control 'tcp://127.0.0.1:*'
  --ready-file "$READY" --log-level warn)
export PYTHONPATH=clients/python

# Runs infeedd in the background with the given flags, waits until it is ready (LISTEN, PUBLISH
# and CONTROL name its endpoints then), runs the producer command after "--" (a function that
# reads them), then waits for both; returns the daemon's exit status. When the daemon exits
# first with an error, the producer is stopped at once (it would wait for a daemon that is gone).
phase() {
  local args=() status=0
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  "$INFEEDD" "${MODEL[@]}" "${ENDPOINTS[@]}" --summaries "$SUMMARIES" "${args[@]}" &
  local daemon=$!
  trap 'kill "$daemon" 2>/dev/null || true' EXIT
  if ! infeedd_ready "$READY" "$daemon"; then
    wait "$daemon" || status=$?
    echo "demo: infeedd exited with status $status before the producer could start" >&2
    trap - EXIT
    [ "$status" != 0 ] || status=1
    return "$status"
  fi
  "$@" &
  local producer=$!
  trap 'kill "$daemon" "$producer" 2>/dev/null || true' EXIT
  while kill -0 "$producer" 2>/dev/null; do
    if ! kill -0 "$daemon" 2>/dev/null; then
      wait "$daemon" || status=$?
      if [ "$status" != 0 ]; then
        echo "demo: infeedd exited with status $status before the producer finished;" \
          "stopping the producer" >&2
        kill "$producer" 2>/dev/null || true
        wait "$producer" 2>/dev/null || true
        trap - EXIT
        return "$status"
      fi
      break
    fi
    sleep 0.1
  done
  wait "$producer" || status=$?
  if [ "$status" != 0 ] && kill -0 "$daemon" 2>/dev/null; then
    echo "demo: the producer failed (status $status); stopping infeedd" >&2
    kill -TERM "$daemon" 2>/dev/null || true
  fi
  local ds=0
  wait "$daemon" || ds=$?
  [ "$ds" = 0 ] || status=$ds
  trap - EXIT
  return "$status"
}

# The producers, run by phase once LISTEN and PUBLISH name the daemon's endpoints.
train_digits() {
  python3 examples/digits/train_digits.py --endpoint "$LISTEN" --publish "$PUBLISH" \
    --holdout "$HOLDOUT"
}
score_digits() { # eval | predict
  python3 examples/digits/score_digits.py --mode "$1" --endpoint "$LISTEN" \
    --publish "$PUBLISH" --holdout "$HOLDOUT"
}

echo "== train: ${MODEL[*]} on the cpu backend, digits (64 features, 10 classes), 600 steps," \
  "a checkpoint every 200"
phase --iterations-per-loop 20 --steps 600 --summary-every 50 --learning-rate 0.5 \
  --checkpoint-dir "$CHECKPOINTS" --checkpoint-every 200 ${TRAIN[@]+"${TRAIN[@]}"} -- \
  train_digits
echo "== checkpoints: $(ls "$CHECKPOINTS" | tr '\n' ' ')"

echo "== eval: the last checkpoint on the $HOLDOUT held-out rows (4 full batches)"
phase --mode eval --steps 4 --checkpoint-dir "$CHECKPOINTS" -- score_digits eval

echo "== predict: the held-out rows' classes (the last batch partial, padded by the daemon)"
phase --mode predict --checkpoint-dir "$CHECKPOINTS" --predictions "$PREDICTIONS" -- \
  score_digits predict
PLOT=$OUT/demo-run.png
python3 -m infeed.plot "$SUMMARIES" -o "$PLOT" --title "demo: ${MODEL[*]}" >/dev/null
echo "== plot: loss, accuracy, examples/s and infeed wait against the step: $PLOT"
echo "== done: every summary is in $SUMMARIES, every prediction in $PREDICTIONS"
