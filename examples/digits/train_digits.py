#!/usr/bin/env python3
"""Trains infeedd's softmax or mlp program on scikit-learn's digits (8x8 images, 10 classes).

Start the daemon, then this script:

    infeedd --replicas 2 --program softmax --features 64 --classes 10 --batch-size 64 \\
            --iterations-per-loop 20 --steps 600 --summary-every 50 &
    PYTHONPATH=clients/python python3 examples/digits/train_digits.py

or, with one hidden layer of 64 units:

    infeedd --replicas 2 --program mlp --hidden 64 --features 64 --classes 10 ... &
    PYTHONPATH=clients/python python3 examples/digits/train_digits.py --program mlp --hidden 64

The model is the daemon's: --program and --hidden say what this script expects it to run, and
it stops before sending anything when the daemon's WELCOME says otherwise.

The script streams shuffled epochs of full batches (the daemon's batch_size, from its WELCOME;
the last partial batch of each epoch is dropped, as train mode takes full batches only) until
the daemon ends the run (it reached its last step) or --epochs are sent, while a subscriber
thread prints each summary as it arrives. The digits data ships with scikit-learn: nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

try:
    import infeed
except ImportError:  # run from a checkout without installing the client
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "clients", "python"))
    import infeed


def load_digits(seed: int):
    from sklearn.datasets import load_digits as sk_load_digits

    d = sk_load_digits()
    x = (d.data / 16.0).astype(np.float32)  # pixels 0..16 -> [0, 1]
    y = d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    return np.ascontiguousarray(x[order]), np.ascontiguousarray(y[order])


class Printer(threading.Thread):
    """Prints every summary from the daemon's PUB socket, one line each, until the end one."""

    def __init__(self, sub: infeed.Subscriber):
        super().__init__(name="summaries", daemon=True)
        self.sub = sub
        self.last_train = None
        self.end = None
        self.stop_event = threading.Event()

    def run(self):
        while not self.stop_event.is_set() and self.end is None:
            try:
                s = self.sub.recv(timeout=0.2)
            except TimeoutError:
                continue
            print(infeed.format_summary(s), flush=True)
            if s.get("event") == "train":
                self.last_train = s
            elif s.get("event") == "end":
                self.end = s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555",
                    help="the daemon's --listen endpoint (default %(default)s)")
    ap.add_argument("--publish", default="tcp://127.0.0.1:5556",
                    help="the daemon's --publish endpoint (default %(default)s)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs to stream at most (default: until the daemon ends the run)")
    ap.add_argument("--seed", type=int, default=0, help="shuffling seed (default %(default)s)")
    ap.add_argument("--name", default="digits", help="the producer's name")
    ap.add_argument("--program", default=None,
                    help="the program the daemon must run: softmax or mlp (default: any)")
    ap.add_argument("--hidden", type=int, default=None,
                    help="mlp: the hidden width the daemon must use (default: any)")
    ap.add_argument("--holdout", type=int, default=0,
                    help="rows at the end of the shuffled set to leave out, for "
                         "score_digits.py to evaluate on (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds to wait for the daemon before giving up (default %(default)s)")
    args = ap.parse_args(argv)

    x, y = load_digits(args.seed)
    if not 0 <= args.holdout < len(y):
        print(f"train_digits: --holdout: expected 0 to {len(y) - 1} rows, got {args.holdout}",
              file=sys.stderr)
        return 2
    x, y = x[:len(y) - args.holdout], y[:len(y) - args.holdout]
    rng = np.random.default_rng(args.seed + 1)
    schema = [("x", "float32", (x.shape[1],)), ("y", "int32", ())]

    # The subscriber connects before the first batch: a PUB drops what comes before.
    sub = infeed.Subscriber(args.publish)
    printer = Printer(sub)
    printer.start()
    t0 = time.monotonic()
    try:
        producer = infeed.Producer(args.endpoint, name=args.name, schema=schema,
                                   timeout=args.timeout)
    except infeed.InfeedError as e:
        print(f"train_digits: the daemon refused the digits schema: {e}", file=sys.stderr)
        return 1
    except TimeoutError as e:
        print(f"train_digits: {e}", file=sys.stderr)
        return 1
    w = producer.welcome
    hidden = w.get("settings", {}).get("hidden")
    wrong = []
    if args.program is not None and w["program"] != args.program:
        wrong.append(f"program {w['program']!r}, expected {args.program!r}")
    if args.hidden is not None and hidden != args.hidden:
        wrong.append(f"hidden width {hidden}, expected {args.hidden}")
    if wrong:
        print(f"train_digits: the daemon runs {' and '.join(wrong)} (start it with --program and "
              f"--hidden as this script's)", file=sys.stderr)
        producer.close()
        return 1
    bs = int(w["batch_size"])
    per_epoch = len(y) // bs
    model = w["program"] + (f" (hidden {hidden})" if hidden else "")
    print(f"streaming {len(y)} digits, {per_epoch} batches of {bs} per epoch, to {model} "
          f"on {w['replicas']} replicas (credit {w['credit']})", flush=True)
    if per_epoch == 0:
        print(f"train_digits: batch_size {bs} is larger than the data set ({len(y)} rows)",
              file=sys.stderr)
        return 1

    sent = 0
    epoch = 0
    ended_by_daemon = False
    try:
        while args.epochs is None or epoch < args.epochs:
            order = rng.permutation(len(y))
            for b in range(per_epoch):
                idx = order[b * bs:(b + 1) * bs]
                producer.send(x=x[idx], y=y[idx])  # fancy indexing makes fresh arrays
                sent += 1
            epoch += 1
    except infeed.RunEnded:
        ended_by_daemon = True  # the daemon reached its last step: no more batches wanted
    except KeyboardInterrupt:
        producer.close()
        return 130
    try:
        bye = producer.end(timeout=args.timeout)
    except (infeed.InfeedError, TimeoutError) as e:
        print(f"train_digits: {e}", file=sys.stderr)
        producer.close()
        return 1
    producer.close()

    # Give the last summaries a moment to arrive.
    deadline = time.monotonic() + 5
    while printer.end is None and time.monotonic() < deadline:
        time.sleep(0.02)
    printer.stop_event.set()
    printer.join(2)
    sub.close()

    took = time.monotonic() - t0
    how = "the daemon ended the run" if ended_by_daemon else f"{epoch} epochs sent"
    print(f"sent {sent} batches ({sent * bs} rows) in {took:.1f} s; {how}")
    if bye is not None:
        print(f"run: {bye.get('status')} ({bye.get('reason')}) at global step "
              f"{bye.get('global_step')}, {producer.acked_seq + 1} batches trained on")
    if printer.last_train is not None and "accuracy" in printer.last_train:
        print(f"final training accuracy: {printer.last_train['accuracy']:.3f} "
              f"(loss {printer.last_train['loss']:.3f}, steps up to "
              f"{printer.last_train['global_step']})")
    else:
        print("final training accuracy: unknown (no train summary arrived on the PUB socket)")
    if bye is not None and bye.get("status") != "ok":
        print(f"train_digits: the run ended with an error: {bye.get('message')}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
