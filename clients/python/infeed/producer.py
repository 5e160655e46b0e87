"""The producer side of the ingest protocol (docs/protocol.md): a DEALER socket that streams
batches of numpy arrays to infeedd, within the credit the daemon grants."""

from __future__ import annotations

import itertools
import time
import warnings
from collections import OrderedDict, deque
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import zmq

from . import keys as K
from . import protocol as P
from . import shm as S
from ._connect import DEFAULT_CONNECT_TIMEOUT, ConnectWatch, check_timeout
from .errors import InfeedError, RunEnded, ShmError

_DEFAULT_TIMEOUT = 60.0


def _dtype_name(dt: np.dtype) -> Optional[str]:
    """The protocol name of a numpy dtype (byte order aside), or None."""
    for name, spec in P.DTYPES.items():
        want = np.dtype(spec)
        if dt.kind == want.kind and dt.itemsize == want.itemsize:
            return name
    return None


def _normalize_schema(schema: Iterable[Any]) -> list[dict]:
    """Accepts dicts ``{"name", "dtype", "shape"}`` or tuples ``(name, dtype, shape)``; a dtype may
    be a protocol name or anything ``np.dtype`` takes."""
    out = []
    for entry in schema:
        if isinstance(entry, Mapping):
            name, dtype, shape = entry["name"], entry["dtype"], entry.get("shape", [])
        else:
            name, dtype, shape = entry
        if dtype not in P.DTYPES:
            dn = _dtype_name(np.dtype(dtype))
            if dn is None:
                raise TypeError(f"schema: tensor '{name}': dtype {np.dtype(dtype)} is not one of "
                                f"{', '.join(P.DTYPES)}")
            dtype = dn
        out.append(P.schema_entry(str(name), dtype, tuple(shape)))
    if not out:
        raise ValueError("schema: at least one tensor is needed")
    return out


def _derive_schema(arrays: Mapping[str, Any]) -> list[dict]:
    """A schema from the first batch: the arrays' dtypes and per-row shapes, in argument order."""
    out = []
    for name, value in arrays.items():
        a = value if isinstance(value, np.ndarray) else np.asarray(value)
        dn = _dtype_name(a.dtype)
        if dn is None:
            raise TypeError(f"tensor '{name}': dtype {a.dtype} is not one of "
                            f"{', '.join(P.DTYPES)}; convert it (e.g. .astype(np.float32)) or "
                            f"pass schema= to Producer")
        if a.ndim < 1:
            raise ValueError(f"tensor '{name}': a batch needs a leading batch dimension, got a "
                             f"scalar")
        out.append(P.schema_entry(name, dn, a.shape[1:]))
    if not out:
        raise ValueError("send: no tensors given")
    return out


def _rows_of(item: Any) -> Optional[int]:
    """The rows of a batch given as a mapping of arrays (its first array's length), else None."""
    if isinstance(item, Mapping) and item:
        first = next(iter(item.values()))
        if hasattr(first, "__len__"):
            return len(first)
    return None


def _convert(name: str, value: Any, entry: dict) -> np.ndarray:
    """The C-contiguous little-endian array of the declared dtype for one tensor.

    A numpy array must already have the declared dtype (its byte order and memory layout are
    fixed here, as ``np.ascontiguousarray`` does); a numpy array of another dtype is a TypeError,
    so that float64 data is never rounded to float32, or int64 labels truncated, behind the
    caller's back. Other values (lists, scalars) are converted when the conversion keeps every
    value (Python floats into float32 round to the nearest float32, as a float32 literal would).
    """
    want = np.dtype(P.DTYPES[entry["dtype"]])
    if isinstance(value, np.ndarray):
        if value.dtype.kind != want.kind or value.dtype.itemsize != want.itemsize:
            raise TypeError(f"tensor '{name}': expected dtype {entry['dtype']}, got {value.dtype} "
                            f"(convert it explicitly, e.g. .astype(np.{entry['dtype']}))")
        return np.ascontiguousarray(value, dtype=want)
    raw = np.asarray(value)
    if raw.dtype.kind not in "biuf":
        raise TypeError(f"tensor '{name}': expected dtype {entry['dtype']}, got {raw.dtype}")
    conv = np.ascontiguousarray(raw, dtype=want) if raw.dtype == want else raw.astype(want)
    if not (raw.dtype.kind == "f" and want.kind == "f") and not np.array_equal(conv, raw):
        raise TypeError(f"tensor '{name}': the values do not fit dtype {entry['dtype']} exactly "
                        f"(got {raw.dtype} values); convert them explicitly")
    return np.ascontiguousarray(conv)


class Producer:
    """Streams batches to infeedd over a ZeroMQ DEALER socket (ingest protocol version 1).

    ``Producer(endpoint, name=None, schema=None, first_seq=0, timeout=60.0, replica=None)``

    - ``endpoint``: the daemon's ``--listen`` address, e.g. ``"tcp://127.0.0.1:5555"``.
    - ``name``: the producer's name (the daemon makes one up when it is None).
    - ``schema``: the tensors, in frame order, as ``[{"name", "dtype", "shape"}]`` or
      ``[(name, dtype, shape)]``. When given, ``HELLO`` is sent now and the constructor waits for
      ``WELCOME``; when None, the schema is derived from the first :meth:`send`'s arrays (their
      dtypes and per-row shapes, in argument order) and ``HELLO`` is sent then.
    - ``first_seq``: the sequence number of the first batch.
    - ``timeout``: seconds any blocking call may go without hearing from the daemon (a WELCOME, an
      ACK, a CREDIT...) before it raises :class:`TimeoutError`; None waits forever. It is a limit
      on silence, not on the whole call: a long :meth:`wait` that keeps receiving ACKs goes on.
    - ``connect_timeout``: seconds the first blocking call waits for the daemon to answer the
      connection at all (10 by default; None: no bound). When nothing answers at ``endpoint`` (no
      daemon, another port) it raises :class:`TimeoutError` saying so, instead of waiting out
      ``timeout``.
    - ``on_ack``: called with each ACKed sequence number, as the ACK is handled.
    - ``replica``: ``per-core`` input mode: the replica (0 to replicas - 1) this producer's batches
      are for, sent in ``HELLO``; None (the other input modes) sends no replica. Each batch then
      has the WELCOME's ``batch_size`` rows (``global_batch_size / replicas``).
    - CURVE, for a daemon started with ``--curve-secret-key`` (:mod:`infeed.keys`): the daemon's
      public key as ``server_key`` (Z85) or ``server_key_file`` (its ``.pub``), and this
      producer's key pair as ``keypair=(public, secret)`` (Z85) or ``key_file`` (a ``.key`` of
      ``infeedd keygen``), whose public key is in the daemon's ``--authorized-keys``. A daemon
      that refuses the key sends nothing at all: the constructor (or first send) then raises
      :class:`TimeoutError` waiting for ``WELCOME``. A name bound to another key in
      ``--authorized-keys`` raises :class:`InfeedError` with code ``EPERM``.
    - ``shm``: the shared-memory transport (docs/protocol.md, "Shared memory"), for a producer on
      the daemon's host: its batches are copied into a pool of memory shared with the daemon and
      only a 32-byte descriptor crosses the socket. ``"auto"`` (the default) asks for a pool when
      ``endpoint`` is ``ipc://`` or ``tcp://`` to a loopback address, and sends over the socket
      when the daemon gives none (``--shm off``) or it cannot be mapped here (a warning says
      why); ``True`` always asks and raises :class:`ShmError` when there is no pool (quoting the
      WELCOME's ``shm_refused``) or it cannot be mapped; ``False`` never asks.
      :attr:`transport` says which is in use.

    Train and eval: a batch of k x ``batch_size`` rows (k up to WELCOME's
    ``max_steps_per_message``, infeedd's ``--max-steps-per-message``) is k steps in one message:
    it costs k credits, takes the sequence numbers seq .. seq + k - 1, and is acknowledged step
    by step. Fewer messages mean less overhead a step for small batches.

    ``ERROR`` answers raise :class:`InfeedError` (``code``, ``seq``, ``message``): from the call
    that caused them for ``HELLO``, and for a rejected batch from the next :meth:`send`,
    :meth:`wait` or :meth:`end` (the batch passed to that call is then not sent). Once the daemon
    takes no more batches (``BYE``, or ``ECLOSED``) :meth:`send` raises :class:`RunEnded`.

    Over the socket, arrays are sent without a copy and kept referenced until their ``ACK``: do
    not modify an array in place until then (pass a copy, or ``send(..., copy=True)``). Over
    shared memory :meth:`send` copies them into the pool (the arrays are free at once), and
    :meth:`buffer` hands out arrays that are the pool's slots themselves.

    A Producer is not thread-safe: use it from one thread.
    """

    def __init__(self, endpoint: str, name: Optional[str] = None,
                 schema: Optional[Sequence[Any]] = None, first_seq: int = 0,
                 timeout: Optional[float] = _DEFAULT_TIMEOUT,
                 context: Optional[zmq.Context] = None,
                 on_ack: Optional[Callable[[int], None]] = None,
                 replica: Optional[int] = None, server_key: Any = None,
                 server_key_file: Any = None, keypair: Any = None, key_file: Any = None,
                 connect_timeout: Optional[float] = DEFAULT_CONNECT_TIMEOUT,
                 shm: Any = "auto"):
        if first_seq < 0:
            raise ValueError(f"first_seq: expected >= 0, got {first_seq}")
        if replica is not None and (isinstance(replica, bool) or not isinstance(replica, int)
                                    or replica < 0):
            raise ValueError(f"replica: expected None or an int >= 0, got {replica!r}")
        self.replica = replica
        self._shm_mode = S.check_mode(shm)
        self.endpoint = endpoint
        self.name = name
        self.timeout = timeout
        self.on_ack = on_ack
        self._first_seq = int(first_seq)
        self._schema = _normalize_schema(schema) if schema is not None else None
        connect_timeout = check_timeout(connect_timeout)
        curve = K.client_keys(server_key, server_key_file, keypair, key_file)
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            K.apply_client(self._sock, curve)
            self._watch = ConnectWatch(self._sock, endpoint, connect_timeout,
                                       f"infeed producer{' ' + repr(name) if name else ''}",
                                       "--listen")
        except BaseException:
            self._sock.close(0)
            raise
        self._sock.connect(endpoint)
        self.welcome: Optional[dict] = None
        self.bye: Optional[dict] = None
        self._resume_seq: Optional[int] = None
        self._credit = 0
        self._next_seq = self._first_seq
        self._acked_seq = -1
        self._unacked: "OrderedDict[int, list]" = OrderedDict()
        self._steps: dict[int, int] = {}  # unacked messages of several steps: seq -> steps
        # buffer()/commit(): the buffer handed out, the committed ones in flight (seq -> key,
        # arrays) and the free ones by (steps, rows), reused once their message is ACKed
        self._pending: Optional[tuple] = None  # (key, arrays, (shm pool, slot) or None)
        self._lent: dict[int, tuple] = {}
        self._pool: dict[tuple, list] = {}
        self._errors: deque[InfeedError] = deque()
        # the shared-memory pool in use (None: BATCH over the socket), and why there is none
        # when one was asked for; _shm_broken: this host cannot map the daemon's pools (auto
        # mode then stops asking)
        self._shm: Optional[S.Pool] = None
        self._shm_why: Optional[str] = None
        self._shm_broken: Optional[str] = None
        self._predictions: deque = deque()  # (seq, {name: array}) not yet handed out
        self._eclosed: Optional[InfeedError] = None
        self._welcomes = 0
        self._ended = False
        self._closed = False
        if self._schema is not None:
            try:
                self.hello()
            except BaseException:
                self.close()
                raise

    # -- properties ------------------------------------------------------------------------

    @property
    def credit(self) -> int:
        """Batches that may be sent now without waiting."""
        return self._credit

    @property
    def acked_seq(self) -> int:
        """The highest sequence number acknowledged so far (-1 when none)."""
        return self._acked_seq

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch gets."""
        return self._next_seq

    @property
    def resume_seq(self) -> Optional[int]:
        """Where the daemon asked this stream to start: the first WELCOME's ``next_seq`` (None
        before it). A new name gets ``first_seq``; a name the daemon knows, for example from the
        checkpoint it resumed from (``infeedd --resume``), gets one more than the highest
        sequence number it consumed, so batches from ``first_seq`` up to ``resume_seq - 1`` need
        not be sent again. See :meth:`skip_consumed`."""
        return self._resume_seq

    def skip_consumed(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Replays a deterministic stream from where the daemon wants it: yields the items of
        ``batches`` from the one with sequence number ``resume_seq`` on, item ``i`` having
        sequence number ``first_seq + i`` (each item sent once, in order, by :meth:`send`; an
        item of k x batch_size rows, k steps in one message, takes k sequence numbers, and one
        whose first steps were consumed is sent again whole: the daemon skips those).
        Sends ``HELLO`` first when it has not been sent (the schema is then derived from the
        first item, a mapping of arrays)::

            with Producer(endpoint, name="loader-0") as p:
                for batch in p.skip_consumed(make_batches()):
                    p.send(batch)
        """
        it = iter(batches)
        head: list = []
        if self.welcome is None:
            try:
                head.append(next(it))
            except StopIteration:
                return
            if self._schema is None:
                self._schema = _derive_schema(head[0])
            self.hello()
        assert self._resume_seq is not None
        seq = self._first_seq
        for item in itertools.chain(head, it):
            rows = _rows_of(item)
            k = 1 if rows is None else self._steps_of(rows)
            if seq + k - 1 >= self._resume_seq:
                if seq < self._resume_seq:
                    # a message of several steps, some consumed before: sent again under its
                    # own seq, the daemon takes only the steps it has not consumed
                    self._next_seq = seq
                yield item
            seq += k

    @property
    def unacked(self) -> list[int]:
        """Sequence numbers sent and neither acknowledged nor rejected, in order."""
        return list(self._unacked)

    @property
    def schema(self) -> Optional[list[dict]]:
        return self._schema

    @property
    def batch_size(self) -> Optional[int]:
        """The daemon's global batch size (from WELCOME), or None before it."""
        return None if self.welcome is None else self.welcome.get("batch_size")

    @property
    def socket(self) -> zmq.Socket:
        return self._sock

    @property
    def transport(self) -> Optional[str]:
        """How batches travel: ``"shm"`` (written into the shared-memory pool, a ``BATCH_SHM``
        descriptor on the socket) or ``"socket"`` (``BATCH`` frames); None before WELCOME."""
        if self.welcome is None:
            return None
        return "shm" if self._shm is not None else "socket"

    @property
    def shm_refused(self) -> Optional[str]:
        """Why batches go over the socket although a pool was asked for (the daemon's
        ``shm_refused``, or why its pool could not be mapped here); None otherwise."""
        return self._shm_why if self._shm is None else None

    # -- receiving -------------------------------------------------------------------------

    def _handle(self, frames: list) -> P.Message:
        msg = P.unpack_message(frames)
        if msg.type == P.ACK:
            # Cumulative: every unacknowledged batch up to msg.seq was consumed (batches are
            # consumed in order); msg.credit is how many this ACK covers. A message of k steps
            # is the batches seq .. seq + k - 1.
            steps = self._steps
            if self._shm is not None:
                self._shm.ack(msg.seq)
            done = [s for s in self._unacked if s + steps.get(s, 1) - 1 <= msg.seq]
            for s in done:
                del self._unacked[s]
                if steps:
                    steps.pop(s, None)
                if self._lent:
                    self._give_back(s)
            self._credit += msg.credit
            if msg.seq > self._acked_seq:
                self._acked_seq = msg.seq
            if self.on_ack is not None:
                # (an ACK of the first steps of a message of several steps completes none)
                partial = not done and bool(steps) and next(iter(self._unacked)) <= msg.seq
                for s in done if done or partial else [msg.seq]:
                    self.on_ack(s)
        elif msg.type == P.CREDIT:
            self._credit += msg.credit
        elif msg.type == P.ERROR:
            self._credit += msg.credit
            if msg.seq is not None:
                if self._shm is not None:
                    self._shm.release(msg.seq)
                self._unacked.pop(msg.seq, None)
                self._steps.pop(msg.seq, None)
                self._give_back(msg.seq)
            err = self._error(msg.body)
            if err.code == P.ECLOSED:
                self._eclosed = err
            self._errors.append(err)
        elif msg.type == P.PREDICTION:
            self._predictions.append((msg.seq, msg.arrays))
        elif msg.type == P.BYE:
            self.bye = msg.body
        elif msg.type == P.WELCOME:
            self._welcome(msg.body)
            self._welcomes += 1
        return msg

    def _error(self, body: dict) -> InfeedError:
        code = str(body.get("code", "EPROTO"))
        if code.startswith("IFD_"):  # the runtime's enum name for a protocol code name
            code = code[4:]
        cls = RunEnded if code == P.ECLOSED else InfeedError
        err = cls(code, str(body.get("message", "")), body.get("seq"), body)
        return err

    def _drain(self) -> list[P.Message]:
        """Handles every message that has arrived, without blocking."""
        out = []
        # ZMQ_EVENTS first: a recv that finds nothing raises zmq.Again, which costs more than
        # the rest of a send
        while self._sock.get(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            out.append(self._handle(frames))
        return out

    def _pump(self, done, what: str, timeout: Any = ...) -> None:
        """Receives until ``done()`` is true; raises TimeoutError after ``timeout`` seconds
        without a message."""
        if timeout is ...:
            timeout = self.timeout
        self._drain()
        last = time.monotonic()
        while not done():
            if timeout is None:
                wait_ms = 1000
            else:
                left = last + timeout - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"infeed producer{' ' + repr(self.name) if self.name else ''}: {what}: "
                        f"nothing from the daemon at "
                        f"{self.endpoint} for {timeout:g} s ({len(self._unacked)} batches "
                        f"unacknowledged, credit {self._credit}, next seq {self._next_seq}, "
                        f"acknowledged up to {self._acked_seq}); is infeedd running there?")
                wait_ms = max(1, min(1000, int(left * 1000) + 1))
            if not self._watch.connected:
                self._watch.check()
                wait_ms = min(wait_ms, 50)
            if self._sock.poll(wait_ms, zmq.POLLIN):
                if self._drain():
                    last = time.monotonic()

    def _raise_pending(self, skip_eclosed: bool = False) -> None:
        while self._errors:
            err = self._errors.popleft()
            if skip_eclosed and err.code == P.ECLOSED:
                continue
            if isinstance(err, RunEnded):
                err.bye = self.bye
            raise err

    def _run_ended(self) -> RunEnded:
        if self.bye is not None:
            b = self.bye
            msg = (f"the run has ended ({b.get('status')}, {b.get('reason')}) at global step "
                   f"{b.get('global_step')}")
            if b.get("message"):
                msg += f": {b['message']}"
            return RunEnded(P.ECLOSED, msg, None, None, bye=b)
        e = self._eclosed
        return RunEnded(P.ECLOSED, e.message, e.seq, e.body, bye=None)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("infeed producer: the socket is closed")

    # -- the protocol ----------------------------------------------------------------------

    def hello(self, schema: Optional[Sequence[Any]] = None) -> dict:
        """Sends HELLO and waits for WELCOME (returned, and kept as :attr:`welcome`). Raises
        :class:`InfeedError` with the daemon's code and sentence if it answers ERROR."""
        self._check_open()
        if schema is not None:
            self._schema = _normalize_schema(schema)
        if self._schema is None:
            raise ValueError("hello: no schema (pass schema= or send a batch)")
        extra: dict[str, Any] = {} if self.replica is None else {"replica": self.replica}
        ask = self._shm_mode is True or (self._shm_mode == "auto" and self._shm_broken is None
                                         and S.is_local(self.endpoint))
        if ask:
            extra["shm"] = True
        self._sock.send_multipart(P.hello_frames(self._schema, self.name, self._first_seq
                                                 if self.welcome is None else self._next_seq,
                                                 **extra))
        before = self._welcomes
        got: list = []

        def done() -> bool:
            for err in list(self._errors):
                if err.seq is None:
                    self._errors.remove(err)
                    got.append(err)
                    return True
            return self._welcomes != before

        self._pump(done, "waiting for WELCOME")
        if got:
            err = got[0]
            if isinstance(err, RunEnded):
                err.bye = self.bye
                self._eclosed = err
            raise err
        self._adopt_pool(ask)
        return self.welcome  # type: ignore[return-value]

    def _adopt_pool(self, asked: bool) -> None:
        """After a WELCOME: maps the pool it gives (the previous one is unmapped: the daemon
        keeps it while its steps are in flight), or says why there is none."""
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        self._shm_why = None
        if not asked:
            return
        assert self.welcome is not None and self._schema is not None
        desc = self.welcome.get("shm")
        who = f"infeed producer{' ' + repr(self.name) if self.name else ''}"
        if desc is None:
            self._shm_why = str(self.welcome.get("shm_refused") or
                                "the WELCOME has no pool and no shm_refused")
            if self._shm_mode is True:
                raise ShmError(f"{who}: shm=True, but the daemon at {self.endpoint} gave no "
                               f"shared-memory pool: shm_refused: {self._shm_why}")
            return
        try:
            self._shm = S.Pool(desc, self._schema, int(self.welcome["batch_size"]))
        except S.ShmMapError as e:
            self._shm_why = str(e)
            if self._shm_mode is True:
                raise ShmError(f"{who}: shm=True, but the daemon's shared-memory pool cannot "
                               f"be used here: {e}") from None
            # auto: HELLO again without shm, so that the daemon drops the pool
            self._shm_broken = str(e)
            warnings.warn(f"{who}: the shared-memory pool cannot be used, batches go over the "
                          f"socket: {e}", RuntimeWarning, stacklevel=4)
            self.hello()
            self._shm_why = str(e)

    def _welcome(self, body: dict) -> None:
        self.welcome = body
        if self._resume_seq is None:
            self._resume_seq = int(body.get("next_seq", self._next_seq))
        if body.get("name"):
            self.name = body["name"]
        if body.get("schema"):
            self._schema = _normalize_schema(body["schema"])
        self._next_seq = int(body.get("next_seq", self._next_seq))
        # (the daemon's credit less this producer's steps in flight, which docs/protocol.md
        # says WELCOME's credit is already: their ACKs return those)
        self._credit = int(body.get("credit", 0))
        self._eclosed = None

    def _encode(self, arrays: Mapping[str, Any], copy: bool) -> tuple[list, int]:
        assert self._schema is not None
        names = [e["name"] for e in self._schema]
        missing = [n for n in names if n not in arrays]
        extra = [n for n in arrays if n not in names]
        if missing or extra:
            parts = []
            if missing:
                parts.append("missing " + ", ".join(repr(n) for n in missing))
            if extra:
                parts.append("unknown " + ", ".join(repr(n) for n in extra))
            raise ValueError(f"send: tensors {'; '.join(parts)} (the schema has "
                             f"{', '.join(repr(n) for n in names)})")
        frames = []
        rows = None
        for entry in self._schema:
            name = entry["name"]
            a = _convert(name, arrays[name], entry)
            if copy:
                a = a.copy()
            shape = tuple(entry["shape"])
            if a.ndim != 1 + len(shape) or a.shape[1:] != shape:
                want = "(rows" + "".join(f", {d}" for d in shape) + ")"
                raise ValueError(f"tensor '{name}': expected shape {want} (per-row shape "
                                 f"{list(shape)}), got {a.shape}")
            if rows is None:
                rows = a.shape[0]
            elif a.shape[0] != rows:
                raise ValueError(f"tensor '{name}': {a.shape[0]} rows, but "
                                 f"'{self._schema[0]['name']}' has {rows}")
            frames.append(a)
        assert rows is not None
        return frames, rows

    def _steps_of(self, rows: int) -> int:
        """The steps a batch of ``rows`` carries (train, eval: rows = k x batch_size, k up to
        WELCOME's max_steps_per_message); ValueError for rows the daemon would refuse."""
        w = self.welcome
        bs = self.batch_size
        if w is None or bs is None or w.get("mode", "train") == "predict":
            return 1
        most = int(w.get("max_steps_per_message", 1))
        if rows % bs == 0 and 1 <= rows // bs <= most:
            return rows // bs
        more = (f", or a multiple of it up to {most} x {bs} (max_steps_per_message)"
                if most > 1 else "")
        raise ValueError(f"send: {rows} rows, the daemon's batch_size is {bs}{more} "
                         f"({w.get('mode', 'train')} mode takes full batches only)")

    def send(self, mapping: Optional[Mapping[str, Any]] = None, /, *, copy: bool = False,
             **arrays: Any) -> int:
        """Sends one batch: ``send(x=..., y=...)`` or ``send({"x": ..., "y": ...})``. Blocks while
        there is no credit. Returns the batch's sequence number."""
        self._check_open()
        if self._ended:
            raise ValueError("infeed producer: send after end()")
        tensors: dict[str, Any] = dict(mapping) if mapping is not None else {}
        tensors.update(arrays)
        self._drain()
        self._raise_pending()
        if self.bye is not None or self._eclosed is not None:
            raise self._run_ended()
        if self.welcome is None:
            if self._schema is None:
                self._schema = _derive_schema(tensors)
            self.hello()
        pool = self._shm
        frames, rows = self._encode(tensors, copy and pool is None)
        k = self._steps_of(rows)
        if pool is not None and rows > k * pool.batch_size:
            # predict mode, more rows than a slot holds: sent as BATCH, which the daemon refuses
            # as it refuses any batch of more than batch_size rows (ESHAPE)
            pool = None
        self._await(k, pool)
        seq = self._next_seq
        if pool is not None:
            s = pool.find(k)
            assert s is not None
            for v, a in zip(pool.arrays(s, k, rows).values(), frames):
                v[...] = a
            return self._sent_shm(pool, s, k, rows)
        header = P.pack_batch_header(seq, rows, len(frames))
        self._sock.send_multipart([header, *frames], copy=False)
        return self._sent(k, frames)

    def _await(self, k: int, pool: Optional[S.Pool]) -> None:
        """Waits for k credits (and, over shared memory, k free slots in a row); raises a pending
        ERROR, or RunEnded after BYE."""
        def ready() -> bool:
            if self._credit < k:
                return False
            if pool is None or pool.find(k) is not None:
                return True
            if not pool.inflight:  # nothing will free them
                raise ValueError(f"send: the shared-memory pool has no {k} free slots in a row "
                                 f"and no batch in flight: the buffer() not committed yet holds "
                                 f"them (commit() it first)")
            return False

        if not ready():  # (the caller's _drain handled what had arrived)
            self._pump(lambda: ready() or bool(self._errors) or self.bye is not None,
                       "waiting for credit" if pool is None else
                       "waiting for credit and free slots of the shared-memory pool")
        self._raise_pending()
        if self.bye is not None:
            raise self._run_ended()

    def _sent(self, k: int, frames: list) -> int:
        """Books the message just sent under the next sequence number (returned)."""
        seq = self._next_seq
        self._credit -= k
        self._next_seq += k
        self._unacked[seq] = frames
        if k > 1:
            self._steps[seq] = k
        return seq

    def _sent_shm(self, pool: S.Pool, s: int, k: int, rows: int) -> int:
        """Sends the BATCH_SHM descriptor of the k steps written at slot s."""
        seq = self._next_seq
        self._sock.send(P.pack_batch_shm_header(seq, rows, s))
        pool.take(s, k, seq)
        return self._sent(k, [])

    # -- writing in place ----------------------------------------------------------------------

    def buffer(self, steps: int = 1) -> dict[str, np.ndarray]:
        """Arrays to fill in place for the next batch, one per schema tensor, of
        ``steps x batch_size`` rows (train and eval: ``steps`` up to WELCOME's
        ``max_steps_per_message``; predict: 1), then :meth:`commit` sends them without a copy.
        The arrays come from a pool: once their batch is acknowledged, a later ``buffer()`` of
        the same size hands them out again, so a loader that fills them allocates nothing after
        the first few batches. Do not touch them after ``commit()`` (they are sent from where
        they are) until ``buffer()`` returns them again. Sends ``HELLO`` first when needed (the
        schema must be known: ``Producer(schema=...)``).

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
            if self._schema is None:
                raise ValueError("buffer: no schema yet: pass schema= to Producer (or send a "
                                 "batch first)")
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

    def poll(self) -> None:
        """Handles what has arrived (ACKs, CREDITs, ERRORs, BYE) without blocking, and raises a
        pending ERROR."""
        self._check_open()
        self._drain()
        self._raise_pending()

    def wait(self, timeout: Any = ...) -> int:
        """Blocks until every sent batch is acknowledged (or rejected), or BYE arrives. Returns
        :attr:`acked_seq`."""
        self._check_open()
        self._pump(lambda: not self._unacked or bool(self._errors) or self.bye is not None,
                   "waiting for ACKs", timeout)
        self._raise_pending()
        return self._acked_seq

    def predictions(self, timeout: Any = ...):
        """Predict mode: yields ``(seq, arrays)`` for each batch sent, in order, where ``arrays``
        maps names to numpy arrays with the batch's rows (padding removed): classifiers give
        ``probabilities`` float32 [rows, K] and ``classes`` int32 [rows]; linear ``outputs``
        float32 [rows, K]. A batch's PREDICTION comes before its ACK, so the iterator ends once
        every batch sent so far is acknowledged (or the run has ended). It may be called while
        sending, to take what has arrived, and again after :meth:`end`. Predictions that arrive
        are kept until taken: memory grows with the batches sent and not yet iterated."""
        self._check_open()
        while True:
            self._drain()
            while self._predictions:
                yield self._predictions.popleft()
            self._raise_pending(skip_eclosed=True)
            if not self._unacked or self.bye is not None:
                self._drain()
                while self._predictions:
                    yield self._predictions.popleft()
                return
            self._pump(lambda: bool(self._predictions) or bool(self._errors) or
                       not self._unacked or self.bye is not None, "waiting for predictions",
                       timeout)

    def end(self, wait_bye: bool = True, timeout: Any = ...) -> Optional[dict]:
        """Sends END (once), waits until every batch sent is acknowledged and, with ``wait_bye``,
        until the daemon's BYE; returns the BYE JSON (also :attr:`bye`), or None when it has not
        come. With several producers the run (and so BYE) ends only when all have sent END: pass
        ``wait_bye=False`` there. ``ECLOSED`` rejections are not raised here (the run ended);
        other pending errors are, and calling end() again goes on waiting."""
        self._check_open()
        if not self._ended:
            self._ended = True
            if self.welcome is not None and self.bye is None:
                self._sock.send_multipart(P.end_frames())
        if self.welcome is None:
            return self.bye
        what = "waiting for the end of the run" if wait_bye else "waiting for ACKs after END"
        while True:
            self._pump(lambda: self.bye is not None or bool(self._errors)
                       or (not wait_bye and not self._unacked), what, timeout)
            self._raise_pending(skip_eclosed=True)
            if self.bye is not None or (not wait_bye and not self._unacked):
                return self.bye

    def close(self, linger: Optional[int] = None) -> None:
        """Closes the socket. ``linger`` (ms): how long unsent messages are kept; by default 0,
        or 1000 after an end() that did not see BYE (so END itself goes out)."""
        if self._closed:
            return
        self._closed = True
        self._watch.close()
        if linger is None:
            linger = 1000 if (self._ended and self.bye is None and self.welcome is not None) else 0
        self._sock.close(linger=linger)
        self._unmap()

    def _unmap(self) -> None:
        """Unmaps the pool (left to the garbage collector while arrays of buffer() still point
        into it)."""
        pool, self._shm = self._shm, None
        self._pending = None
        if pool is not None:
            pool.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.end()
            finally:
                self.close()
        else:
            self.close(linger=0)

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._watch.close()
                self._sock.close(linger=0)
                self._unmap()
        except Exception:
            pass
