#!/usr/bin/env python3
"""Scores a trained digits model on the rows train_digits.py --holdout left out: streams them to
an infeedd in eval mode (and prints its eval summary) or in predict mode (and compares the
predicted classes with the labels).

    infeedd --checkpoint-dir ck ... --steps 600 &                   # train, checkpoints in ck
    python3 examples/digits/train_digits.py --holdout 297
    infeedd --mode eval --steps 4 --checkpoint-dir ck ... &         # the latest checkpoint
    python3 examples/digits/score_digits.py --mode eval --holdout 297
    infeedd --mode predict --checkpoint-dir ck ... &
    python3 examples/digits/score_digits.py --mode predict --holdout 297

The held-out rows are the same as train_digits.py's for the same --seed and --holdout. Eval mode
takes full batches only: the rows past the last full batch are not sent (the daemon's --steps
must be at most that many batches). Predict mode sends every row, the last batch partial; the
daemon pads it, and the predictions come back without the padding.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:
    import infeed
except ImportError:  # run from a checkout without installing the client
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "clients", "python"))
    import infeed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import load_digits  # noqa: E402 - the same data, the same shuffle


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("eval", "predict"), required=True,
                    help="the daemon's --mode")
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555",
                    help="the daemon's --listen endpoint (default %(default)s)")
    ap.add_argument("--publish", default="tcp://127.0.0.1:5556",
                    help="the daemon's --publish endpoint, for the eval summary (default "
                         "%(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="train_digits.py's --seed")
    ap.add_argument("--holdout", type=int, required=True, help="train_digits.py's --holdout")
    ap.add_argument("--name", default="digits-scorer", help="the producer's name")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds to wait for the daemon before giving up (default %(default)s)")
    args = ap.parse_args(argv)

    x, y = load_digits(args.seed)
    if not 0 < args.holdout < len(y):
        print(f"score_digits: --holdout: expected 1 to {len(y) - 1} rows, got {args.holdout}",
              file=sys.stderr)
        return 2
    x, y = x[len(y) - args.holdout:], y[len(y) - args.holdout:]
    # The subscriber connects before the first batch: a PUB drops what comes before.
    sub = infeed.Subscriber(args.publish, timeout=args.timeout) if args.mode == "eval" else None
    try:
        with infeed.Producer(args.endpoint, name=args.name, timeout=args.timeout) as p:
            if args.mode == "eval":
                # The WELCOME says the batch size; eval takes full batches only.
                p.hello([("x", "float32", (x.shape[1],)), ("y", "int32", ())])
                bs = int(p.batch_size)
                nb = len(y) // bs
                print(f"eval: {nb} batches of {bs} held-out rows ({len(y) - nb * bs} left over)")
                for b in range(nb):
                    p.send(x=x[b * bs:(b + 1) * bs], y=y[b * bs:(b + 1) * bs])
            else:
                p.hello([("x", "float32", (x.shape[1],))])
                bs = int(p.batch_size)
                for b in range(0, len(y), bs):
                    p.send(x=x[b:b + bs])
                got = list(p.predictions())
                classes = np.concatenate([out["classes"] for _, out in got])
                if len(classes) != len(y):
                    print(f"score_digits: {len(classes)} predictions for {len(y)} rows",
                          file=sys.stderr)
                    return 1
                acc = float((classes == y).mean())
                print(f"predict: {len(got)} batches, {len(classes)} predictions; held-out "
                      f"accuracy from the predicted classes: {acc:.3f}")
    except (infeed.InfeedError, TimeoutError) as e:
        print(f"score_digits: {e}", file=sys.stderr)
        return 1
    if sub is not None:
        try:
            for s in sub:
                if s.get("event") == "eval":
                    print(f"eval: global step {s['global_step']}, loss {s['loss']:.3f}, held-out "
                          f"accuracy {s['accuracy']:.3f} over {s['examples']} rows")
        except TimeoutError:
            pass
        sub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
