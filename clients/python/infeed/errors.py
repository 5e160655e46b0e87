"""Exceptions of the infeed client."""

from __future__ import annotations

from typing import Optional


class InfeedError(Exception):
    """The daemon answered ``ERROR``.

    Attributes: ``code`` (``EPROTO``, ``EINVAL``, ``ESHAPE``, ``EDTYPE``, ``ERANGE``,
    ``ECLOSED``, ``EPERM``), ``seq`` (the rejected batch's sequence number, or ``None`` when the rejected
    message was not a batch), ``message`` (the daemon's sentence) and ``body`` (the whole JSON).
    """

    def __init__(self, code: str, message: str, seq: Optional[int] = None,
                 body: Optional[dict] = None):
        self.code = code
        self.message = message
        self.seq = seq
        self.body = dict(body or {})
        where = f" (batch {seq})" if seq is not None else ""
        super().__init__(f"{code}{where}: {message}")


class RunEnded(InfeedError):
    """The daemon takes no more batches: it sent ``BYE`` (the run ended) or rejected a batch with
    ``ECLOSED`` (the input has ended or the run is ending). ``bye`` holds the BYE JSON when it
    has arrived, else ``None``. A producer that streams until the daemon has had enough catches
    this and stops."""

    def __init__(self, code: str, message: str, seq: Optional[int] = None,
                 body: Optional[dict] = None, bye: Optional[dict] = None):
        super().__init__(code, message, seq, body)
        self.bye = bye


class ShmError(InfeedError):
    """``Producer(shm=True)`` got no shared-memory pool: the daemon refused it (its
    ``shm_refused`` sentence is quoted) or the pool cannot be mapped here (another user, another
    PID namespace, a file that is not the pool). The code is ``ESHM``, the client's own: the daemon
    welcomed the producer."""

    def __init__(self, message: str):
        super().__init__("ESHM", message)
