#!/usr/bin/env python3
"""Generates text from a trained charlm through an infeedd in predict mode.

    infeedd --mode predict --program charlm --program-config '{...}' --batch-size 1 \\
            --checkpoint-dir ck ... &
    python3 examples/charlm/sample.py --block 64 --length 400 --prompt "The daemon "

Each step sends the last block bytes of the text so far (the prompt, left-filled with spaces
when shorter) and draws the next byte from the predicted distribution at the last position
(softmax with --temperature; 0: the most likely byte).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

try:
    import infeed
except ImportError:  # run from a checkout without installing the client
    sys.path.insert(0, os.path.join(corpus.ROOT, "clients", "python"))
    import infeed


def draw(probs: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(probs))
    logp = np.log(np.maximum(probs.astype(np.float64), 1e-30)) / temperature
    p = np.exp(logp - logp.max())
    return int(rng.choice(p.size, p=p / p.sum()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555",
                    help="the daemon's --listen endpoint (default %(default)s)")
    ap.add_argument("--block", type=int, default=64, help="the program's block (default 64)")
    ap.add_argument("--length", type=int, default=300, help="bytes to generate (default 300)")
    ap.add_argument("--prompt", default="The daemon ", help="the text to continue")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="sampling temperature (default 0.8; 0: greedy)")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    ap.add_argument("--name", default="charlm-sampler", help="the producer's name")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    text = bytearray(args.prompt.encode())
    with infeed.Producer(args.endpoint, name=args.name) as p:
        p.hello()
        for _ in range(args.length):
            ctx = bytes(text[-args.block:]).rjust(args.block, b" ")
            p.send(tokens=np.frombuffer(ctx, dtype=np.uint8).astype(np.int32)[None, :])
            (_, out), = list(p.predictions())
            text.append(draw(out["outputs"][0], args.temperature, rng))
        p.end()
    sys.stdout.flush()
    sys.stdout.buffer.write(bytes(text) + b"\n")  # the bytes as generated
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
