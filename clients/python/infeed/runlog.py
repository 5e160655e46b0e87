"""Reading a run's summaries (docs/summaries.md) back: the ``--summaries`` JSON Lines file, and
the numbers of each summary that are worth plotting."""

from __future__ import annotations

import json
import math
from typing import Iterable, Iterator

# The numeric keys of train, eval and predict summaries that are series over the global step.
SCALARS = ("loss", "accuracy", "examples_per_sec", "steps_per_sec", "infeed_wait_fraction",
           "outfeed_wait_fraction")
EVENTS = ("train", "eval", "predict")


def read_summaries(path: str) -> list[dict]:
    """Every summary of a JSON Lines file, in order. A line that is not a JSON object raises
    ValueError naming the file and the line; blank lines are skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}: line {lineno}: expected a JSON summary, got text "
                                 f"that is not JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}: line {lineno}: expected a JSON object (a summary), "
                                 f"got {type(obj).__name__}")
            out.append(obj)
    return out


def scalars(summary: dict) -> Iterator[tuple[str, int, float]]:
    """``(tag, global_step, value)`` for each plotted number of a train, eval or predict
    summary: tags are ``EVENT/KEY`` (``train/loss``, ``eval/accuracy``). Other events (``end``)
    and values that are missing or not finite numbers give nothing."""
    event = summary.get("event")
    step = summary.get("global_step")
    if event not in EVENTS or not isinstance(step, int) or isinstance(step, bool):
        return
    for key in SCALARS:
        v = summary.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            yield f"{event}/{key}", step, float(v)


def series(summaries: Iterable[dict], event: str = "train") -> dict[str, tuple[list, list]]:
    """``{key: (steps, values)}`` of one event's summaries, for each key of SCALARS that they
    carry, in the order the summaries came."""
    out: dict[str, tuple[list, list]] = {}
    for s in summaries:
        for tag, step, value in scalars(s):
            ev, key = tag.split("/", 1)
            if ev == event:
                steps, values = out.setdefault(key, ([], []))
                steps.append(step)
                values.append(value)
    return out
