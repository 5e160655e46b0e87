"""The producer's side of the shared-memory transport (docs/protocol.md, "Shared memory"): whether
an endpoint is on this host, the pool the daemon's WELCOME describes mapped into this process,
and which of its slots are free.

The pool is a memfd of the daemon's: ``size`` bytes that start with the magic ``IFDSHM1\\0`` and
a 16-byte token, then one region per schema tensor (``offsets[i]``, ``slots x step_bytes[i]``
bytes). A message of k steps is written into k slots in a row of every region and described by
a 32-byte ``BATCH_SHM`` header; its slots are the producer's to write again once the daemon is
done with it (its steps acknowledged, the message refused, or dropped as a duplicate).
"""

from __future__ import annotations

import ipaddress
import mmap
import os
import re
from typing import Any, Optional

import numpy as np

from . import protocol as P

MAGIC = b"IFDSHM1\0"
TOKEN_LEN = 16
HEADER = 64  # core/wire.h IFD_SHM_HEADER: magic, token, zeros
ALIGN = 64  # every tensor region starts at a multiple of it

MODES = ("auto", True, False)


def check_mode(shm: Any) -> Any:
    """``shm=``: "auto", True or False (ValueError otherwise)."""
    if shm is True or shm is False or shm == "auto":
        return shm
    raise ValueError(f"shm: expected \"auto\", True or False, got {shm!r}")


def is_local(endpoint: str) -> bool:
    """Whether a producer at ``endpoint`` is on the daemon's host: ``ipc://``, or ``tcp://`` to
    a loopback address (127.0.0.0/8, ``localhost``, ``[::1]``)."""
    if endpoint.startswith("ipc://"):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    addr = endpoint[len("tcp://"):].rsplit(";", 1)[-1]  # tcp://source;destination
    host = addr.rsplit(":", 1)[0] if ":" in addr else addr
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False



FREE, RESERVED = -2, -1  # slot owners that are not a step's seq

class ShmMapError(Exception):
    """The pool of a WELCOME cannot be used here (the sentence says why)."""


_HEX = re.compile(r"[0-9a-fA-F]{32}")


def _int(desc: dict, key: str, low: int) -> int:
    v = desc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ShmMapError(f"WELCOME shm: '{key}': expected an integer >= {low}, got {v!r:.80}")
    return v


class Pool:
    """One mapped pool: ``views[i]`` is tensor i's region as an array of ``slots x batch_size``
    rows, and each slot holds the sequence number of the step written there (None: free)."""

    def __init__(self, desc: Any, schema: list[dict], batch_size: int):
        if not isinstance(desc, dict):
            raise ShmMapError(f"WELCOME shm: expected an object, got {desc!r:.80}")
        path = desc.get("path")
        if not isinstance(path, str) or not path:
            raise ShmMapError(f"WELCOME shm: 'path': expected a file name, got {path!r:.80}")
        size = _int(desc, "size", HEADER)
        slots = _int(desc, "slots", 1)
        token = desc.get("token")
        if not isinstance(token, str) or not _HEX.fullmatch(token):
            raise ShmMapError(f"WELCOME shm: 'token': expected {2 * TOKEN_LEN} hex digits, got "
                              f"{token!r:.80}")
        offsets, step_bytes = desc.get("offsets"), desc.get("step_bytes")
        for key, v in (("offsets", offsets), ("step_bytes", step_bytes)):
            if not isinstance(v, list) or len(v) != len(schema) or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v):
                raise ShmMapError(f"WELCOME shm: '{key}': expected {len(schema)} integers >= 0 "
                                  f"(one per schema tensor), got {v!r:.120}")
        assert isinstance(offsets, list) and isinstance(step_bytes, list)
        for i, e in enumerate(schema):
            want = batch_size * P.row_nbytes(e)
            if step_bytes[i] != want:
                raise ShmMapError(f"WELCOME shm: step_bytes[{i}] ('{e['name']}'): expected "
                                  f"{want} ({batch_size} rows of {e['shape']} {e['dtype']}), "
                                  f"got {step_bytes[i]}")
            if offsets[i] < HEADER or offsets[i] % ALIGN or \
                    offsets[i] + slots * step_bytes[i] > size:
                raise ShmMapError(f"WELCOME shm: offsets[{i}] ('{e['name']}'): expected a "
                                  f"multiple of {ALIGN} from {HEADER} with {slots} x "
                                  f"{step_bytes[i]} bytes after it within size {size}, got "
                                  f"{offsets[i]}")
        self.path, self.size, self.slots, self.token = path, size, slots, token
        self.batch_size = batch_size
        self._mm = _map(path, size, bytes.fromhex(token))
        try:
            self.views = [np.ndarray((slots * batch_size, *e["shape"]),
                                     dtype=np.dtype(P.DTYPES[e["dtype"]]), buffer=self._mm,
                                     offset=offsets[i]) for i, e in enumerate(schema)]
        except BaseException:
            self._mm.close()
            raise
        self.names = [e["name"] for e in schema]
        # slot -> seq of the step in it, FREE, or RESERVED (handed out by buffer(), not sent);
        # numpy so that a message of k steps costs a few vector operations, not k Python ones
        self.owner = np.full(slots, FREE, dtype=np.int64)
        self.cursor = 0  # where the next message's slots start (wrapping to 0)
        self.inflight: dict[int, tuple[int, int]] = {}  # message seq -> (first slot, k)
        self.reserved: Optional[tuple[int, int]] = None  # buffer(): (first slot, k)

    # -- slots -------------------------------------------------------------------------------

    def find(self, k: int) -> Optional[int]:
        """The first of k free slots in a row at the cursor (or at 0 when fewer than k are left
        before the end), or None when they are not free yet."""
        if k > self.slots:
            raise ValueError(f"shm: a message of {k} steps needs {k} slots, the pool has "
                             f"{self.slots}")
        s = self.cursor if self.cursor + k <= self.slots else 0
        if (self.owner[s:s + k] == FREE).all():
            return s
        # (a refused message, or a buffer dropped, frees slots behind the cursor): the first
        # window of k free slots, from the running count of free ones
        free = np.concatenate(([0], np.cumsum(self.owner == FREE)))
        starts = np.flatnonzero(free[k:] - free[:-k] == k)
        return int(starts[0]) if starts.size else None

    def take(self, s: int, k: int, seq: int) -> None:
        """Slots s .. s + k - 1 now hold the steps seq .. seq + k - 1, in flight."""
        self.owner[s:s + k] = np.arange(seq, seq + k, dtype=np.int64)
        self.inflight[seq] = (s, k)
        self.cursor = (s + k) % self.slots
        if self.reserved == (s, k):
            self.reserved = None

    def reserve(self, s: int, k: int) -> None:
        """buffer(): slots s .. s + k - 1 are handed out, not yet sent (owner RESERVED)."""
        self.owner[s:s + k] = RESERVED
        self.reserved = (s, k)
        self.cursor = (s + k) % self.slots

    def unreserve(self) -> None:
        """The slots reserved and not sent are free again."""
        if self.reserved is not None:
            s, k = self.reserved
            seg = self.owner[s:s + k]
            seg[seg == RESERVED] = FREE
            self.reserved = None
            if self.cursor == (s + k) % self.slots:  # dropped whole: the cursor goes back
                self.cursor = s

    def ack(self, seq: int) -> None:
        """ACK up to ``seq``: the slots of the steps up to it are free (a message's slots as its
        steps are acknowledged)."""
        for mseq, (s, k) in list(self.inflight.items()):
            if mseq > seq:
                continue
            last = min(k, seq - mseq + 1)
            self._free(s, last, mseq)
            if last == k:
                del self.inflight[mseq]

    def _free(self, s: int, n: int, seq: int) -> None:
        """Frees slots s .. s + n - 1 where they still hold the steps seq .. seq + n - 1 (a slot
        freed by an ACK of a message's first steps may hold a newer step by now)."""
        seg = self.owner[s:s + n]
        seg[seg == np.arange(seq, seq + n, dtype=np.int64)] = FREE

    def release(self, seq: int) -> None:
        """The message sent as ``seq`` is done with (acknowledged, refused or a duplicate)."""
        got = self.inflight.pop(seq, None)
        if got is not None:
            self._free(got[0], got[1], seq)

    def arrays(self, s: int, k: int, rows: Optional[int] = None) -> dict[str, np.ndarray]:
        """Views of slots s .. s + k - 1 of every tensor (the first ``rows`` rows)."""
        a = s * self.batch_size
        b = a + (rows if rows is not None else k * self.batch_size)
        return {n: v[a:b] for n, v in zip(self.names, self.views)}

    # -- the mapping -------------------------------------------------------------------------

    def close(self) -> bool:
        """Unmaps the pool; False when arrays handed out still point into it (it is then
        unmapped when the last of them is gone)."""
        self.views = []
        try:
            self._mm.close()
        except BufferError:
            return False
        return True


def _map(path: str, size: int, token: bytes, magic: bytes = MAGIC, writable: bool = True,
         what: str = "the pool", source: str = "WELCOME") -> mmap.mmap:
    """Maps ``path`` (``size`` bytes, shared; read-only unless ``writable``) and checks that it
    starts with ``magic`` and ``token``: the producers' pools and the subscribers' tensor ring
    (infeed.subscriber) share the layout of those first bytes."""
    try:
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    except OSError as e:
        raise ShmMapError(f"cannot open {what} {path}: {e.strerror} (a process of another "
                          f"user, or in another PID namespace, cannot)") from None
    try:
        got = os.fstat(fd).st_size
        if got != size:
            raise ShmMapError(f"{what} {path} is {got} bytes, {source}'s size says {size}")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        try:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        except OSError as e:
            raise ShmMapError(f"cannot map {what} {path} ({size} bytes): {e.strerror}") \
                from None
    finally:
        os.close(fd)
    head = mm[:len(magic) + TOKEN_LEN]
    if head[:len(magic)] != magic or head[len(magic):] != token:
        mm.close()
        which = "magic" if head[:len(magic)] != magic else "token"
        raise ShmMapError(f"{what} {path} is not the one {source} describes: its {which} "
                          f"differs (expected {magic!r} and token {token.hex()}, got {head!r})")
    return mm
