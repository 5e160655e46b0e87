"""The infeed ingest protocol, version 1 (docs/protocol.md), as constants and pack/unpack helpers.

Every message is one ZeroMQ multipart message. Frame 0 is a binary header (all integers
little-endian)::

    offset 0  4 bytes  magic   b"IFDP"
    offset 4  2 bytes  version 1
    offset 6  2 bytes  type    HELLO=1 ... BATCH_SHM=10
    offset 8  ...      type-specific fields

This module has no state and no sockets: the :class:`infeed.Producer` and the tests build on it.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

MAGIC = b"IFDP"
VERSION = 1

HELLO = 1
WELCOME = 2
BATCH = 3
CREDIT = 4
ACK = 5
END = 6
ERROR = 7
PREDICTION = 8
BYE = 9
BATCH_SHM = 10
# what only producers send: a producer that receives one is connected to itself
PRODUCER_TYPES = (HELLO, BATCH, END, BATCH_SHM)

TYPE_NAMES = {
    HELLO: "HELLO",
    WELCOME: "WELCOME",
    BATCH: "BATCH",
    CREDIT: "CREDIT",
    ACK: "ACK",
    END: "END",
    ERROR: "ERROR",
    PREDICTION: "PREDICTION",
    BYE: "BYE",
    BATCH_SHM: "BATCH_SHM",
}

# Header sizes (frame 0) per message type.
HEADER_SIZE = 8
BATCH_HEADER_SIZE = 32
ACK_HEADER_SIZE = 24
CREDIT_HEADER_SIZE = 16

# BATCH flags (reserved for predict mode; must be 0 in train mode).
FLAG_STOPPING = 1 << 0
FLAG_PADDED = 1 << 1

# ERROR codes.
EPROTO = "EPROTO"
EINVAL = "EINVAL"
ESHAPE = "ESHAPE"
EDTYPE = "EDTYPE"
ERANGE = "ERANGE"
ECLOSED = "ECLOSED"
EBUSY = "EBUSY"
EPERM = "EPERM"
ERROR_CODES = (EPROTO, EINVAL, ESHAPE, EDTYPE, ERANGE, ECLOSED, EBUSY, EPERM)

# Tensor dtypes: protocol name -> numpy dtype string (little-endian).
DTYPES = {
    "float32": "<f4",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "u1",
}

# Largest HELLO JSON frame the daemon takes.
MAX_HELLO_JSON = 64 * 1024

_PREFIX = struct.Struct("<4sHH")  # magic, version, type
_BATCH = struct.Struct("<4sHHqqII")  # + seq, rows, flags, ntensors
_ACK = struct.Struct("<4sHHqII")  # + seq, credit, reserved
_CREDIT = struct.Struct("<4sHHII")  # + credit, reserved

assert _PREFIX.size == HEADER_SIZE
assert _BATCH.size == BATCH_HEADER_SIZE
assert _ACK.size == ACK_HEADER_SIZE
assert _CREDIT.size == CREDIT_HEADER_SIZE


class ProtocolError(ValueError):
    """A message that does not follow docs/protocol.md (raised by the unpack helpers)."""


def pack_header(msg_type: int, version: int = VERSION, magic: bytes = MAGIC) -> bytes:
    """The 8-byte header of HELLO, WELCOME, END, ERROR and BYE (and any message's prefix)."""
    return _PREFIX.pack(magic, version, msg_type)


def pack_batch_header(seq: int, rows: int, ntensors: int, flags: int = 0,
                      version: int = VERSION) -> bytes:
    """The 32-byte BATCH header."""
    return _BATCH.pack(MAGIC, version, BATCH, seq, rows, flags, ntensors)


def pack_batch_shm_header(seq: int, rows: int, slot: int, flags: int = 0,
                          version: int = VERSION) -> bytes:
    """The 32-byte BATCH_SHM header: BATCH's layout with type 10 and the message's first slot of
    the shared-memory pool where BATCH has ntensors (docs/protocol.md, "Shared memory")."""
    return _BATCH.pack(MAGIC, version, BATCH_SHM, seq, rows, flags, slot)


def pack_ack(seq: int, credit: int = 1) -> bytes:
    """The 24-byte ACK header (daemon side; used by tests and fakes)."""
    return _ACK.pack(MAGIC, VERSION, ACK, seq, credit, 0)


def pack_credit(credit: int) -> bytes:
    """The 16-byte CREDIT header (daemon side; used by tests and fakes)."""
    return _CREDIT.pack(MAGIC, VERSION, CREDIT, credit, 0)


def pack_json(obj: Any) -> bytes:
    """A JSON frame: compact UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def unpack_json(frame: bytes) -> Any:
    try:
        return json.loads(bytes(frame).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"JSON frame does not parse: {e}") from None


def unpack_header(frame: bytes) -> int:
    """Checks frame 0's magic and version and returns the message type."""
    frame = bytes(frame)
    if len(frame) < HEADER_SIZE:
        raise ProtocolError(f"header: {len(frame)} bytes, expected at least {HEADER_SIZE}")
    magic, version, msg_type = _PREFIX.unpack_from(frame)
    if magic != MAGIC:
        raise ProtocolError(f"header: magic: expected {MAGIC!r}, got {magic!r}")
    if version != VERSION:
        raise ProtocolError(f"header: protocol version: expected {VERSION}, got {version}")
    return msg_type


def unpack_batch_header(frame: bytes, msg_type: int = BATCH) -> tuple[int, int, int, int]:
    """Returns (seq, rows, flags, ntensors) of a BATCH header (or of a PREDICTION's, which has
    the same layout)."""
    frame = bytes(frame)
    if unpack_header(frame) != msg_type:
        raise ProtocolError(f"not a {TYPE_NAMES[msg_type]} header")
    if len(frame) != BATCH_HEADER_SIZE:
        raise ProtocolError(f"{TYPE_NAMES[msg_type]} header: {len(frame)} bytes, expected "
                            f"{BATCH_HEADER_SIZE}")
    _, _, _, seq, rows, flags, ntensors = _BATCH.unpack(frame)
    return seq, rows, flags, ntensors


def unpack_ack(frame: bytes) -> tuple[int, int]:
    """Returns (seq, credit) of an ACK header."""
    frame = bytes(frame)
    if len(frame) < ACK_HEADER_SIZE:
        raise ProtocolError(f"ACK header: {len(frame)} bytes, expected {ACK_HEADER_SIZE}")
    _, _, _, seq, credit, _ = _ACK.unpack_from(frame)
    return seq, credit


def unpack_credit(frame: bytes) -> int:
    """Returns the credit of a CREDIT header."""
    frame = bytes(frame)
    if len(frame) < CREDIT_HEADER_SIZE:
        raise ProtocolError(f"CREDIT header: {len(frame)} bytes, expected {CREDIT_HEADER_SIZE}")
    _, _, _, credit, _ = _CREDIT.unpack_from(frame)
    return credit


# Frames after the header, per message type.
FRAMES_AFTER_HEADER = {
    HELLO: 1,
    WELCOME: 1,
    CREDIT: 0,
    ACK: 0,
    END: 0,
    ERROR: 1,
    BYE: 1,
}


@dataclass
class Message:
    """A decoded daemon → producer message.

    ``type`` is the message type; ``seq`` and ``credit`` are filled for ACK and CREDIT (and for
    ERROR from its JSON); ``body`` is the JSON object of WELCOME, ERROR and BYE; a PREDICTION has
    ``seq`` (its batch's) and ``arrays`` (name -> numpy array, ``rows`` rows each, padding
    removed) and its tensor descriptions in ``body["tensors"]``.
    """

    type: int
    seq: Optional[int] = None
    credit: int = 0
    body: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)  # PREDICTION: name -> numpy array

    @property
    def name(self) -> str:
        return TYPE_NAMES.get(self.type, f"type {self.type}")


def unpack_message(frames: Sequence[bytes]) -> Message:
    """Decodes a daemon message (WELCOME, CREDIT, ACK, ERROR, BYE; any other type comes back
    with only ``type`` set, for the caller to ignore, as later protocol versions may add types)."""
    if not frames:
        raise ProtocolError("empty message")
    msg_type = unpack_header(frames[0])
    if msg_type == ACK:
        seq, credit = unpack_ack(frames[0])
        return Message(ACK, seq=seq, credit=credit)
    if msg_type == CREDIT:
        return Message(CREDIT, credit=unpack_credit(frames[0]))
    if msg_type == PREDICTION:
        return unpack_prediction(frames)
    if msg_type in (WELCOME, ERROR, BYE):
        if len(frames) != 2:
            raise ProtocolError(f"{TYPE_NAMES[msg_type]}: {len(frames)} frames, expected 2")
        body = unpack_json(frames[1])
        if not isinstance(body, dict):
            raise ProtocolError(f"{TYPE_NAMES[msg_type]}: JSON is not an object")
        if msg_type == ERROR:
            credit = body.get("credit") or 0
            return Message(ERROR, seq=body.get("seq"), credit=int(credit), body=body)
        return Message(msg_type, body=body)
    return Message(msg_type)


def unpack_prediction(frames: Sequence[bytes]) -> Message:
    """Decodes PREDICTION: the BATCH header layout (seq, rows, flags, ntensors), a JSON array of
    {name, dtype, shape} (per-row shapes), then one raw little-endian frame per tensor."""
    import numpy as np

    seq, rows, _flags, ntensors = unpack_batch_header(frames[0], PREDICTION)
    if len(frames) != 2 + ntensors:
        raise ProtocolError(f"PREDICTION: {len(frames)} frames, expected {2 + ntensors}")
    desc = unpack_json(frames[1])
    if not isinstance(desc, list) or len(desc) != ntensors:
        raise ProtocolError(f"PREDICTION: the description is not an array of {ntensors} tensors")
    arrays = {}
    for i, (entry, frame) in enumerate(zip(desc, frames[2:])):
        # Python integers: the byte count cannot wrap (np.prod would, at 2^63)
        if not isinstance(entry, dict):
            raise ProtocolError(f"PREDICTION: tensor {i}: expected an object, got {entry!r:.80}")
        name, dtype, dims = entry.get("name"), entry.get("dtype"), entry.get("shape")
        if not isinstance(name, str) or dtype not in DTYPES or not isinstance(dims, list) or \
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ProtocolError(f"PREDICTION: tensor {i}: expected name (string), dtype (one of "
                                f"{', '.join(DTYPES)}) and shape (non-negative integers), got "
                                f"{entry!r:.200}")
        dt = np.dtype(DTYPES[dtype]).newbyteorder("<")
        shape = (rows, *dims)
        want = dt.itemsize * math.prod(shape)
        data = bytes(frame)
        if len(data) != want:
            raise ProtocolError(f"PREDICTION: tensor '{name}' is {len(data)} bytes, "
                                f"expected {want} for {shape}")
        arrays[name] = np.frombuffer(data, dtype=dt).reshape(shape)
    return Message(PREDICTION, seq=seq, body={"rows": rows, "tensors": desc}, arrays=arrays)


def hello_frames(schema: Optional[list], name: Optional[str] = None,
                 first_seq: Optional[int] = None, **extra: Any) -> list[bytes]:
    """The frames of a HELLO message (``extra`` keys are passed as they are, for tests); no
    ``schema`` key when it is None (the producer takes the program's from WELCOME)."""
    obj: dict[str, Any] = {}
    if name is not None:
        obj["name"] = name
    if schema is not None:
        obj["schema"] = schema
    if first_seq is not None:
        obj["first_seq"] = first_seq
    obj.update(extra)
    return [pack_header(HELLO), pack_json(obj)]


def end_frames() -> list[bytes]:
    return [pack_header(END)]


def schema_entry(name: str, dtype: str, shape: Sequence[int]) -> dict:
    return {"name": name, "dtype": dtype, "shape": [int(d) for d in shape]}


def row_nbytes(entry: dict) -> int:
    """Bytes per row of one schema tensor."""
    import numpy as np

    n = np.dtype(DTYPES[entry["dtype"]]).itemsize
    for d in entry["shape"]:
        n *= int(d)
    return n
