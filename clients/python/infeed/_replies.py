"""What the daemon sends a producer (ACK, CREDIT, ERROR, PREDICTION, BYE, WELCOME), the loop that
waits for it, and the exceptions it becomes. A part of :class:`infeed.Producer`, kept in its own
file."""

from __future__ import annotations

import time
from typing import Any, Union

import zmq

from . import protocol as P
from .errors import InfeedError, RunEnded, RunFailed


class Replies:
    """The receiving methods of :class:`infeed.Producer` (its state is the Producer's)."""

    def _handle(self, frames: list) -> P.Message:
        msg = P.unpack_message(frames)
        if msg.type in P.PRODUCER_TYPES:
            self._reconnect_from_self(frames)
            return msg
        self._watch.confirm()
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

    def _reconnect_from_self(self, frames: list) -> None:
        """A message of a type only producers send came back: the socket is connected to itself.
        A TCP client that connects to a port of the kernel's ephemeral range where nothing
        listens can be given that same port as its own (simultaneous open), and a ZeroMQ DEALER
        takes its own greeting for a peer's. Drops that connection and connects again (a new
        local port); before the first WELCOME the connect timeout watches again, to its first
        deadline. A HELLO that came back is sent again; another message that came back was not
        delivered and stays unacknowledged."""
        self._sock.disconnect(self.endpoint)
        self._sock.connect(self.endpoint)
        if self.welcome is None:
            self._watch.rearm()
        if P.unpack_header(frames[0]) == P.HELLO:
            self._sock.send_multipart(frames)

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
                if self._failed():
                    raise self._run_ended() from err
            raise err

    def _failed(self) -> bool:
        return self.bye is not None and self.bye.get("status") == "error"

    def _run_ended(self) -> Union[RunEnded, RunFailed]:
        """RunFailed when the BYE says the run ended with an error, else RunEnded."""
        if self._failed():
            assert self.bye is not None
            return RunFailed(self.bye, f"infeed producer{' ' + repr(self.name) if self.name else ''}")
        if self.bye is not None:
            b = self.bye
            msg = (f"the run has ended ({b.get('status')}, {b.get('reason')}) at global step "
                   f"{b.get('global_step')}")
            if b.get("message"):
                msg += f": {b['message']}"
            return RunEnded(P.ECLOSED, msg, None, None, bye=b)
        e = self._eclosed
        return RunEnded(P.ECLOSED, e.message, e.seq, e.body, bye=None)
