"""A raw DEALER peer for the protocol tests: sends any frames, sorts what comes back."""

from __future__ import annotations

import time

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from infeed import protocol as P


class RawPeer:
    def __init__(self, endpoint: str, slow_reader: bool = False, handshake: bool = False):
        """slow_reader: a peer whose socket holds one message and a small kernel buffer, so that
        while it does not read, the daemon's queue to it fills after a few replies. handshake:
        its socket's monitor reports the ZMTP handshake, which connected() waits for."""
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if slow_reader:
            self.sock.setsockopt(zmq.RCVHWM, 1)
            self.sock.setsockopt(zmq.RCVBUF, 4096)
        self._mon = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED) \
            if handshake else None
        self.sock.connect(endpoint)
        self.acks: list[int] = []  # one entry per acknowledged batch (ACKs are cumulative)
        self.pending: list[int] = []  # seqs of the batches sent and not yet answered
        self.credits: list[int] = []
        self.errors: list[dict] = []
        self.welcomes: list[dict] = []
        self.byes: list[dict] = []
        self.other: list[P.Message] = []
        self.probes = 0
        self.received: list[tuple] = []  # (type, seq, credit) of every message, in order

    def send(self, frames) -> None:
        h = bytes(frames[0]) if frames else b""
        if len(h) >= 32 and h[:4] == P.MAGIC and \
                int.from_bytes(h[6:8], "little") in (P.BATCH, P.BATCH_SHM):
            self.pending.append(int.from_bytes(h[8:16], "little", signed=True))
        self.sock.send_multipart(frames)

    def _on_ack(self, m) -> None:
        """An ACK covers the batches in flight up to m.seq (m.credit of them)."""
        done = [s for s in self.pending if s <= m.seq][: max(m.credit, 1)]
        for s in done:
            self.pending.remove(s)
        self.acks.extend(done if done else [m.seq])

    def _on_credit(self, credit: int) -> None:
        if credit == 0:  # the daemon's liveness probe (docs/protocol.md, CREDIT): no credit
            self.probes += 1
        else:
            self.credits.append(credit)

    def _on_error(self, body) -> None:
        if body.get("seq") in self.pending:
            self.pending.remove(body["seq"])
        self.errors.append(body)

    def _recv(self, timeout: float) -> bool:
        if not self.sock.poll(int(timeout * 1000)):
            return False
        m = P.unpack_message(self.sock.recv_multipart())
        self.received.append((m.type, m.seq, m.credit))
        {P.ACK: lambda: self._on_ack(m), P.CREDIT: lambda: self._on_credit(m.credit),
         P.ERROR: lambda: self._on_error(m.body), P.WELCOME: lambda: self.welcomes.append(m.body),
         P.BYE: lambda: self.byes.append(m.body)}.get(m.type, lambda: self.other.append(m))()
        return True

    def until(self, cond, what: str, timeout: float = 5.0):
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what}; errors {self.errors[-5:]}, "
                                     f"{len(self.acks)} batches acked (the last "
                                     f"{self.acks[-10:]}), welcomes {self.welcomes}, byes "
                                     f"{self.byes}")
            self._recv(min(left, 0.2))

    def credit_returned(self) -> int:
        """The credits every ACK, CREDIT and ERROR received so far returned."""
        return sum(c or 0 for t, _, c in self.received if t in (P.ACK, P.CREDIT, P.ERROR))

    def error(self, timeout: float = 5.0) -> dict:
        """The next ERROR (ACKs and CREDITs arriving meanwhile are recorded)."""
        n = len(self.errors)
        self.until(lambda: len(self.errors) > n, "an ERROR", timeout)
        return self.errors.pop(n)

    def welcome(self, timeout: float = 5.0) -> dict:
        n = len(self.welcomes)
        self.until(lambda: len(self.welcomes) > n or len(self.errors) > 0, "WELCOME", timeout)
        assert not self.errors, f"HELLO answered with ERROR: {self.errors}"
        return self.welcomes[-1]

    def ack(self, seq: int, timeout: float = 5.0) -> None:
        self.until(lambda: seq in self.acks or bool(self.errors), f"the ACK of batch {seq}",
                   timeout)
        assert not self.errors, f"batch {seq}: expected an ACK, got ERROR {self.errors}"

    def drain(self, timeout: float = 0.3) -> None:
        """Receives (and records) whatever arrives for a while."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._recv(0.05)

    def quiet(self, timeout: float = 0.3) -> None:
        """Receives for a while; nothing but ACK/CREDIT may arrive."""
        self.drain(timeout)
        assert not self.errors, f"unexpected ERROR: {self.errors}"

    def connected(self, timeout: float = 5.0) -> "RawPeer":
        """Until the ZMTP handshake with the daemon succeeded (made with handshake=True)."""
        assert self._mon is not None, "RawPeer(handshake=True) has a monitor"
        assert self._mon.poll(int(timeout * 1000)), f"no handshake within {timeout} s"
        assert recv_monitor_message(self._mon)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
        self.sock.disable_monitor()
        self._mon.close(0)
        self._mon = None
        return self

    def close(self) -> None:
        if self._mon is not None:
            self._mon.close(0)
        self.sock.close(0)


def xy_schema(features: int) -> list:
    """HELLO's schema of the built-in programs: x float32 [features], y int32."""
    return [P.schema_entry("x", "float32", [features]), P.schema_entry("y", "int32", [])]


def xy_tensors(nrng, rows: int, features: int, classes: int) -> list:
    """Random tensors of xy_schema: x uniform in [0, 1), y labels in [0, classes) (nrng: a numpy
    Generator)."""
    return [nrng.random((rows, features), dtype=np.float32),
            nrng.integers(0, classes, rows, dtype=np.int32)]


def hello(schema, name=None, **kw):
    return P.hello_frames(schema, name, **kw)


def shm_frames(seq: int, rows: int, slot: int, flags: int = 0):
    """A BATCH_SHM: the 32-byte descriptor of rows written at ``slot`` of the peer's pool."""
    return [P.pack_batch_shm_header(seq, rows, slot, flags)]


def batch_frames(seq: int, tensors, rows=None, ntensors=None, flags=0):
    """A BATCH: tensors are numpy arrays (or raw bytes, sent as they are); rows defaults to the
    first array's, ntensors to the number of tensors."""
    if rows is None:
        rows = next(t.shape[0] for t in tensors if isinstance(t, np.ndarray))
    hdr = P.pack_batch_header(seq, rows, len(tensors) if ntensors is None else ntensors, flags)
    return [hdr, *[t if isinstance(t, bytes) else np.ascontiguousarray(t).tobytes()
                   for t in tensors]]
