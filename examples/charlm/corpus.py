"""The text charlm trains on, as bytes (vocabulary 256), and what a model must beat on it.

The default corpus is the project's own documentation and sources (README.md, docs/*.md and
the C and Python files under the checkout), read in a sorted order, so every machine with the
checkout has the same bytes and no download is needed. Any file or folder can replace it.
"""

from __future__ import annotations

import math
import os
from typing import Iterable, Iterator, Optional

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_PARTS = ("README.md", "docs", "core", "host", "device", "loop", "outfeed",
                 "clients/python/infeed")
SUFFIXES = (".md", ".c", ".h", ".py")


def _files(path: str) -> Iterator[str]:
    if os.path.isfile(path):
        yield path
        return
    for folder, dirs, names in os.walk(path):
        dirs.sort()
        for n in sorted(names):
            if n.endswith(SUFFIXES):
                yield os.path.join(folder, n)


def load(paths: Optional[Iterable[str]] = None, limit: Optional[int] = None) -> np.ndarray:
    """The bytes of the files under paths (default: the checkout's docs and sources), joined in
    sorted order, as uint8; at most limit bytes."""
    if paths is None:
        paths = [os.path.join(ROOT, p) for p in DEFAULT_PARTS]
    chunks, n = [], 0
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"corpus: no file or folder '{p}'")
        for f in _files(p):
            with open(f, "rb") as fh:
                b = fh.read()
            chunks.append(b)
            n += len(b)
            if limit is not None and n >= limit:
                break
        if limit is not None and n >= limit:
            break
    data = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    if limit is not None:
        data = data[:limit]
    if data.size < 2:
        raise ValueError("corpus: expected at least 2 bytes, got %d" % data.size)
    return data


def unigram_entropy(data: np.ndarray) -> float:
    """The entropy of the corpus's byte frequencies, in nats (the loss of the best model that
    ignores context)."""
    counts = np.bincount(data, minlength=256).astype(np.float64)
    p = counts[counts > 0] / data.size
    return float(-(p * np.log(p)).sum())


def windows(data: np.ndarray, block: int, batch: int, seed: int) -> Iterator[dict]:
    """Endless batches of random windows of block + 1 bytes: tokens are the first block bytes,
    targets the last block (the next byte at every position). Deterministic in seed."""
    if data.size < block + 1:
        raise ValueError(f"corpus: {data.size} bytes, fewer than block + 1 = {block + 1}")
    rng = np.random.default_rng(seed)
    idx = np.arange(block + 1)
    while True:
        starts = rng.integers(0, data.size - block, size=batch)
        w = data[starts[:, None] + idx].astype(np.int32)
        yield {"tokens": w[:, :-1], "targets": w[:, 1:]}


def nats_to_bits(x: float) -> float:
    return x / math.log(2.0)
