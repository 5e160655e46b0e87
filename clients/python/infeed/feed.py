"""``infeed.feed``: streams the batches of any loader to infeedd, resumes where the daemon wants,
packs several steps a message and uses the shared-memory pool when there is one.

The batches are one stream of rows: whatever size the loader's batches have, ``feed`` cuts the
stream into the daemon's steps of ``batch_size`` rows (WELCOME says it), packs
``steps_per_message`` of them a message, and decides what happens to the rows left at the end
(``last_batch``). Step ``j`` of the stream is rows ``[j * batch_size, (j + 1) * batch_size)``
and has sequence number ``first_seq + j``, so a deterministic loader gives the same steps on
every run, and a resumed daemon's ``next_seq`` says how many steps to skip.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from .adapters import batches
from .convert import encode, item_rows
from .errors import RunEnded
from .producer import Producer
from .workers import Worker

LAST_BATCH = ("drop", "pad")


@dataclass
class FeedResult:
    """What :func:`feed` did. Steps count ``batch_size`` rows each (predict mode: batches)."""

    name: str  #: the producer's name (the daemon's, when it made one up)
    transport: str  #: "shm" or "socket"
    skipped: int = 0  #: steps the daemon had consumed before (skip_consumed): not sent
    sent: int = 0  #: steps sent
    messages: int = 0  #: messages they went in
    rows_dropped: int = 0  #: rows at the end left out (last_batch="drop")
    rows_padded: int = 0  #: rows added at the end (last_batch="pad")
    ended: bool = False  #: the daemon took no more batches before the data ran out
    bye: Optional[dict] = None  #: the BYE, when it came
    welcome: dict = field(default_factory=dict)  #: the WELCOME
    predictions: list = field(default_factory=list)  #: predict mode without on_prediction


def feed(endpoint: str, data: Any, *, name: Optional[str] = None,
         worker: Optional[Worker] = None, skip_consumed: bool = True,
         steps_per_message: Optional[int] = None, last_batch: str = "drop",
         round_floats: bool = False, wait_bye: Optional[bool] = None,
         on_prediction: Optional[Callable[[int, dict], None]] = None,
         **options: Any) -> FeedResult:
    """Streams ``data`` to the daemon at ``endpoint`` and ends the stream (``END``).

    - ``data``: any iterable of batches (:mod:`infeed.adapters`): dicts of tensors by name,
      tuples or lists of tensors in the schema's order (WELCOME's ``schema``), a
      ``torch.utils.data.DataLoader``, a ``tf.data.Dataset`` (``as_numpy_iterator``). Tensors
      are numpy arrays, lists, PyTorch or TensorFlow tensors, converted by the rules of
      :mod:`infeed.convert` (``round_floats=True`` lets float64 round to float32). Batches of
      any number of rows: the stream is cut into the daemon's steps.
    - ``name``: the producer's name, which the daemon keeps the stream's position under (and a
      checkpoint records): give one to resume. ``worker``: an :class:`infeed.Worker`, whose
      name is used (unless ``name`` is given) and whose count the daemon must expect: feed
      raises ValueError, before sending anything, when WELCOME's ``expect_producers`` (infeedd
      ``--expect-producers``) is below ``worker.count`` (see :class:`infeed.Worker`). ``data``
      is the worker's share already (``worker.take``, ``worker.indices``).
    - ``skip_consumed`` (True): skips the steps the daemon has consumed (WELCOME's ``next_seq``
      less ``first_seq``: a daemon resumed from a checkpoint that records this name), so that a
      deterministic loader restarted from its beginning trains every step exactly once. Items
      wholly skipped are not converted. False: sends from the beginning (the daemon drops, as
      duplicates, steps it has consumed).
    - ``steps_per_message``: steps packed into one message (train, eval), 1 to WELCOME's
      ``max_steps_per_message``; by default that maximum. Predict mode: 1.
    - ``last_batch``: the rows left after the last whole step, in train and eval mode, where
      the daemon takes whole steps only: ``"drop"`` (the default) leaves them out;
      ``"pad"`` fills the step up by repeating those rows in order (the step trains on a few
      examples twice). ``FeedResult.rows_dropped`` / ``rows_padded`` say how many. Predict mode
      sends the last batch partial (the daemon pads it, and no padding comes back).
    - ``wait_bye``: after ``END``, wait for the run's ``BYE`` (True) or only for the ACKs of
      the steps sent (False). Default: True, or False with ``worker`` (the others may stream on
      for longer than ``timeout``). Without the BYE, a run that fails after this producer's last
      ACK is not seen here (the daemon's exit status and end summary say it).
    - ``on_prediction``: predict mode: called with ``(seq, arrays)`` for each batch's
      predictions as they arrive; without it they are kept in ``FeedResult.predictions``.
    - ``options``: passed to :class:`infeed.Producer` (``timeout``, ``shm``, ``first_seq``,
      ``replica``, ``schema``, CURVE keys...). The shared-memory pool is used whenever the
      daemon gives one (``shm="auto"``).

    Returns a :class:`FeedResult`. When the daemon ends the run before the data runs out (its
    last step), the stream stops there (``ended``): no error. A run that ended with an error
    raises :class:`infeed.RunFailed`; a rejected batch :class:`infeed.InfeedError`.

    Zero copies where the tensors allow: over the socket, a loader batch of exactly one
    message's rows (C-contiguous, of the schema's dtype: a CPU PyTorch tensor's ``.numpy()``)
    is sent from its own memory, and longer ones as views; batches that must be joined or cut
    are copied once into buffers of :meth:`Producer.buffer`. Over shared memory every row is
    copied once, into the pool the daemon reads.
    """
    if last_batch not in LAST_BATCH:
        raise ValueError(f"feed: last_batch: expected one of {', '.join(LAST_BATCH)}, got "
                         f"{last_batch!r}")
    if worker is not None and not isinstance(worker, Worker):
        raise TypeError(f"feed: worker: expected an infeed.Worker, got {type(worker).__name__}")
    if name is None and worker is not None:
        name = worker.name
    if wait_bye is None:
        wait_bye = worker is None
    p = Producer(endpoint, name=name, round_floats=round_floats, **options)
    try:
        w = p.welcome or p.hello()  # (schema= in options: the constructor said HELLO)
        if worker is not None:
            _check_expected(p, worker)
        out = FeedResult(name=str(p.name), transport=str(p.transport), welcome=w)
        predict = w.get("mode") == "predict"
        if predict and on_prediction is None:
            on_prediction = lambda seq, arrays: out.predictions.append((seq, arrays))  # noqa: E731
        most = 1 if predict else int(w.get("max_steps_per_message", 1))
        k = most if steps_per_message is None else steps_per_message
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= most:
            raise ValueError(f"feed: steps_per_message: expected 1 to {most} (the daemon's "
                             f"max_steps_per_message{', predict mode' if predict else ''}), "
                             f"got {k!r}")
        s = _Stream(p, k, predict, last_batch, out, on_prediction)
        if skip_consumed:
            out.skipped = max(0, int(p.resume_seq or 0) - int(options.get("first_seq", 0)))
        try:
            s.run(batches(data), out.skipped * int(p.batch_size or 0))
        except RunEnded:
            out.ended = True
        out.bye = p.end(wait_bye=wait_bye)
        if on_prediction is not None:
            s.take_predictions(wait=True)
        return out
    finally:
        p.close()


def _check_expected(p: Producer, worker: Worker) -> None:
    """Worker i of n needs a daemon that waits for n producers' END: else the first worker to
    finish can end the input before a late one connects, which is then turned away (ECLOSED)
    with its share untrained."""
    if worker.count == 1:
        return
    assert p.welcome is not None
    want = p.welcome.get("expect_producers")
    if want is None:
        warnings.warn(f"infeed.feed: {worker}: the daemon's WELCOME does not say its "
                      f"expect_producers; start infeedd with --expect-producers {worker.count} so "
                      f"that no worker finds the input ended", RuntimeWarning, stacklevel=3)
    elif want < worker.count:
        raise ValueError(f"infeed.feed: {worker}: the daemon at {p.endpoint} expects "
                         f"{want or 'no set number of'} producers (--expect-producers {want}), "
                         f"so the first of the {worker.count} workers to send END could end the "
                         f"input before a late one connects, and that worker's share would not "
                         f"be trained: start infeedd with --expect-producers {worker.count} (or "
                         f"expect_producers in its config)")


class _Stream:
    """Cuts a stream of batches of any size into messages of k steps."""

    def __init__(self, p: Producer, k: int, predict: bool, last_batch: str, out: FeedResult,
                 on_prediction: Optional[Callable[[int, dict], None]]):
        self.p = p
        self.bs = int(p.batch_size or 0)
        self.k = k
        self.rows = k * self.bs  # rows of a full message
        self.predict = predict
        self.last_batch = last_batch
        self.out = out
        self.on_prediction = on_prediction
        assert p.schema is not None
        self.schema = p.schema
        self.names = [e["name"] for e in p.schema]
        self.buf: Optional[dict] = None  # the message being filled (Producer.buffer)
        self.filled = 0

    def run(self, items, skip_rows: int) -> None:
        for item in items:
            if skip_rows:
                n = item_rows(item)
                if n is not None and n <= skip_rows:
                    skip_rows -= n  # consumed by the daemon before: not even converted
                    continue
            frames, n = encode(item, self.schema, self.p.round_floats)
            arrays = dict(zip(self.names, frames))
            if skip_rows:
                arrays = {name: a[skip_rows:] for name, a in arrays.items()}
                n -= min(n, skip_rows)
                skip_rows = 0
            self.add(arrays, n)
            if self.on_prediction is not None:
                self.take_predictions()
        self.finish()

    def add(self, arrays: dict, n: int) -> None:
        off = 0
        if self.filled == 0:
            # whole messages straight from the loader's arrays: over the socket, no copy
            while n - off >= self.rows:
                self.send({name: a[off:off + self.rows] for name, a in arrays.items()})
                off += self.rows
        while off < n:
            if self.buf is None:
                self.buf = self.p.buffer(self.k)
            m = min(n - off, self.rows - self.filled)
            for name, a in arrays.items():
                self.buf[name][self.filled:self.filled + m] = a[off:off + m]
            self.filled += m
            off += m
            if self.filled == self.rows:
                self.commit(self.rows)

    def send(self, arrays: dict) -> None:
        self.p.send(arrays)
        self.count(self.rows)

    def commit(self, rows: int) -> None:
        self.buf, self.filled = None, 0
        if rows:
            self.p.commit(rows=rows)
            self.count(rows)
        else:
            self.p.commit(rows=0)

    def count(self, rows: int) -> None:
        self.out.sent += 1 if self.predict else rows // self.bs
        self.out.messages += 1

    def finish(self) -> None:
        """The rows left after the last whole message."""
        if self.buf is None:
            return
        rows, bs = self.filled, self.bs
        tail = rows % bs
        if self.predict or tail == 0:
            return self.commit(rows)
        if self.last_batch == "drop":
            self.out.rows_dropped = tail
            return self.commit(rows - tail)
        need = bs - tail
        at = rows - tail + np.arange(need) % tail  # the last step's rows, again in order
        for a in self.buf.values():
            a[rows:rows + need] = a[at]
        self.out.rows_padded = need
        self.commit(rows + need)

    def take_predictions(self, wait: bool = False) -> None:
        """Hands the predictions that have arrived to on_prediction (all of them with wait)."""
        assert self.on_prediction is not None
        if wait:
            for seq, arrays in self.p.predictions():
                self.on_prediction(seq, arrays)
            return
        self.p.poll()
        q = self.p._predictions  # (the Producer's queue: predictions() would block)
        while q:
            self.on_prediction(*q.popleft())
