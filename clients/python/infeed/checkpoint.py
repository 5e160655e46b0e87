"""Loads the checkpoints infeedd writes (``docs/checkpoint.md``, format version 1) into numpy.

    ck = infeed.checkpoint.load("ck")          # a folder: its newest checkpoint that loads
    ck = infeed.checkpoint.load("ck/ckpt-000000001200.ifdckpt")
    ck.params["W1"]                            # float32, shaped as the program declares it
    ck.slots["m"]["W1"], ck.global_step, ck.producers, ck.program, ck.settings

The checks are the daemon's (``checkpoint/format.c``, ``checkpoint/header.c``), in its order:
the size, the magic, the version, the header length, the JSON header (duplicate keys, NaN and
integers beyond 64 bits refused, as jansson does), the size the header implies, the CRC-32, then
every key. A file that fails one raises :class:`infeed.CheckpointError` naming the file, the
field, what was expected and what was found. ``infeed.export`` writes the parameters as
``.npz`` and safetensors.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import struct
import warnings
import zlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np

from .errors import CheckpointError

MAGIC = b"IFDCKPT\0"
VERSION = 1
SUFFIX = ".ifdckpt"
DAMAGED = ".damaged"  # what a training daemon appends to a damaged checkpoint it skipped
PREAMBLE = 16  # magic, version, header length
CRC_LEN = 4
HEADER_MAX = 16 << 20
MAX_FLOATS = 1 << 40
MAX_PARAMS = 1 << 20  # IFD_CHECKPOINT_MAX_PARAMS
PARAM_MAX_RANK = 4  # IFD_PARAM_MAX_RANK
NAME_MAX = 32  # IFD_NAME_MAX: a parameter's name is at most 31 bytes
PROGRAM_MAX = 64  # a program's name is at most 63 bytes
PRODUCER_NAME_MAX = 63  # IFD_CHECKPOINT_NAME_MAX
MAX_HOSTS = 65536  # IFD_CHECKPOINT_MAX_HOSTS
INT64_MAX = (1 << 63) - 1
# the optimizer kinds and the slot vectors each keeps, in the file's order
SLOTS = {"sgd": (), "momentum": ("m",), "adam": ("m", "v"), "adamw": ("m", "v")}

_NAME = re.compile(r"ckpt-([0-9]{12,18})" + re.escape(SUFFIX))

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class Checkpoint:
    """One loaded checkpoint. ``params`` and each ``slots[name]`` map a parameter's name to a
    float32 array of its shape (views of ``vector`` and ``slot_vectors``, in the file's order);
    ``slots`` is keyed by the optimizer's slot names (momentum: ``m``; Adam: ``m`` then ``v``;
    SGD: none). ``producers`` maps a producer name to the highest sequence number a step in the
    checkpoint consumed (its stream resumes at that + 1); with ``hosts`` above 1 it is empty and
    ``host_producers[h]`` holds host h's. ``settings`` holds ``features``, ``classes`` and
    ``hidden`` (0: unset), and ``program_config`` (a dict) when the run gave the program settings
    of its own. ``header`` is the whole JSON header; ``skipped``, when loaded from a
    folder, the errors of the newer checkpoints that did not load."""

    path: str
    program: str
    settings: dict
    params: dict
    slots: dict
    optimizer: dict
    global_step: int
    opt_step: int
    producers: dict
    hosts: int
    host_producers: list
    param_specs: list
    vector: np.ndarray = field(repr=False)
    slot_vectors: np.ndarray = field(repr=False)
    header: dict = field(repr=False)
    skipped: tuple = ()

    def __repr__(self) -> str:
        shapes = ", ".join(f"{s['name']}: {s['shape']}" for s in self.param_specs)
        return (f"Checkpoint({self.path!r}, program={self.program!r}, "
                f"global_step={self.global_step}, params={{{shapes}}}, "
                f"optimizer={self.optimizer['kind']!r})")


def _error(path, field_: str, expected: str, found: str, note: str = "",
           code: str = "EPROTO") -> CheckpointError:
    tail = f" ({note})" if note else ""
    return CheckpointError(code, f"checkpoint '{path}': {field_}: expected {expected}, got "
                                 f"{found}{tail}", path, field_, expected, found)


# ---- the JSON header, checked as jansson parses it --------------------------------------------

def _pairs(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate object key '{k}'")
        d[k] = v
    return d


def _no_constant(name):
    raise ValueError(f"'{name}' is not JSON")


def _jansson_values(v) -> None:
    """What jansson refuses and Python's json takes: a NUL in a string, a lone surrogate,
    integers beyond 64 bits, reals that overflow."""
    stack = [v]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            if "\0" in v:
                raise ValueError("\\u0000 is not allowed in a string")
            v.encode("utf-8")  # UnicodeEncodeError (a ValueError) on a lone surrogate
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, int):
            if not -(1 << 63) <= v <= INT64_MAX:
                raise ValueError("too big integer")
        elif isinstance(v, float) and not math.isfinite(v):
            raise ValueError("real number overflow")


def _parse_header(raw: bytes):
    """The header object, or (None, the parse error's text)."""
    try:
        h = json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs,
                       parse_constant=_no_constant)
        _jansson_values(h)
    except json.JSONDecodeError as e:
        return None, f"line {e.lineno}: {e.msg}"
    except (ValueError, RecursionError) as e:
        return None, f"{e}"
    if not isinstance(h, dict):
        return None, f"a JSON {type(h).__name__}, not an object"
    return h, ""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_MISSING = object()


def _what(v) -> str:
    if v is _MISSING:
        return "nothing"
    if v is None:
        return "null"
    if _is_int(v):
        return f"{v}"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, float):
        return f"the real {v!r}"
    if isinstance(v, str):
        return f"the string {json.dumps(v)[:80]}"
    return f"a JSON {'array' if isinstance(v, list) else 'object'}"


def _int(obj, key: str, lo: int, hi: int, path, where: str = "") -> int:
    v = obj.get(key, _MISSING) if isinstance(obj, dict) else _MISSING
    if not _is_int(v) or not lo <= v <= hi:
        raise _error(path, f"header: '{where}{key}'", f"an integer from {lo} to {hi}", _what(v))
    return v


def _number(obj: dict, key: str, path) -> float:
    v = obj.get(key, _MISSING)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise _error(path, f"header: 'optimizer.{key}'", "a number", _what(v))
    return float(v)


def _program(h: dict, path) -> tuple:
    prog = h.get("program", _MISSING)
    if not isinstance(prog, str) or not 0 < len(prog.encode()) < PROGRAM_MAX:
        raise _error(path, "header: 'program'",
                     f"a program name of 1 to {PROGRAM_MAX - 1} bytes", _what(prog))
    s = h.get("settings")
    settings = {k: _int(s, k, 0, MAX_FLOATS, path, "settings.")
                for k in ("features", "classes", "hidden")}
    pc = s.get("program_config", _MISSING)
    if pc is not _MISSING:  # the program's own settings (program ABI 4), when it was given some
        if not isinstance(pc, dict):
            raise _error(path, "header: 'settings.program_config'", "an object", _what(pc))
        settings["program_config"] = pc
    return prog, settings


def _optimizer(o, path) -> dict:
    o = o if isinstance(o, dict) else {}
    kind = o.get("kind", _MISSING)
    if not isinstance(kind, str) or kind not in SLOTS:
        raise _error(path, "header: 'optimizer.kind'", "sgd, momentum, adam or adamw",
                     _what(kind))
    slots = o.get("slots", _MISSING)
    if not _is_int(slots) or slots != len(SLOTS[kind]):
        raise _error(path, "header: 'optimizer.slots'",
                     f"{len(SLOTS[kind])} (the slot vectors {kind} keeps)", _what(slots))
    out = {"kind": kind, "slots": slots}
    for k in ("learning_rate", "momentum", "beta1", "beta2", "epsilon"):
        out[k] = _number(o, k, path)
    # the schedule, decay and clipping: absent from checkpoints older than them (off)
    for k in ("weight_decay", "clip_norm", "min_learning_rate"):
        out[k] = _number(o, k, path) if k in o else 0.0
    for k in ("warmup_steps", "decay_steps"):
        out[k] = _int(o, k, 0, 2**63 - 1, path, "optimizer.") if k in o else 0
    sched = o.get("lr_schedule", "constant")
    if sched not in ("constant", "cosine", "linear"):
        raise _error(path, "header: 'optimizer.lr_schedule'", "constant, cosine or linear",
                     _what(sched))
    out["lr_schedule"] = sched
    return out


def _params(params, n: int, path) -> list:
    """The parameter list: names, shapes, offsets and counts that tile [0, n)."""
    if not isinstance(params, list) or len(params) > MAX_PARAMS:
        raise _error(path, "header: 'params'", f"an array of at most {MAX_PARAMS} parameters",
                     _what(params) if not isinstance(params, list) else
                     f"{len(params)} parameters")
    at, specs = 0, []
    for i, e in enumerate(params):
        e = e if isinstance(e, dict) else {}
        name, shape = e.get("name", _MISSING), e.get("shape", _MISSING)
        if not isinstance(name, str) or len(name.encode()) >= NAME_MAX:
            raise _error(path, f"header: 'params[{i}].name'",
                         f"a name of at most {NAME_MAX - 1} bytes", _what(name))
        if not isinstance(shape, list) or len(shape) > PARAM_MAX_RANK:
            raise _error(path, f"header: 'params[{i}].shape'",
                         f"a shape of rank 0 to {PARAM_MAX_RANK}",
                         _what(shape) if not isinstance(shape, list) else f"rank {len(shape)}")
        count = 1
        for d, dim in enumerate(shape):
            if not _is_int(dim) or dim < 1:
                raise _error(path, f"header: 'params[{i}].shape'", "positive integers",
                             f"{_what(dim)} as dimension {d}")
            if dim > MAX_FLOATS // count:
                raise _error(path, f"header: 'params[{i}].shape'",
                             "at most 2^40 floats in all",
                             f"dimension {d} of {dim} after {count} floats")
            count *= dim
        _int(e, "offset", at, at, path, f"params[{i}].")
        _int(e, "count", count, count, path, f"params[{i}].")
        if any(s["name"] == name for s in specs):  # the one check the daemon does not make
            raise _error(path, f"header: 'params[{i}].name'", "a name no other parameter has",
                         f"{json.dumps(name)} again")
        specs.append({"name": name, "shape": list(shape), "offset": at, "count": count})
        at += count
    if at != n:
        raise _error(path, "header: 'params'", f"parameters covering 'nparam_floats', {n} floats",
                     f"{at} floats")
    return specs


def _producers(m, where: str, path) -> dict:
    if not isinstance(m, dict):
        raise _error(path, f"header: '{where}'", "an object", _what(m))
    for name, seq in m.items():
        if not 0 < len(name.encode()) <= PRODUCER_NAME_MAX:
            raise _error(path, f"header: '{where}'",
                         f"producer names of 1 to {PRODUCER_NAME_MAX} bytes",
                         f"{json.dumps(name)[:80]} ({len(name.encode())} bytes)")
        if not _is_int(seq) or not 0 <= seq <= INT64_MAX:
            raise _error(path, f"header: '{where}.{name}'", "an integer >= 0", _what(seq))
    return dict(m)


def _positions(h: dict, path) -> tuple:
    """(hosts, producers, host_producers)."""
    producers = _producers(h.get("producers", _MISSING), "producers", path)
    hosts = _int(h, "hosts", 1, MAX_HOSTS, path) if "hosts" in h else 1
    if hosts == 1:
        return 1, producers, [producers]
    by_host = h.get("host_producers", _MISSING)
    if not isinstance(by_host, list) or len(by_host) != hosts:
        raise _error(path, "header: 'host_producers'",
                     f"an array of {hosts} objects (one a host, 'hosts')",
                     _what(by_host) if not isinstance(by_host, list) else
                     f"{len(by_host)} objects")
    return hosts, producers, [_producers(m, f"host_producers[{i}]", path)
                              for i, m in enumerate(by_host)]


# ---- a file -----------------------------------------------------------------------------------

def loads(data: bytes, path: PathLike = "<bytes>") -> Checkpoint:
    """A checkpoint from a file's bytes (``path`` only names it in errors): every check of
    :func:`load`."""
    size = len(data)
    buf = memoryview(data)
    if size < PREAMBLE + CRC_LEN:
        raise _error(path, "size", f"at least {PREAMBLE + CRC_LEN} bytes", f"{size} bytes",
                     "truncated")
    if bytes(buf[:8]) != MAGIC:
        got = "".join(f"\\x{b:02x}" for b in bytes(buf[:8]))
        raise _error(path, "magic", '"IFDCKPT\\0" (an infeed checkpoint)', f'"{got}"')
    version, hlen = struct.unpack_from("<II", data, 8)
    if version != VERSION:
        raise _error(path, "version", f"{VERSION}", f"{version}")
    if hlen > HEADER_MAX:  # (the daemon calls it truncated too)
        raise _error(path, "header length", f"at most {HEADER_MAX} bytes of JSON", f"{hlen}",
                     "not a checkpoint's header, or a damaged length")
    if PREAMBLE + hlen + CRC_LEN > size:
        raise _error(path, "size", f"at least {PREAMBLE + hlen + CRC_LEN} bytes (the header "
                     f"alone says {hlen} bytes of JSON)", f"{size} bytes", "truncated")
    (stored,) = struct.unpack_from("<I", data, size - CRC_LEN)
    crc = zlib.crc32(buf[:size - CRC_LEN])

    def checksum() -> CheckpointError:
        return _error(path, "checksum", f"{stored:08x} (the CRC-32 stored in the file)",
                      f"{crc:08x}", "computed: the file is corrupt")

    h, why = _parse_header(bytes(buf[PREAMBLE:PREAMBLE + hlen]))
    if h is None:
        raise checksum() if crc != stored else _error(path, "header", "a JSON object", why)
    o = h.get("optimizer")
    kind = o.get("kind") if isinstance(o, dict) else None
    nslots = len(SLOTS[kind]) if isinstance(kind, str) and kind in SLOTS else 0
    n = _int(h, "nparam_floats", 0, MAX_FLOATS, path)
    want = PREAMBLE + hlen + 4 * n * (1 + nslots) + CRC_LEN
    if size != want:
        raise _error(path, "size", f"{want} bytes (a {hlen}-byte header, {n} parameter floats "
                     f"and {nslots} slot vectors)", f"{size} bytes",
                     "truncated" if size < want else "trailing bytes")
    if crc != stored:
        raise checksum()
    program, settings = _program(h, path)
    optimizer = _optimizer(h.get("optimizer"), path)
    global_step = _int(h, "global_step", 0, INT64_MAX, path)
    opt_step = _int(h, "opt_step", 0, INT64_MAX, path)
    specs = _params(h.get("params", _MISSING), n, path)
    hosts, producers, host_producers = _positions(h, path)
    floats = np.frombuffer(data, dtype="<f4", count=n * (1 + nslots),
                           offset=PREAMBLE + hlen).astype(np.float32)
    vector, slot_vectors = floats[:n], floats[n:].reshape(nslots, n)

    def by_name(v: np.ndarray) -> dict:
        return {s["name"]: v[s["offset"]:s["offset"] + s["count"]].reshape(s["shape"])
                for s in specs}

    return Checkpoint(
        path=str(path), program=program, settings=settings, params=by_name(vector),
        slots={name: by_name(slot_vectors[i]) for i, name in enumerate(SLOTS[optimizer["kind"]])},
        optimizer=optimizer, global_step=global_step, opt_step=opt_step, producers=producers,
        hosts=hosts, host_producers=host_producers, param_specs=specs, vector=vector,
        slot_vectors=slot_vectors, header=h)


def _read(path: Path) -> bytes:
    try:
        # O_NONBLOCK: a FIFO under the name is refused, not waited on (no effect on files)
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)),
                  "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise _error(path, "file", "a regular file", "another kind of file", code="EIO")
            return f.read()
    except FileNotFoundError as e:
        raise _error(path, "file", "a checkpoint file", f"none ({e.strerror})",
                     code="ENOTFOUND") from None
    except OSError as e:
        raise _error(path, "file", "a readable file", f"{e.strerror}", code="EIO") from None


def step_of(name: str) -> Optional[int]:
    """The global step of a checkpoint's file name as the daemon names them
    (``ckpt-%012d.ifdckpt``: 12 digits at least, no other leading zero), or None for any other
    name (temporary files, ``.damaged`` ones; the daemon's loader opens the name it makes from
    the step, so it never opens ``ckpt-5.ifdckpt`` either)."""
    m = _NAME.fullmatch(name)
    if m is None or name != f"ckpt-{int(m.group(1)):012d}{SUFFIX}":
        return None
    return int(m.group(1))


def files(folder: PathLike) -> list:
    """The checkpoints of a folder (their paths), by step, oldest first; the step is read from
    the name, as the daemon does. Raises CheckpointError (``ENOTFOUND``) when the folder does not
    exist."""
    try:
        names = os.listdir(folder)
    except OSError as e:
        raise CheckpointError("ENOTFOUND" if isinstance(e, FileNotFoundError) else "EIO",
                              f"checkpoint folder '{folder}': {e.strerror}", str(folder),
                              "folder", "a readable folder", f"{e.strerror}") from None
    steps = sorted((s, n) for n in names if (s := step_of(n)) is not None)
    return [Path(folder) / n for _, n in steps]


def _load_latest(folder: Path) -> Checkpoint:
    """As the daemon's --resume and eval/predict with --checkpoint-dir: the newest checkpoint
    that loads; each newer one that does not is skipped with a warning (nothing is renamed)."""
    paths = files(folder)
    if not paths:
        raise CheckpointError("ENOTFOUND", f"checkpoint folder '{folder}': no checkpoint "
                              f"(ckpt-<step>{SUFFIX}) in it", str(folder), "folder",
                              f"ckpt-<step>{SUFFIX} files", "none")
    bad = []
    for p in reversed(paths):
        try:
            c = load_file(p)
        except CheckpointError as e:
            if e.code != "ENOTFOUND":  # ENOTFOUND: pruned since the listing, a newer one exists
                bad.append(e)
            continue
        for e in bad:
            warnings.warn(f"infeed.checkpoint: skipped a damaged checkpoint: {e}", RuntimeWarning,
                          stacklevel=3)
        return dataclasses.replace(c, skipped=tuple(bad))
    if not bad:
        raise CheckpointError("ENOTFOUND", f"checkpoint folder '{folder}': its checkpoints "
                              f"vanished while read", str(folder), "folder", "checkpoints", "none")
    e = bad[0]
    what = ("its only checkpoint does not load" if len(paths) == 1 else
            f"none of its {len(paths)} checkpoints loads; the newest")
    raise CheckpointError(e.code, f"checkpoint folder '{folder}': {what}: {e}", str(folder),
                          e.field, e.expected, e.found)


def load_file(path: PathLike) -> Checkpoint:
    """The checkpoint in the file path, whatever its name."""
    return loads(_read(Path(path)), path)


def load(path: PathLike) -> Checkpoint:
    """A checkpoint: ``path`` is a file (any name), or a checkpoint folder (``--checkpoint-dir``),
    whose newest checkpoint that loads is taken as ``infeedd --resume`` takes it: files named
    ``ckpt-<step>.ifdckpt`` by step, a newer damaged one skipped with a ``RuntimeWarning`` (and
    listed in ``skipped``). Raises :class:`infeed.CheckpointError`: ``ENOTFOUND`` (no such file, a
    folder without checkpoints), ``EIO`` (unreadable), ``EPROTO`` (the file fails a check; from
    a folder: none of its checkpoints loads, the sentence names the newest's problem)."""
    p = Path(path)
    return _load_latest(p) if p.is_dir() else load_file(p)
