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

    def __reduce__(self):
        # the default rebuilds from args (the one sentence), which these constructors do not
        # take: a worker process's error would not cross a multiprocessing pipe
        return _rebuild, (type(self), str(self), dict(self.__dict__))


def _rebuild(cls, text: str, state: dict) -> InfeedError:
    e = cls.__new__(cls)
    Exception.__init__(e, text)
    e.__dict__.update(state)
    return e


class _EndOf:
    """What the BYE says of the run's end (``docs/protocol.md``, BYE; the end summary's keys):
    ``status`` (``"ok"`` or ``"error"``), ``reason`` (``last_step``, ``input_ended``,
    ``stopped``, ``early_stopping``, ``error``), ``global_step``, ``error`` (with status
    ``"error"``: the first error, ``<source>: <sentence>``, else None); all None while no BYE
    has arrived."""

    bye: Optional[dict]

    @property
    def status(self) -> Optional[str]:
        return None if self.bye is None else self.bye.get("status")

    @property
    def reason(self) -> Optional[str]:
        return None if self.bye is None else self.bye.get("reason")

    @property
    def global_step(self) -> Optional[int]:
        return None if self.bye is None else self.bye.get("global_step")

    @property
    def error(self) -> Optional[str]:
        if self.bye is None or self.bye.get("status") != "error":
            return None
        return self.bye.get("message") or "(the daemon gave no sentence)"


class RunEnded(_EndOf, InfeedError):
    """The daemon takes no more batches: it sent ``BYE`` (the run ended) or rejected a batch with
    ``ECLOSED`` (the input has ended or the run is ending). ``bye`` holds the BYE JSON when it
    has arrived, else ``None``; ``status``, ``reason``, ``global_step`` and ``error`` read it. A
    producer that streams until the daemon has had enough catches this and stops.

    A run that ended with an error is never only a ``RunEnded``: once its BYE has come,
    :class:`RunFailed` is raised instead (from ``send``, and from ``end()``, which a ``with``
    block's exit calls), and it is not a subclass of this class, so ``except RunEnded`` does not
    hide it."""

    def __init__(self, code: str, message: str, seq: Optional[int] = None,
                 body: Optional[dict] = None, bye: Optional[dict] = None):
        super().__init__(code, message, seq, body)
        self.bye = bye


class RunFailed(_EndOf, InfeedError):
    """The run ended with an error (its BYE's ``status`` is ``"error"``: a model that diverged
    for ``--max-skipped-steps`` steps in a row, a device failure...): ``error`` is the daemon's
    sentence (``outfeed: 100 steps in a row ... were skipped ...``), ``bye`` the whole BYE, ``global_step`` where it stopped. The code is
    ``ECLOSED``: the daemon takes no more batches. Deliberately not a :class:`RunEnded`, so that
    the ``except infeed.RunEnded`` that stops a loader at a clean end lets it through."""

    def __init__(self, bye: dict, who: str = "infeed producer"):
        self.bye = dict(bye)
        super().__init__("ECLOSED", f"{who}: the run ended with an error at global step "
                                    f"{self.bye.get('global_step')}: {self.error}")


class ShmError(InfeedError):
    """``Producer(shm=True)`` got no shared-memory pool: the daemon refused it (its
    ``shm_refused`` sentence is quoted) or the pool cannot be mapped here (another user, another
    PID namespace, a file that is not the pool). The code is ``ESHM``, the client's own: the daemon
    welcomed the producer."""

    def __init__(self, message: str):
        super().__init__("ESHM", message)


class CheckpointError(InfeedError, ValueError):
    """A checkpoint that ``infeed.checkpoint.load`` cannot load (``docs/checkpoint.md``): the
    message is one sentence, ``checkpoint 'PATH': FIELD: expected EXPECTED, got FOUND``, with the
    checks of the daemon's loader. Attributes: ``path`` (the file, or the folder when none of a
    folder's checkpoints loads), ``field`` (``size``, ``magic``, ``version``, ``header length``,
    ``header``, ``checksum``, ``header: 'optimizer.slots'``...; ``file`` or ``folder`` when there
    is nothing to read), ``expected`` and ``found`` (text). ``code``: ``EPROTO`` (not a valid checkpoint: damaged, truncated, another format),
    ``ENOTFOUND`` (no such file, or a folder without checkpoints) or ``EIO`` (unreadable). Also
    a ``ValueError``."""

    def __init__(self, code: str, message: str, path: str = "", field: str = "",
                 expected: str = "", found: str = ""):
        self.path = str(path)
        self.field = field
        self.expected = expected
        self.found = found
        super().__init__(code, message)

    def __str__(self) -> str:
        return self.message
