"""The producer side of the ingest protocol (docs/protocol.md): a DEALER socket that streams
batches of numpy arrays to infeedd, within the credit the daemon grants."""

from __future__ import annotations

import warnings
from collections import OrderedDict, deque
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import zmq

from . import keys as K
from . import protocol as P
from . import shm as S
from ._connect import DEFAULT_CONNECT_TIMEOUT, ConnectWatch, check_timeout
from ._inplace import InPlace
from ._replies import Replies
from .convert import encode, item_rows, normalize_schema
from .errors import InfeedError, RunEnded, ShmError

_DEFAULT_TIMEOUT = 60.0


class Producer(Replies, InPlace):
    """Streams batches to infeedd over a ZeroMQ DEALER socket (ingest protocol version 1).

    ``Producer(endpoint, name=None, schema=None, first_seq=0, timeout=60.0, replica=None,
    shm="auto", round_floats=False, role="train")``

    - ``endpoint``: the daemon's ``--listen`` address, e.g. ``"tcp://127.0.0.1:5555"``.
    - ``name``: the producer's name (the daemon makes one up when it is None).
    - ``schema``: None (the default): ``HELLO`` carries no schema and the producer takes the
      program's from ``WELCOME`` (:attr:`schema`): batches are matched to it by name, whatever
      the keyword order, and converted to its dtypes (:mod:`infeed.convert`); ``HELLO`` is sent
      by the first :meth:`send`, :meth:`buffer` or :meth:`hello`. Given, as
      ``[{"name", "dtype", "shape"}]`` or ``[(name, dtype, shape)]``, it is sent in ``HELLO`` now
      (the constructor waits for ``WELCOME``) and the daemon checks it against its program.
    - ``round_floats``: converting a batch may round floats (``float64`` into ``float32``) only
      when True; otherwise such a batch is a :class:`TypeError` that says so.
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
      are for, sent in ``HELLO``; None (the other input modes, and a per-core eval producer: the
      eval set is one pool) sends no replica. Each batch then has the WELCOME's ``batch_size``
      rows (``global_batch_size / replicas``).
    - ``role``: ``"train"`` (the default) or ``"eval"``: an eval producer sends the eval set of
      evaluation during training (a daemon started with ``--eval-every N``): its batches are
      checked, kept in the daemon's memory and acknowledged at once, never trained on; its
      :meth:`end` completes the eval set (docs/protocol.md, "Eval producers").
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
    takes no more batches (``BYE``, or ``ECLOSED``) :meth:`send` raises :class:`RunEnded`, or,
    once a BYE says the run ended with an error, :class:`RunFailed` (not a RunEnded), which
    :meth:`end` raises too.

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
                 shm: Any = "auto", round_floats: bool = False, role: str = "train"):
        if role not in ("train", "eval"):
            raise ValueError(f"role: expected 'train' or 'eval', got {role!r}")
        self.role = role
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
        self._schema = normalize_schema(schema) if schema is not None else None
        self.round_floats = bool(round_floats)
        self._transport: Optional[str] = None  # what the last WELCOME set up; kept after close
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
        Sends ``HELLO`` first when it has not been sent. The items are what :meth:`send` takes
        (a mapping of tensors, or a tuple of them in schema order)::

            with Producer(endpoint, name="loader-0") as p:
                for batch in p.skip_consumed(make_batches()):
                    p.send(batch)
        """
        if self.welcome is None:
            self.hello()
        assert self._resume_seq is not None
        seq = self._first_seq
        for item in batches:
            rows = item_rows(item)
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
        """The tensors of every batch, in frame order: the program's, from WELCOME (or the
        ``schema=`` given, before WELCOME); None before both."""
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
        descriptor on the socket) or ``"socket"`` (``BATCH`` frames); None before WELCOME. It
        keeps saying what the last WELCOME set up after :meth:`end` and :meth:`close` (and so
        after a ``with`` block), although the pool is unmapped then."""
        return self._transport

    @property
    def shm_refused(self) -> Optional[str]:
        """Why batches go over the socket although a pool was asked for (the daemon's
        ``shm_refused``, or why its pool could not be mapped here); None otherwise."""
        return self._shm_why if self._transport != "shm" else None

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("infeed producer: the socket is closed")

    # -- the protocol ----------------------------------------------------------------------

    def hello(self, schema: Optional[Sequence[Any]] = None) -> dict:
        """Sends HELLO and waits for WELCOME (returned, and kept as :attr:`welcome`). The HELLO
        carries ``schema`` (or the one given before) when there is one, else none, and the
        program's schema comes in the WELCOME (:attr:`schema`). Raises :class:`InfeedError` with
        the daemon's code and sentence if it answers ERROR."""
        self._check_open()
        if schema is not None:
            self._schema = normalize_schema(schema)
        extra: dict[str, Any] = {} if self.replica is None else {"replica": self.replica}
        if self.role != "train":
            extra["role"] = self.role
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
        self._transport = "socket"
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
            self._transport = "shm"
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
            self._schema = normalize_schema(body["schema"])
        self._next_seq = int(body.get("next_seq", self._next_seq))
        # (the daemon's credit less this producer's steps in flight, which docs/protocol.md
        # says WELCOME's credit is already: their ACKs return those)
        self._credit = int(body.get("credit", 0))
        self._eclosed = None

    def _encode(self, batch: Any, copy: bool) -> tuple[list, int]:
        assert self._schema is not None
        frames, rows = encode(batch, self._schema, self.round_floats)
        return ([a.copy() for a in frames] if copy else frames), rows

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

    def send(self, batch: Any = None, /, *, copy: bool = False, **arrays: Any) -> int:
        """Sends one batch: ``send(x=..., y=...)``, ``send({"x": ..., "y": ...})`` (by name, in
        any order) or ``send((x, y))`` (a tuple or list: the tensors in schema order). Tensors
        are converted to the schema's dtypes by the rules of :mod:`infeed.convert`. Blocks while
        there is no credit. Returns the batch's sequence number."""
        self._check_open()
        if self._ended:
            raise ValueError("infeed producer: send after end()")
        if batch is not None and arrays:
            if not isinstance(batch, Mapping):
                raise ValueError("send: a tuple of tensors and tensors by keyword at once")
            batch = {**batch, **arrays}
        elif batch is None:
            batch = arrays
        self._drain()
        self._raise_pending()
        if self.bye is not None or self._eclosed is not None:
            raise self._run_ended()
        if self.welcome is None:
            self.hello()
        tensors = batch
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

    def end(self, wait_bye: Optional[bool] = None, timeout: Any = ...) -> Optional[dict]:
        """Sends END (once), waits until every batch sent is acknowledged and, with ``wait_bye``,
        until the daemon's BYE; returns the BYE JSON (also :attr:`bye`), or None when it has not
        come. With several producers the run (and so BYE) ends only when all have sent END: pass
        ``wait_bye=False`` there. ``wait_bye`` None (the default) is True for a train producer
        and False for an eval producer (``role="eval"``), whose END completes the eval set while
        the run goes on. ``ECLOSED`` rejections are not raised here (the run ended);
        other pending errors are, and calling end() again goes on waiting. A BYE whose status is
        ``"error"`` raises :class:`RunFailed` (each call), so that a run that failed is never
        taken for one that ended well (the exit of a ``with`` block calls end())."""
        self._check_open()
        if wait_bye is None:
            wait_bye = self.role != "eval"
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
            if self._failed():
                raise self._run_ended()
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
