"""The e2e tests' view of infeed checkpoint files (docs/checkpoint.md, format version 1): read
with the Python client's loader (infeed.checkpoint), written as the daemon would by `write`, so
that a test can start the daemon from a file another program made, and damaged at random."""

from __future__ import annotations

import json
import random
import struct
import zlib
from pathlib import Path

import numpy as np

from infeed.checkpoint import MAGIC, SLOTS, VERSION, files, load_file  # noqa: F401 - re-exported

# The problem each kind of damage is told as: the size check, the CRC, the magic, the version.
PROBLEMS = ("truncated", "trailing bytes", "checksum", "magic", "version", "header")


def read(path) -> dict:
    """The header's keys, with its parameter list as "param_specs", and "params" (float32
    [nparam_floats]) and "slots" (float32 [slots, nparam_floats]) as numpy arrays; raises
    infeed.CheckpointError (a ValueError) on any inconsistency."""
    c = load_file(path)
    header = dict(c.header)
    header["param_specs"] = header.pop("params")
    header["params"] = c.vector
    header["slots"] = c.slot_vectors
    return header


def header(program: str, settings: dict, shapes: list, step: int, producers: dict,
           optimizer: str = "sgd") -> dict:
    """A header of docs/checkpoint.md: shapes is [(name, shape)] in vector order; settings
    names features, classes and hidden."""
    specs, at = [], 0
    for name, shape in shapes:
        count = int(np.prod(shape, dtype=np.int64))
        specs.append({"name": name, "shape": list(shape), "offset": at, "count": count})
        at += count
    return {"format": "infeed-checkpoint", "program": program,
            "settings": {"features": 0, "classes": 0, "hidden": 0, **settings},
            "params": specs, "nparam_floats": at,
            "optimizer": {"kind": optimizer, "slots": len(SLOTS[optimizer]),
                          "learning_rate": 0.05, "momentum": 0.9, "beta1": 0.9, "beta2": 0.999,
                          "epsilon": 1e-8},
            "global_step": step, "opt_step": step, "producers": producers}


def write(path, header, params, slots=None) -> None:
    """Writes a checkpoint from a header (a dict of the keys of docs/checkpoint.md, with
    "params" the parameter list, or the JSON text itself as bytes) and the float vectors, as
    the daemon would (not atomically)."""
    params = np.ascontiguousarray(params, dtype="<f4")
    slots = np.zeros((0, params.size), "<f4") if slots is None else np.asarray(slots, "<f4")
    text = header if isinstance(header, bytes) else \
        json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    body = MAGIC + struct.pack("<II", VERSION, len(text)) + text + params.tobytes() + \
        slots.tobytes()
    Path(path).write_bytes(body + struct.pack("<I", zlib.crc32(body)))


def damage(path: Path, rng: random.Random) -> str:
    """Cuts the file at a random length or changes one random byte; returns what it did."""
    data = bytearray(path.read_bytes())
    if rng.random() < 0.5:
        cut = rng.randrange(len(data))
        path.write_bytes(bytes(data[:cut]))
        return f"cut {path.name} to {cut} of {len(data)} bytes"
    at = rng.randrange(len(data))
    data[at] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))
    return f"changed byte {at} of {len(data)} of {path.name}"
