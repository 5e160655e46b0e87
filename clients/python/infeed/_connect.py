"""Whether a client socket's first connection to the daemon came up, for the connect timeout.

ZeroMQ connects in the background and retries for ever, so a client of a daemon that is not
there would wait in silence. A monitor socket reports the ZMTP handshake (the daemon answered,
CURVE included) or its failure; a client waits at most ``connect_timeout`` seconds for it.
"""

from __future__ import annotations

import time
from typing import Optional

import zmq
from zmq.utils.monitor import recv_monitor_message

DEFAULT_CONNECT_TIMEOUT = 10.0

_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | \
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def check_timeout(connect_timeout: Optional[float]) -> Optional[float]:
    if connect_timeout is None:
        return None
    if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)) \
            or not connect_timeout > 0:
        raise ValueError(f"connect_timeout: expected None (no bound) or seconds > 0, got "
                         f"{connect_timeout!r}")
    return float(connect_timeout)


class ConnectWatch:
    """Watches ``sock`` (connected to ``endpoint`` just after this is made) until its first
    handshake. ``who`` names the client in the sentence, ``flag`` the daemon's flag for the
    endpoint (``--listen``)."""

    def __init__(self, sock: zmq.Socket, endpoint: str, connect_timeout: Optional[float],
                 who: str, flag: str):
        self.endpoint = endpoint
        self.timeout = connect_timeout
        self.who = who
        self.flag = flag
        self.connected = connect_timeout is None
        self.refused: Optional[str] = None
        self._doubt = False  # it connected to itself: only a daemon's message ends the watch
        self._start = time.monotonic()
        self._mon: Optional[zmq.Socket] = None
        self._sock = sock
        if not self.connected:
            self._mon = sock.get_monitor_socket(_EVENTS)

    def rearm(self) -> None:
        """Watches again, to the same deadline, after the socket reconnected because its
        handshake was with itself: from then on a handshake does not count, a daemon's message
        does (:meth:`confirm`), since the next handshake may be with itself again."""
        if self.timeout is None:
            return
        self._doubt = True
        self.connected = False
        self.refused = None
        if self._mon is None:
            self._mon = self._sock.get_monitor_socket(_EVENTS)

    def confirm(self) -> None:
        """A daemon's message arrived: connected."""
        if self._doubt:
            self._doubt = False
            self.connected = True
            self.close()

    def poll(self) -> bool:
        """Takes the events that arrived; True once the daemon has answered."""
        while self._mon is not None and not self.connected:
            try:
                ev = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except zmq.Again:
                break
            if ev["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = not self._doubt
            elif ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.refused = "it refused this client's CURVE key"
            else:
                self.refused = "the handshake failed (a CURVE setting that does not match " \
                               "the daemon's, or not an infeedd socket)"
        if self.connected:
            self.close()
        return self.connected

    def left(self) -> Optional[float]:
        """Seconds left before the connect timeout; None once connected (or without one)."""
        if self.poll() or self.timeout is None:
            return None
        return self._start + self.timeout - time.monotonic()

    def check(self) -> None:
        """Raises TimeoutError when the connect timeout has passed without a connection."""
        left = self.left()
        if left is not None and left <= 0:
            curve = self._sock.getsockopt(zmq.MECHANISM) == zmq.CURVE
            if self.refused and curve:
                why = f": {self.refused}"
            elif self.refused:  # a client without CURVE
                why = ": the handshake failed: it may require CURVE (give server_key_file= " \
                      "and key_file=), or it is not an infeedd socket"
            else:  # a refusal is not always reported to the client
                why = f"; is infeedd running with {self.flag} {self.endpoint}" + \
                    (", or does it refuse this client's key (CURVE)?" if curve else "?")
            raise TimeoutError(f"{self.who}: no daemon answered at {self.endpoint} within "
                               f"{self.timeout:g} s (connect_timeout){why}")

    def close(self) -> None:
        if self._mon is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._mon.close(linger=0)
            self._mon = None
