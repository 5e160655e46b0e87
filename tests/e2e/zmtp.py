"""A raw ZMTP 3.0 peer over a plain TCP socket (NULL mechanism), for the flood tests: it can do
what a libzmq socket never does, such as send 999 frames of a message and hold back the last
(libzmq flushes a message to the wire only once it is complete)."""

from __future__ import annotations

import socket
import struct


def greeting() -> bytes:
    """The 64-byte ZMTP 3.0 greeting: signature, version 3.0, NULL, not as-server."""
    return (b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00"
            + b"\x00" * 31)


def frame(body: bytes, more: bool = False, command: bool = False) -> bytes:
    flags = (0x01 if more else 0) | (0x04 if command else 0)
    if len(body) > 255:
        return bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def long_frame_header(size: int, more: bool = False) -> bytes:
    """The header of a frame of size bytes (the body is sent separately, or never)."""
    return bytes([0x02 | (0x01 if more else 0)]) + struct.pack(">Q", size)


def ready(socket_type: str) -> bytes:
    prop = b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type.encode()
    return frame(b"\x05READY" + prop, command=True)


class RawZmtp:
    """A TCP connection that has done the NULL handshake as socket_type (DEALER, SUB, REQ)."""

    def __init__(self, host: str, port: int, socket_type: str, timeout: float = 5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.sendall(greeting() + ready(socket_type))
        self._want(64 + 2)  # the peer's greeting and at least its READY's header

    def _want(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            chunk = self.sock.recv(n - len(got))
            if not chunk:
                raise ConnectionError("closed during the handshake")
            got += chunk
        return got

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_unless_closed(self, data: bytes) -> bool:
        """send, for a peer the daemon is expected to close: False when it has closed (a reset
        or a broken pipe mid-send is that close, not a failure)."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def closed(self, timeout: float = 0.0) -> bool:
        """Whether the daemon has closed the connection (reads and drops what it sent)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except (socket.timeout, BlockingIOError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()
