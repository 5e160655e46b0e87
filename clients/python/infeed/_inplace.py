"""Writing batches in place: :meth:`Producer.buffer` hands out arrays (the shared-memory pool's
slots, or arrays of a pool of its own) and :meth:`Producer.commit` sends them without a copy.
A part of :class:`infeed.Producer`, kept in its own file."""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import protocol as P
from . import shm as S


class InPlace:
    """The in-place methods of :class:`infeed.Producer` (its state is the Producer's)."""

    def buffer(self, steps: int = 1) -> dict[str, np.ndarray]:
        """Arrays to fill in place for the next batch, one per schema tensor, of
        ``steps x batch_size`` rows (train and eval: ``steps`` up to WELCOME's
        ``max_steps_per_message``; predict: 1), then :meth:`commit` sends them without a copy.
        The arrays come from a pool: once their batch is acknowledged, a later ``buffer()`` of
        the same size hands them out again, so a loader that fills them allocates nothing after
        the first few batches. Do not touch them after ``commit()`` (they are sent from where
        they are) until ``buffer()`` returns them again. Sends ``HELLO`` first when it has not
        been sent, and takes the schema from the WELCOME (the program's, in its order), so it
        needs no ``schema=`` and no batch sent before.

        Over shared memory (:attr:`transport` ``"shm"``) the arrays are the pool's free slots
        themselves (waiting, as :meth:`send` waits for credit, until ``steps`` slots in a row are
        free): what is written there is what the daemon reads, and ``commit()`` sends only the
        descriptor."""
        self._check_open()
        if self._pending is not None:
            raise ValueError("buffer: the previous buffer is not committed yet (commit() it, or "
                             "drop it with commit(rows=0))")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"buffer: steps: expected an int >= 1, got {steps!r}")
        if self.welcome is None:
            self.hello()
        bs = int(self.batch_size or 0)
        rows = steps * bs
        if steps > 1:
            self._steps_of(rows)  # ValueError naming max_steps_per_message when too many
        key = (steps, rows)
        pool = self._shm
        if pool is not None:
            if steps > 1 and self.welcome is not None and self.welcome.get("mode") == "predict":
                raise ValueError(f"buffer: steps: predict mode takes one batch a message, got "
                                 f"{steps}")
            if pool.find(steps) is None:
                self._drain()
                self._pump(lambda: pool.find(steps) is not None or bool(self._errors)
                           or self.bye is not None or not pool.inflight,
                           "waiting for free slots of the shared-memory pool")
            self._raise_pending()
            if self.bye is not None:
                raise self._run_ended()
            s = pool.find(steps)
            if s is None:
                raise ValueError(f"buffer: the shared-memory pool has no {steps} free slots in "
                                 f"a row and no batch in flight")
            pool.reserve(s, steps)
            arrays = pool.arrays(s, steps)
            self._pending = (key, arrays, (pool, s))
            return arrays
        free = self._pool.get(key)
        if free:
            arrays = free.pop()
        else:
            assert self._schema is not None
            arrays = {e["name"]: np.empty((rows, *e["shape"]), dtype=P.DTYPES[e["dtype"]])
                      for e in self._schema}
        self._pending = (key, arrays, None)
        return arrays

    def commit(self, rows: Optional[int] = None) -> Optional[int]:
        """Sends the arrays of the last :meth:`buffer` (all their rows, or the first ``rows``:
        predict mode's partial batch) as :meth:`send` would, without a copy, and returns the
        batch's sequence number; ``rows=0`` sends nothing and puts the buffer back (None)."""
        if self._pending is None:
            raise ValueError("commit: no buffer to commit: call buffer() first")
        key, arrays, where = self._pending
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int)
                                 or not 0 <= rows <= key[1]):
            raise ValueError(f"commit: rows: expected 0 to {key[1]}, got {rows!r}")
        if rows == 0:
            self._pending = None
            if where is not None:
                where[0].unreserve()
            else:
                self._pool.setdefault(key, []).append(arrays)
            return None
        out = arrays if rows is None or rows == key[1] else {n: a[:rows] for n, a in
                                                             arrays.items()}
        if where is not None:
            pool, s = where
            if pool is self._shm:
                seq = self._commit_shm(pool, s, key[1] if rows is None else rows)
            else:  # a HELLO since buffer() replaced the pool: copied, as send() does
                seq = self.send(out)
            self._pending = None
            return seq
        seq = self.send(out)  # raises before sending: the buffer stays pending
        self._pending = None
        self._lent[seq] = (key, arrays)
        return seq

    def _commit_shm(self, pool: S.Pool, s: int, rows: int) -> int:
        """Sends the descriptor of the slots buffer() reserved (k steps from slot s)."""
        if self._ended:
            raise ValueError("infeed producer: send after end()")
        self._drain()
        self._raise_pending()
        if self.bye is not None or self._eclosed is not None:
            raise self._run_ended()
        k = self._steps_of(rows)  # (commit(rows=n): n must be whole steps in train and eval)
        self._await(k, None)  # (its slots are reserved already)
        seq = self._sent_shm(pool, s, k, rows)
        pool.unreserve()  # the slots of the steps left out
        return seq

    def _give_back(self, seq: int) -> None:
        lent = self._lent.pop(seq, None)
        if lent is not None:
            self._pool.setdefault(lent[0], []).append(lent[1])
