"""Writes infeedd's summaries as TensorBoard scalars (tensorboardX event files).

    python -m infeed.tensorboard --from run.jsonl --logdir runs/a
    python -m infeed.tensorboard --subscribe tcp://127.0.0.1:5556 --logdir runs/a

Each train, eval and predict summary becomes the scalars ``EVENT/KEY`` at its global step and
time (``train/loss``, ``train/accuracy``, ``train/examples_per_sec``,
``train/infeed_wait_fraction``, ``eval/loss``...; docs/summaries.md); the end summary becomes
the text ``end``. The host calls' numbers become scalars too (``train/confidence/mean``) and their
histograms TensorBoard histograms (``train/confidence/histogram``). ``--subscribe`` follows a live run until its end summary; ``--from`` converts
a ``--summaries`` file. Then ``tensorboard --logdir runs``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, Optional

from .runlog import histograms, read_summaries, scalars


def write_histogram(w, tag: str, step: int, h: dict, walltime) -> None:
    """One host call's histogram (TensorBoard's HistogramProto fields: docs/summaries.md) as a
    TensorBoard histogram. A run of empty buckets becomes one, as TensorFlow's writer does
    (Histogram::EncodeToProto without preserve_zero_buckets)."""
    limits, counts = h["bucket_limit"], h["bucket"]
    if len(limits) != len(counts):
        raise ValueError(f"{tag} at step {step}: a histogram with {len(limits)} bucket limits "
                         f"and {len(counts)} counts")
    lim, cnt = [], []
    for end, c in zip(limits, counts):
        if c <= 0 and cnt and cnt[-1] <= 0:
            lim[-1] = end  # the run of empty buckets goes on
        else:
            lim.append(end)
            cnt.append(c)
    w.add_histogram_raw(tag, min=h["min"], max=h["max"], num=h["num"], sum=h["sum"],
                        sum_squares=h["sum_squares"], bucket_limits=lim, bucket_counts=cnt,
                        global_step=step, walltime=walltime)


def write_summaries(summaries: Iterable[dict], logdir: str, flush_each: bool = False) -> int:
    """Writes the summaries into an event file under logdir: their scalars, and the histograms
    of their host calls; returns the values written."""
    from tensorboardX import SummaryWriter

    n = 0
    with SummaryWriter(logdir=logdir) as w:
        for s in summaries:
            t = s.get("time") if isinstance(s.get("time"), (int, float)) else None
            for tag, step, value in scalars(s):
                w.add_scalar(tag, value, global_step=step, walltime=t)
                n += 1
            for tag, step, h in histograms(s):
                write_histogram(w, tag, step, h, t)
                n += 1
            if s.get("event") == "end":
                w.add_text("end", json.dumps(s, sort_keys=True),
                           global_step=s.get("global_step") if isinstance(
                               s.get("global_step"), int) else None, walltime=t)
            if flush_each:
                w.flush()
    return n


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m infeed.tensorboard",
        description="Writes infeedd's summaries (train, eval, predict) as TensorBoard scalars "
                    "with tensorboardX: from a live daemon's PUB socket or a --summaries file.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--subscribe", metavar="ENDPOINT",
                     help="the daemon's --publish endpoint: follow the run until its end")
    src.add_argument("--from", dest="path", metavar="RUN.jsonl",
                     help="a --summaries JSON Lines file")
    ap.add_argument("--logdir", required=True, metavar="DIR",
                    help="where the event file goes (tensorboard --logdir DIR)")
    ap.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                    help="--subscribe: give up after this long without a summary (default: "
                         "wait for the end summary)")
    ap.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS",
                    help="--subscribe: how long to wait for the daemon to answer (default: 10)")
    ap.add_argument("--server-key", metavar="FILE", help="CURVE: the daemon's .pub")
    ap.add_argument("--key-file", metavar="FILE", help="CURVE: this client's .key")
    a = ap.parse_args(argv)
    try:
        if a.path is not None:
            n = write_summaries(read_summaries(a.path), a.logdir)
        else:
            from .subscriber import Subscriber

            with Subscriber(a.subscribe, timeout=a.timeout, connect_timeout=a.connect_timeout,
                            server_key_file=a.server_key, key_file=a.key_file) as sub:
                n = write_summaries(sub, a.logdir, flush_each=True)
    except ImportError as e:
        print(f"infeed.tensorboard: {e}: pip install tensorboardX", file=sys.stderr)
        return 1
    except (OSError, ValueError, TimeoutError) as e:
        print(f"infeed.tensorboard: {e}", file=sys.stderr)
        return 1
    print(f"infeed.tensorboard: {n} values (scalars and histograms) written to {a.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
