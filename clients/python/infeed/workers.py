"""Several loader workers feeding one daemon: each its disjoint, deterministic share of the data
and its own producer name, so that a resumed daemon gives each its own position and every step
is trained exactly once across all of them.

The rule for workers that connect at different times: infeedd ends the input once every producer
it has welcomed so far has sent ``END``, so with several workers the first to finish could end
it before a late one says ``HELLO`` (that one would be turned away, ``ECLOSED``, its share
untrained). ``infeedd --expect-producers N`` (config ``expect_producers``) makes the daemon wait
for N producers' ``END`` instead: start it with N at least the number of workers.
:func:`infeed.feed` with ``worker=`` checks this in the WELCOME (``expect_producers``) and
raises ValueError, before sending anything, when it is lower. A worker whose share the daemon
has already consumed still connects and sends ``END`` (it counts towards N).

Changing the number of workers changes the names and the shares, so a daemon resumed with
another count sees new streams: resume with the count the checkpoint was made with.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np


class Worker:
    """Worker ``index`` (0 to ``count - 1``) of ``count``: its producer ``name``
    (``"<prefix>-<index>-of-<count>"``) and its share of the data, disjoint from the others'
    and the same on every run:

    - :meth:`indices`: the dataset indices of its share (every ``count``-th, from ``index``,
      of ``range(length)`` or of a seeded permutation of it): a ``sampler=`` for a PyTorch
      ``DataLoader``, or indices to read.
    - :meth:`take`: every ``count``-th item of an iterable, from ``index`` (each worker reads the
      whole iterable: prefer :meth:`indices`, or ``dataset.shard(count, index)`` in tf.data).

    ``flag`` is the daemon flag the workers need (``--expect-producers count``)."""

    def __init__(self, index: int, count: int, name: str = "loader"):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"Worker: count: expected an int >= 1, got {count!r}")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise ValueError(f"Worker: index: expected an int from 0 to {count - 1}, got "
                             f"{index!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"Worker: name: expected a non-empty str, got {name!r}")
        self.index = index
        self.count = count
        self.prefix = name
        self.name = f"{name}-{index}-of-{count}"

    @property
    def flag(self) -> str:
        return f"--expect-producers {self.count}"

    def indices(self, length: int, shuffle: bool = False, seed: int = 0) -> list[int]:
        """This worker's indices of ``range(length)``: every ``count``-th from ``index``, of the
        permutation ``numpy.random.default_rng(seed).permutation(length)`` when ``shuffle`` (the
        same seed gives the same share on every run; use another seed per epoch)."""
        order = np.random.default_rng(seed).permutation(length) if shuffle else np.arange(length)
        return order[self.index::self.count].tolist()

    def take(self, items: Iterable[Any]) -> Iterator[Any]:
        """Items ``index``, ``index + count``, ... of ``items``."""
        return itertools.islice(items, self.index, None, self.count)

    def __repr__(self) -> str:
        return f"worker {self.index} of {self.count} ('{self.name}')"


def workers(count: int, name: str = "loader") -> list[Worker]:
    """The ``count`` workers of one job."""
    return [Worker(i, count, name) for i in range(count)]


def _one(endpoint: str, make_data: Callable[[Worker], Any], w: Worker, kw: dict):
    from .feed import feed

    return feed(endpoint, make_data(w), worker=w, **kw)


def feed_workers(endpoint: str, count: int, make_data: Callable[[Worker], Any], *,
                 name: str = "loader", processes: bool = True,
                 per_core: bool = False, **feed_options: Any) -> list:
    """Runs ``count`` workers, each ``infeed.feed(endpoint, make_data(worker), worker=worker,
    **feed_options)``, in processes (``multiprocessing``: ``make_data`` must then be picklable,
    a function defined at a module's top level, where the start method is not fork) or threads
    (``processes=False``), and returns their :class:`infeed.FeedResult` in worker order.
    ``make_data(worker)`` returns that worker's share (``worker.indices``, ``worker.take``).
    ``per_core``: worker i feeds replica i (infeedd ``--input-mode per-core``, as many workers
    as replicas). The daemon needs ``--expect-producers count`` (see this module). The first
    worker's error is raised once all have finished."""
    ws = workers(count, name)
    kws = [dict(feed_options, **({"replica": w.index} if per_core else {})) for w in ws]
    if processes:
        import multiprocessing

        with multiprocessing.get_context().Pool(count) as pool:
            jobs = [pool.apply_async(_one, (endpoint, make_data, w, kw)) for w, kw in zip(ws, kws)]
            results: list = []
            first: Optional[BaseException] = None
            for j in jobs:
                try:
                    results.append(j.get())
                except BaseException as e:  # noqa: BLE001 - raised below, after the others
                    results.append(None)
                    first = first or e
        if first is not None:
            raise first
        return results
    results = [None] * count
    errors: list[Optional[BaseException]] = [None] * count

    def run(i: int) -> None:
        try:
            results[i] = _one(endpoint, make_data, ws[i], kws[i])
        except BaseException as e:  # noqa: BLE001 - raised below
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), name=ws[i].name) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results
