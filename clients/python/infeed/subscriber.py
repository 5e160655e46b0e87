"""Receives the JSON summaries infeedd publishes on its PUB socket (docs/summaries.md)."""

from __future__ import annotations

import json
import time
from collections import deque
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import zmq

from . import keys as K
from . import shm as S
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

    ``tensors``: names of outfeed tensors (docs/summaries.md, "Tensor messages") to receive as
    well, at most :data:`MAX_TENSORS`. Iterating then yields ``(global_step, {name: array})``
    for every step whose asked tensors all arrived, in step order (the daemon sends a tensor's
    steps several to a message, and drops tensor messages a slow subscriber or its
    ``--tensor-rate`` cannot take: a step with one missing is skipped), and stops after the end
    summary; the summaries still land in :attr:`last`. The daemon publishes a tensor only while
    some subscriber asks for it.

    ``shm``: on the daemon's host (an ``ipc://`` endpoint, or ``tcp://`` to a loopback address)
    the tensors' data comes through the daemon's shared-memory ring by default ("auto";
    docs/summaries.md, "Tensor messages in shared memory"): the socket carries small notices and
    the data is copied out of the ring, checked against being written over meanwhile (such a
    message is lost like a dropped one, and counted in :attr:`lost`). A ring that cannot be
    opened (another user, another PID namespace) makes "auto" ask for data messages instead;
    True insists (the error is raised), False always takes data messages. :attr:`shm` says what
    is used now.
    """

    #: tensor names one Subscriber may ask for (the daemon allows 8 subscriptions a connection;
    #: the summaries take one)
    MAX_TENSORS = 7
    #: incomplete steps kept at most, waiting for their other tensors: beyond it the oldest are
    #: skipped as lost (a tensor whose every message is dropped, and no summary to settle them,
    #: must not grow the memory without bound). The daemon puts at most 256 steps in a message
    #: (docs/summaries.md), so a step still to complete is never this far behind.
    MAX_PENDING_STEPS = 4096

    def __init__(self, endpoint: str, timeout: Optional[float] = None,
                 context: Optional[zmq.Context] = None, server_key: Any = None,
                 server_key_file: Any = None, keypair: Any = None, key_file: Any = None,
                 connect_timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT,
                 tensors: Optional[Sequence[str]] = None, shm: Any = "auto"):
        self.endpoint = endpoint
        self.tensors: List[str] = _tensor_names(tensors)
        self._shm_mode = S.check_mode(shm)
        #: whether the tensors' data comes through the shared-memory ring now
        self.shm: bool = bool(self.tensors) and (shm is True or (shm == "auto" and
                                                                  S.is_local(endpoint)))
        #: tensor messages whose data the ring wrote over before it was copied out (lost)
        self.lost = 0
        self._ring: Optional[_Ring] = None
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
        self._sock.setsockopt(zmq.SUBSCRIBE, b"{")  # summaries are JSON objects
        for name in self.tensors:
            self._sock.setsockopt(zmq.SUBSCRIBE, self._topic() + name.encode())
        # steps some asked tensor has arrived for: {step: {name: array}}; the highest step
        # each tensor has arrived for; complete steps not yet yielded
        self._pending: Dict[int, Dict[str, np.ndarray]] = {}
        self._upto: Dict[str, int] = {}
        self._ready: deque = deque()
        self._sock.connect(endpoint)
        self._closed = False

    @property
    def socket(self) -> zmq.Socket:
        return self._sock

    def _topic(self) -> bytes:
        return TENSOR_SHM_TOPIC if self.shm else TENSOR_TOPIC

    def _no_shm(self, why: Exception) -> None:
        """The ring cannot be read here: "auto" asks for data messages from now on (what was in
        flight is lost), True raises."""
        if self._shm_mode is True:
            raise ValueError(f"infeed subscriber: shm=True, but {why}") from None
        for name in self.tensors:
            self._sock.setsockopt(zmq.SUBSCRIBE, TENSOR_TOPIC + name.encode())
            self._sock.setsockopt(zmq.UNSUBSCRIBE, TENSOR_SHM_TOPIC + name.encode())
        self.shm = False

    def _notice(self, frames: Sequence[bytes]) -> dict:
        """A notice's header with its data copied out of the ring (``"arrays"``), or with
        ``"lost"`` when the ring wrote over it first (or cannot be read: see _no_shm)."""
        h = _header(frames[1])
        where = h.get("shm")
        try:
            if not isinstance(where, dict):
                raise ValueError(f"expected an object 'shm', got {where!r:.80}")
            path, size, token = where.get("path"), where.get("size"), where.get("token")
            seq, n = where.get("seq"), where.get("bytes")
            if not (isinstance(path, str) and isinstance(token, str) and
                    all(isinstance(v, int) and v >= 0 for v in (size, seq, n))):
                raise ValueError(f"expected path, size, token, seq and bytes, got {where!r:.200}")
            if self._ring is None or self._ring.path != path or self._ring.token != token:
                if self._ring is not None:
                    self._ring.close()
                    self._ring = None
                self._ring = _Ring(path, size, token)
            data = self._ring.read(seq, n)
        except S.ShmMapError as e:
            self._no_shm(e)
            h["lost"] = True
            return h
        except ValueError as e:
            raise ValueError(f"infeed subscriber: a tensor notice with a bad 'shm' ({e}): "
                             f"{frames[1][:200]!r}") from None
        if data is None:
            self.lost += 1
            h["lost"] = True
            return h
        h["arrays"] = _arrays(h, data)
        return h

    def recv_message(self, timeout: Any = ...) -> dict:
        """The next message: a summary, or a tensor message as a dict (its JSON header with the
        data under ``"arrays"``, one numpy array a step of ``"global_steps"``). Raises
        TimeoutError after ``timeout`` seconds (default: the Subscriber's) without one."""
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
        frames = self._sock.recv_multipart()
        if len(frames) == 3 and frames[0].startswith((TENSOR_TOPIC, TENSOR_SHM_TOPIC)):
            return parse_tensor(frames)
        if len(frames) == 2 and frames[0].startswith(TENSOR_SHM_TOPIC):
            return self._notice(frames)
        data = frames[0]
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

    def recv(self, timeout: Any = ...) -> dict:
        """The next summary (tensor messages in between are not kept). Raises TimeoutError after
        ``timeout`` seconds (default: the Subscriber's) without one."""
        while True:
            m = self.recv_message(timeout)
            if m.get("event") != "tensor":
                return m

    def recv_step(self, timeout: Any = ...) -> Optional[Tuple[int, Dict[str, np.ndarray]]]:
        """The next step whose asked tensors all arrived, as ``(global_step, {name: array})``;
        None once the end summary has arrived (summaries go to :attr:`last`)."""
        while not self._ready and not self.ended:
            m = self.recv_message(timeout)
            if m.get("event") != "tensor":
                # every tensor message of the steps a summary covers came before it: a step
                # still missing a tensor lost it
                self._settle(every=True)
                continue
            name = m["name"]
            if name not in self.tensors:
                continue  # another subscriber's tensor whose name starts like ours
            for step, a in zip(m["global_steps"], m.get("arrays") or ()):
                self._pending.setdefault(step, {})[name] = a  # (a lost message: none)
            if m["global_steps"]:
                self._upto[name] = max(self._upto.get(name, m["global_steps"][-1]),
                                       m["global_steps"][-1])
            self._settle()
        if self._ready:
            return self._ready.popleft()
        self._pending.clear()
        return None

    def _settle(self, every: bool = False) -> None:
        """Moves the complete steps, in step order, to the ready ones, and forgets the steps that
        can no longer complete: each tensor's messages come in step order, so a step is lost
        once every tensor has arrived beyond it without it (or, with every, at a summary)."""
        for step in sorted(self._pending):
            got = self._pending[step]
            if len(got) == len(self.tensors):
                self._ready.append((step, got))
            elif every or all(self._upto.get(n, step - 1) >= step for n in self.tensors):
                pass  # a dropped message: the step is skipped
            elif len(self._pending) > self.MAX_PENDING_STEPS:
                pass  # the oldest of too many kept: skipped as lost
            else:
                break  # may still complete, and so may every later step
            del self._pending[step]

    def __iter__(self) -> Iterator[Any]:
        if self.tensors:
            while True:
                got = self.recv_step()
                if got is None:
                    return
                yield got
        while not self.ended:
            yield self.recv()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._watch.close()
            self._sock.close(linger=0)
            if self._ring is not None:
                self._ring.close()
                self._ring = None

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


TENSOR_TOPIC = b"tensor:"
TENSOR_SHM_TOPIC = b"tensor-shm:"
_DTYPES = {"float32": np.dtype("<f4"), "int32": np.dtype("<i4")}

RING_MAGIC = b"IFDRING1"
RING_HEADER = 4096  # the data starts here
RING_WRITTEN = 64  # u64: the end of the positions the daemon has begun to write


class _Ring:
    """The daemon's ring of tensor data (docs/summaries.md, "Tensor messages in shared memory"),
    mapped read-only."""

    def __init__(self, path: str, size: int, token: str):
        try:
            tok = bytes.fromhex(token)
        except ValueError:
            raise ValueError(f"'token': expected hex digits, got {token!r:.80}") from None
        if size <= RING_HEADER or len(tok) != S.TOKEN_LEN:
            raise ValueError(f"expected size > {RING_HEADER} and a {S.TOKEN_LEN}-byte token, got "
                             f"{size} and {token!r:.80}")
        self.path, self.token = path, token
        self._mm = S._map(path, size, tok, magic=RING_MAGIC, writable=False,
                          what="the tensor ring", source="the notice")
        self.cap = int.from_bytes(self._mm[24:32], "little")
        if self.cap != size - RING_HEADER:
            self._mm.close()
            raise S.ShmMapError(f"the tensor ring {path} says {self.cap} data bytes, its "
                                f"notice {size - RING_HEADER}")
        self._written = np.ndarray((1,), dtype="<u8", buffer=self._mm, offset=RING_WRITTEN)

    def read(self, seq: int, n: int) -> Optional[bytes]:
        """A copy of the n bytes at seq, or None when the daemon wrote over them before or while
        they were copied (seqlock: ``written`` checked before and after)."""
        at = seq % self.cap
        if n > self.cap - at or seq + n > int(self._written[0]):
            raise ValueError(f"{n} bytes at {seq} are not in the ring of {self.cap} bytes")
        if int(self._written[0]) > seq + self.cap:
            return None
        data = self._mm[RING_HEADER + at:RING_HEADER + at + n]
        if int(self._written[0]) > seq + self.cap:
            return None
        return data

    def close(self) -> None:
        del self._written
        self._mm.close()


def _tensor_names(tensors: Optional[Sequence[str]]) -> List[str]:
    if tensors is None:
        return []
    if isinstance(tensors, (str, bytes)):
        raise TypeError("infeed subscriber: tensors must be a list of names, got a single "
                        f"string {tensors!r}")
    names = list(tensors)
    if len(names) > Subscriber.MAX_TENSORS or len(set(names)) != len(names):
        raise ValueError(f"infeed subscriber: tensors: at most {Subscriber.MAX_TENSORS} "
                         f"different names, got {names!r}")
    for n in names:
        if not isinstance(n, str) or not n or len(n.encode()) >= 64 or "\0" in n:
            raise ValueError(f"infeed subscriber: tensors: a name of 1 to 63 bytes, got {n!r}")
    return names


def _ints(v: Any, what: str) -> List[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and x >= 0 for x in v):
        raise ValueError(f"{what}: expected a list of whole numbers >= 0, got {v!r}")
    return v


def _header(raw: bytes) -> dict:
    """A tensor message's JSON header, checked."""
    try:
        h = json.loads(raw.decode("utf-8"))
        if not isinstance(h, dict) or h.get("event") != "tensor":
            raise ValueError("not a tensor header")
        _DTYPES[h["dtype"]]
        _ints(h["row_shape"], "row_shape")
        steps = _ints(h["global_steps"], "global_steps")
        rows = _ints(h["rows"], "rows")
        if len(steps) != len(rows):
            raise ValueError(f"{len(steps)} global_steps and {len(rows)} rows")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"infeed subscriber: a tensor message with a bad header ({e!r}): "
                         f"{raw[:200]!r}") from None
    return h


def _arrays(h: dict, data: bytes) -> List[np.ndarray]:
    """The header h's steps as arrays of shape ``[rows[i]] + row_shape`` (views of data, which
    holds them one after another)."""
    dt = _DTYPES[h["dtype"]]
    row_shape, steps, rows = tuple(h["row_shape"]), h["global_steps"], h["rows"]
    row = int(np.prod(row_shape, dtype=np.int64))
    want = sum(rows) * row * dt.itemsize
    if len(data) != want:
        span = f"steps {steps[0]} to {steps[-1]}" if steps else "no step"
        raise ValueError(f"infeed subscriber: tensor '{h.get('name')}' at {span}: "
                         f"{sum(rows)} rows of {h['dtype']} {list(row_shape)} are {want} bytes, "
                         f"the message has {len(data)}")
    arr = np.frombuffer(data, dtype=dt)
    ends = np.cumsum([r * row for r in rows], dtype=np.int64)
    return [arr[e - r * row:e].reshape((r,) + row_shape) for e, r in zip(ends, rows)]


def parse_tensor(frames: Sequence[bytes]) -> dict:
    """A tensor message's frames (topic, JSON header, data) as its header with ``"arrays"``: one
    numpy array a step of ``"global_steps"``, of shape ``[rows[i]] + row_shape`` (views of the
    data frame, which holds the steps' arrays one after another)."""
    h = _header(frames[1])
    h["arrays"] = _arrays(h, frames[2])
    return h


def host_call(subscriber: "Subscriber", fn: Callable[..., Any]) -> Iterator[Tuple[int, Any]]:
    """Runs a host call as TPUEstimator's ``host_call`` does: ``fn(**tensors)`` on every step's
    tensors (the subscriber's ``tensors``, concatenated over replicas and hosts along axis 0),
    yielding ``(global_step, fn's result)`` until the run ends."""
    if not subscriber.tensors:
        raise ValueError("infeed host_call: the subscriber asks for no tensors "
                         "(Subscriber(..., tensors=[...]))")
    for step, tensors in subscriber:
        yield step, fn(**tensors)


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
