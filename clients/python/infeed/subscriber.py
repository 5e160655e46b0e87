"""Receives the JSON summaries infeedd publishes on its PUB socket (docs/summaries.md)."""

from __future__ import annotations

import json
import time
from typing import Any, Iterator, Optional

import zmq

from . import keys as K
from ._connect import DEFAULT_CONNECT_TIMEOUT, ConnectWatch, check_timeout


class Subscriber:
    """A SUB socket on the daemon's ``--publish`` endpoint, subscribed to every summary.

    Iterating yields each summary as a dict and stops after the ``{"event": "end"}`` summary;
    it raises :class:`TimeoutError` when nothing arrives within ``timeout`` seconds (None waits
    forever). :meth:`recv` takes one summary.

    ZeroMQ's PUB drops what is published before a subscriber's connection is made, and what a
    slow subscriber cannot take: create the Subscriber before the run starts (before the first
    batch is sent) and read it steadily; the daemon's ``--summaries`` file has every line.

    CURVE (a daemon with ``--curve-secret-key``): ``server_key``/``server_key_file`` and
    ``keypair``/``key_file`` as for :class:`~infeed.Producer`; the daemon lets subscribe the keys
    of its ``--admin-keys`` and ``--authorized-keys``. A refused subscriber receives nothing
    (its ``recv`` times out).

    ``connect_timeout``: seconds :meth:`recv` waits for the daemon to answer the connection at
    all, counted from the constructor (10 by default; None: no bound): when nothing answers at
    ``endpoint`` it raises :class:`TimeoutError` saying so, even with ``timeout`` None. Start the
    daemon first, or pass a longer one.
    """

    def __init__(self, endpoint: str, timeout: Optional[float] = None,
                 context: Optional[zmq.Context] = None, server_key: Any = None,
                 server_key_file: Any = None, keypair: Any = None, key_file: Any = None,
                 connect_timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT):
        self.endpoint = endpoint
        connect_timeout = check_timeout(connect_timeout)
        self.timeout = timeout
        self.ended = False
        self.last: Optional[dict] = None
        curve = K.client_keys(server_key, server_key_file, keypair, key_file)
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            K.apply_client(self._sock, curve)
            self._watch = ConnectWatch(self._sock, endpoint, connect_timeout,
                                       "infeed subscriber", "--publish")
        except BaseException:
            self._sock.close(0)
            raise
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self._closed = False

    @property
    def socket(self) -> zmq.Socket:
        return self._sock

    def recv(self, timeout: Any = ...) -> dict:
        """The next summary. Raises TimeoutError after ``timeout`` seconds (default: the
        Subscriber's) without one."""
        if self._closed:
            raise ValueError("infeed subscriber: the socket is closed")
        if timeout is ...:
            timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._watch.poll():
            self._watch.check()
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
            if self._sock.poll(int(wait * 1000), zmq.POLLIN):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"infeed subscriber: no summary from {self.endpoint} within "
                                   f"{timeout:g} s")
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            if not self._sock.poll(int(left * 1000), zmq.POLLIN):
                raise TimeoutError(f"infeed subscriber: no summary from {self.endpoint} within "
                                   f"{timeout:g} s")
        data = self._sock.recv()
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"infeed subscriber: a summary that is not JSON ({e}): "
                             f"{data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"infeed subscriber: a summary that is not a JSON object: "
                             f"{data[:200]!r}")
        self.last = obj
        if obj.get("event") == "end":
            self.ended = True
        return obj

    def __iter__(self) -> Iterator[dict]:
        while not self.ended:
            yield self.recv()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._watch.close()
            self._sock.close(linger=0)

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._sock.close(linger=0)
        except Exception:
            pass


def format_summary(s: dict) -> str:
    """One readable line for a summary: ``step 100  loss 0.412  accuracy 0.891  12345 ex/s``."""
    ev = s.get("event")
    if ev == "end":
        line = f"end  step {s.get('global_step')}  {s.get('status')} ({s.get('reason')})"
        if s.get("message"):
            line += f": {s['message']}"
        if s.get("error"):
            line += f": {s['error']}"
        return line
    parts = [f"step {s.get('global_step')}"]
    if ev not in (None, "train"):
        parts.insert(0, str(ev))
    if isinstance(s.get("loss"), (int, float)):
        parts.append(f"loss {s['loss']:.3f}")
    if isinstance(s.get("accuracy"), (int, float)):
        parts.append(f"accuracy {s['accuracy']:.3f}")
    if isinstance(s.get("examples_per_sec"), (int, float)):
        parts.append(f"{s['examples_per_sec']:.0f} ex/s")
    if isinstance(s.get("infeed_wait_fraction"), (int, float)):
        parts.append(f"infeed wait {100 * s['infeed_wait_fraction']:.0f}%")
    return "  ".join(parts)
