"""A small fake of infeedd's ROUTER side, to test the Python client without the daemon.

It runs in a thread, speaks just enough of docs/protocol.md, and records what it received.
Behaviour knobs: ``credit``, ``batch_size``, ``schema`` (a HELLO without one is welcomed with
it), ``max_steps`` and ``expect_producers`` (said in WELCOME), ``bye_status`` (``"error"``: the
BYEs say the run failed), ``ack_delay`` (seconds before ACKing a batch), ``reject`` (a function (seq, frames) -> error dict or None), ``last_step`` (after that
many accepted batches the fake ends the run: BYE to everyone, ECLOSED afterwards), ``shm``
(None: WELCOME says nothing of shared memory; a function (hello) -> (desc or None, refused
sentence or None) that may build on ``make_pool``: a HELLO with ``"shm": true`` gets that pool,
and its BATCH_SHM descriptors are read from it, their tensors recorded as BATCH frames are).
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Callable, Optional

import numpy as np
import zmq

from infeed import protocol as P

SOFTMAX_SCHEMA = [P.schema_entry("x", "float32", [4]), P.schema_entry("y", "int32", [])]


class FakeDaemon:
    def __init__(self, schema=None, credit=4, batch_size=8, ack_delay=0.0,
                 reject: Optional[Callable] = None, last_step: Optional[int] = None,
                 silent: bool = False, shm: Optional[Callable] = None, max_steps: int = 1,
                 expect_producers: int = 0, bye_status: str = "ok"):
        self.schema = schema or SOFTMAX_SCHEMA
        self.max_steps = max_steps
        self.expect_producers = expect_producers
        self.bye_status = bye_status
        self.credit = credit
        self.batch_size = batch_size
        self.ack_delay = ack_delay
        self.reject = reject
        self.last_step = last_step
        self.silent = silent
        self.shm = shm
        self.pools: list[dict] = []  # the pools made: desc, fd, mmap
        self.shm_batches: list[tuple[int, int, int]] = []  # (seq, rows, slot) of each BATCH_SHM
        self._pool_of: dict[bytes, Optional[dict]] = {}
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.hellos: list[dict] = []
        self.batches: list[tuple[int, int, list[bytes]]] = []  # (seq, rows, tensor frames)
        self.ends = 0
        self.in_flight_max = 0
        self._in_flight: dict[bytes, int] = {}
        self._pending_acks: list[tuple[float, bytes, int]] = []
        self._welcomed: set[bytes] = set()
        self._ended = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-infeedd", daemon=True)
        self._thread.start()

    def _send(self, ident: bytes, frames: list) -> None:
        self.sock.send_multipart([ident, *frames])

    def _error(self, ident, code, message, seq=None, credit=0):
        self._send(ident, [P.pack_header(P.ERROR),
                           P.pack_json({"code": code, "seq": seq, "credit": credit,
                                        "message": message})])

    def _bye_all(self):
        self._ended = True
        for ident in self._welcomed:
            self._send(ident, [P.pack_header(P.BYE),
                               P.pack_json({"status": self.bye_status,
                                            "reason": "last_step" if self.bye_status == "ok"
                                            else "error", "global_step": len(self.batches),
                                            "acked_seq": -1,
                                            "message": "" if self.bye_status == "ok" else
                                            "outfeed: replica 0's loss is nan"})])

    def _on(self, ident: bytes, frames: list) -> None:
        try:
            t = P.unpack_header(frames[0])
        except P.ProtocolError as e:
            return self._error(ident, P.EPROTO, str(e))
        if t == P.HELLO:
            hello = P.unpack_json(frames[1])
            self.hellos.append(hello)
            if self._ended:
                return self._error(ident, P.ECLOSED, "the input has ended")
            if hello.get("schema") is not None and hello["schema"] != self.schema:
                return self._error(ident, P.ESHAPE, f"schema: expected {self.schema}")
            self._welcomed.add(ident)
            self._in_flight[ident] = 0
            body = {"protocol": 1, "name": hello.get("name") or "producer-1",
                    "credit": self.credit, "next_seq": hello.get("first_seq", 0), "mode": "train",
                    "input_mode": "per-host", "batch_size": self.batch_size, "replicas": 1,
                    "program": "softmax", "schema": self.schema,
                    "max_steps_per_message": self.max_steps,
                    "expect_producers": self.expect_producers}
            self._pool_of[ident] = None
            if hello.get("shm") and self.shm is not None:
                pool, refused = self.shm(hello)
                body["shm"] = None if pool is None else pool["desc"]
                if refused is not None:
                    body["shm_refused"] = refused
                self._pool_of[ident] = pool
                if pool is not None:
                    self.pools.append(pool)
            self._send(ident, [P.pack_header(P.WELCOME), P.pack_json(body)])
        elif t in (P.BATCH, P.BATCH_SHM):
            seq, rows, flags, n = P.unpack_batch_header(frames[0], t)
            if t == P.BATCH_SHM:
                pool = self._pool_of.get(ident)
                if pool is None:
                    return self._error(ident, P.EPROTO, "BATCH_SHM without a pool", seq, 1)
                self.shm_batches.append((seq, rows, n))
                frames = [frames[0], *read_slot(pool, n, rows)]
            if self._ended:
                return self._error(ident, P.ECLOSED, "the run is ending", seq, 1)
            # a message of k x batch_size rows is k steps (k credits, ACKed as seq + k - 1)
            k = rows // self.batch_size if rows > self.batch_size else 1
            if k > self.max_steps or (k > 1 and rows % self.batch_size):
                return self._error(ident, P.ESHAPE, f"{rows} rows", seq, 1)
            self._in_flight[ident] += k
            if self._in_flight[ident] > self.credit:
                self._in_flight[ident] -= k
                return self._error(ident, P.EPROTO, "batch without credit", seq, k)
            self.in_flight_max = max(self.in_flight_max, self._in_flight[ident])
            err = self.reject(seq, frames[1:]) if self.reject else None
            if err:
                self._in_flight[ident] -= k
                return self._error(ident, err[0], err[1], seq, k)
            self.batches.append((seq, rows, [bytes(f) for f in frames[1:]]))
            self._pending_acks.append((time.monotonic() + self.ack_delay, ident, seq, k))
        elif t == P.END:
            self.ends += 1
            self._end_after_acks = ident
        else:
            self._error(ident, P.EPROTO, f"header: type: unknown {t}")

    def _run(self) -> None:
        self._end_after_acks = None
        while not self._stop.is_set():
            if self.sock.poll(10):
                while True:
                    try:
                        ident, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if not self.silent:
                        self._on(ident, frames)
            now = time.monotonic()
            while self._pending_acks and self._pending_acks[0][0] <= now:
                _, ident, seq, k = self._pending_acks.pop(0)
                self._in_flight[ident] -= k
                self._send(ident, [P.pack_ack(seq + k - 1, k)])
                if self.last_step is not None and len(self.batches) >= self.last_step \
                        and not self._pending_acks and not self._ended:
                    self._bye_all()
            if self._end_after_acks is not None and not self._pending_acks and not self._ended:
                self._bye_all()
        self.sock.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for pool in self.pools:
            pool["mm"].close()
            os.close(pool["fd"])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_pool(schema: list, batch_size: int, slots: int) -> dict:
    """A pool as infeedd makes one (docs/protocol.md, "Shared memory"): a memfd with the magic
    and a random token, then a 64-aligned region per tensor of slots x step_bytes."""
    step = [batch_size * P.row_nbytes(e) for e in schema]
    offsets, at = [], 64
    for b in step:
        offsets.append(at)
        at += -(-slots * b // 64) * 64
    fd = os.memfd_create("fake-infeedd-pool", os.MFD_CLOEXEC)
    os.ftruncate(fd, at)
    mm = mmap.mmap(fd, at)
    token = os.urandom(16)
    mm[:24] = b"IFDSHM1\0" + token
    desc = {"path": f"/proc/{os.getpid()}/fd/{fd}", "size": at, "token": token.hex(),
            "slots": slots, "offsets": offsets, "step_bytes": step}
    return {"desc": desc, "fd": fd, "mm": mm, "batch_size": batch_size}


def read_slot(pool: dict, slot: int, rows: int) -> list[bytes]:
    """The tensors of a BATCH_SHM at ``slot`` of ``rows`` rows, as BATCH frames would be."""
    d = pool["desc"]
    return [bytes(pool["mm"][o + slot * b:o + slot * b + rows * (b // pool["batch_size"])])
            for o, b in zip(d["offsets"], d["step_bytes"])]


def batch(rows=8, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((rows, d), dtype=np.float32), rng.integers(0, 3, rows, dtype=np.int32)
