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
    summary: tags are ``EVENT/KEY`` (``train/loss``, ``eval/accuracy``), then the host calls'
    numbers (host_call_scalars). Other events (``end``) and values that are missing or not
    finite numbers give nothing."""
    event = summary.get("event")
    step = summary.get("global_step")
    if event not in EVENTS or not isinstance(step, int) or isinstance(step, bool):
        return
    for key in SCALARS:
        v = summary.get(key)
        if _finite(v):
            yield f"{event}/{key}", step, float(v)
    yield from host_call_scalars(summary)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_histogram(v) -> bool:
    """Whether a host call's value is a histogram (TensorBoard's HistogramProto fields)."""
    return isinstance(v, dict) and isinstance(v.get("bucket_limit"), list) and \
        isinstance(v.get("bucket"), list)


def _leaves(prefix: str, v, depth: int = 3) -> Iterator[tuple[str, float]]:
    """The numbers of a host call's value: a number, or those of a list (``/0``, ``/1``...) or an
    object (``/key``), a few levels deep (``class_accuracy/accuracy/3``); histograms and
    matrices (lists of lists) give nothing."""
    if _finite(v):
        yield prefix, float(v)
    elif depth == 0 or is_histogram(v):
        return
    elif isinstance(v, list):
        if not any(isinstance(x, list) for x in v):
            for i, x in enumerate(v):
                yield from _leaves(f"{prefix}/{i}", x, depth - 1)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _leaves(f"{prefix}/{k}", x, depth - 1)


def host_call_values(summary: dict) -> Iterator[tuple[str, object]]:
    """``(TENSOR/KEY, value)`` of a summary's host calls (docs/summaries.md, "Host calls")."""
    calls = summary.get("host_calls")
    if not isinstance(calls, dict):
        return
    for tensor, values in calls.items():
        if isinstance(values, dict):
            for key, v in values.items():
                yield f"{tensor}/{key}", v


def host_call_scalars(summary: dict) -> Iterator[tuple[str, int, float]]:
    """``(EVENT/TENSOR/KEY[/i], global_step, value)`` for each number of a summary's host calls
    (``train/confidence/mean``, ``eval/class/class_accuracy/3``)."""
    event, step = summary.get("event"), summary.get("global_step")
    if event not in EVENTS or not isinstance(step, int) or isinstance(step, bool):
        return
    for name, v in host_call_values(summary):
        for tag, x in _leaves(f"{event}/{name}", v):
            yield tag, step, x


def histograms(summary: dict) -> Iterator[tuple[str, int, dict]]:
    """``(EVENT/TENSOR/KEY, global_step, histogram)`` for each histogram of a summary's host
    calls."""
    event, step = summary.get("event"), summary.get("global_step")
    if event not in EVENTS or not isinstance(step, int) or isinstance(step, bool):
        return
    for name, v in host_call_values(summary):
        if is_histogram(v):
            yield f"{event}/{name}", step, v


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
