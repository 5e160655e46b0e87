"""A reader of infeed checkpoint files (docs/checkpoint.md, format version 1), independent of the
C code: the tests compare checkpoints with it."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np

MAGIC = b"IFDCKPT\0"


def read(path) -> dict:
    """The header's keys, with its parameter list as "param_specs", and "params" (float32
    [nparam_floats]) and "slots" (float32 [slots, nparam_floats]) as numpy arrays; raises
    ValueError on any inconsistency."""
    data = Path(path).read_bytes()
    if len(data) < 20 or data[:8] != MAGIC:
        raise ValueError(f"{path}: not an infeed checkpoint")
    version, hlen = struct.unpack_from("<II", data, 8)
    if version != 1:
        raise ValueError(f"{path}: version {version}")
    header = json.loads(data[16:16 + hlen].decode("utf-8"))
    n = header["nparam_floats"]
    slots = header["optimizer"]["slots"]
    want = 16 + hlen + 4 * n * (1 + slots) + 4
    if len(data) != want:
        raise ValueError(f"{path}: {len(data)} bytes, expected {want}")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise ValueError(f"{path}: CRC mismatch")
    floats = np.frombuffer(data, dtype="<f4", count=n * (1 + slots), offset=16 + hlen)
    header["param_specs"] = header.pop("params")
    header["params"] = floats[:n].copy()
    header["slots"] = floats[n:].reshape(slots, n).copy()
    return header


def files(folder) -> list[Path]:
    """The checkpoints of a folder, by step."""
    return sorted(Path(folder).glob("ckpt-*.ifdckpt"), key=lambda p: int(p.stem[5:]))


def write(path, header: dict, params, slots=None) -> None:
    """Writes a checkpoint from a header dict (the keys of docs/checkpoint.md, with "params" the
    parameter list) and the float vectors, as the daemon would (not atomically)."""
    params = np.ascontiguousarray(params, dtype="<f4")
    slots = np.zeros((0, params.size), "<f4") if slots is None else np.asarray(slots, "<f4")
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    body = MAGIC + struct.pack("<II", 1, len(text)) + text + params.tobytes() + slots.tobytes()
    Path(path).write_bytes(body + struct.pack("<I", zlib.crc32(body)))
