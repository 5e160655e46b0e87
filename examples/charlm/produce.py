#!/usr/bin/env python3
"""Streams random windows of a text file to an infeedd running charlm (train or eval mode).

    python3 examples/charlm/produce.py --block 64 [--corpus FILE_OR_FOLDER]

Each row is block + 1 consecutive bytes of the corpus (default: the project's own docs and
sources): tokens the first block, targets the last block. The windows are a function of --seed,
so a restarted producer (the same --name) resumes where the daemon's checkpoint says.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

try:
    import infeed
except ImportError:  # run from a checkout without installing the client
    sys.path.insert(0, os.path.join(corpus.ROOT, "clients", "python"))
    import infeed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555",
                    help="the daemon's --listen endpoint (default %(default)s)")
    ap.add_argument("--corpus", action="append",
                    help="a text file or folder (repeatable; default: the project's docs and "
                         "sources)")
    ap.add_argument("--block", type=int, default=64, help="the program's block (default 64)")
    ap.add_argument("--windows", type=int, default=0,
                    help="windows to send in all (default 0: until the daemon's --steps end "
                         "the run)")
    ap.add_argument("--seed", type=int, default=0, help="the windows' seed (default 0)")
    ap.add_argument("--name", default="charlm-text", help="the producer's name")
    args = ap.parse_args(argv)
    data = corpus.load(args.corpus)
    print(f"corpus: {data.size} bytes, unigram entropy {corpus.unigram_entropy(data):.4f} nats",
          flush=True)
    # feed cuts the stream of windows into the daemon's batches, whatever its batch size
    stream = corpus.windows(data, args.block, 64, args.seed)
    if args.windows:
        stream = itertools.islice(stream, -(-args.windows // 64))
    r = infeed.feed(args.endpoint, stream, name=args.name)
    print(f"sent {r.sent} steps in {r.messages} messages ({r.skipped} skipped"
          f"{', the run ended first' if r.ended else ''})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
