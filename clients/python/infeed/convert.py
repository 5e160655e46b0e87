"""From what loaders give to the arrays the daemon takes: schemas, dtype conversion, batch items.

The rules (the client's README says them too):

- A numpy array of the schema's dtype is used as it is (a non-contiguous or big-endian one is
  made contiguous and little-endian, a copy).
- A dtype that holds every value of the array's dtype is converted (``uint8`` into ``float32``
  or ``int32``, ``int32`` into ``int64``, ``float16`` into ``float32``, ``bool`` into any).
- Integers into a narrower integer dtype (``int64`` labels into ``int32``, the usual case of a
  PyTorch loader) are converted when every value fits; a value that does not is a
  :class:`TypeError` naming the tensor and the values. Integers into ``float32`` likewise when
  every value is exact in ``float32`` (magnitude at most 2**24), floats into an integer dtype
  when every value is a whole number that fits.
- Rounding floats (``float64`` into ``float32``, integers beyond 2**24 into ``float32``) only with
  ``round_floats=True`` (``Producer`` and ``infeed.feed``); without it the :class:`TypeError`
  says so. Values are never changed otherwise.
- Python lists and scalars convert by their values as above, except that Python floats into
  ``float32`` round to the nearest ``float32``, as a ``float32`` literal would.
- PyTorch tensors (``.numpy()`` of a CPU tensor: no copy; detached first, moved to the CPU
  when on a GPU) and TensorFlow tensors (``.numpy()``) are taken as numpy arrays; anything with
  ``__array__`` too. Neither library is imported here.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from . import protocol as P

_FLOAT32_EXACT = 1 << 24  # every integer of magnitude up to this is exact in float32
# the little-endian dtype of each protocol name (made once: send's cost is per message)
_DTYPE = {name: np.dtype(spec).newbyteorder("<") for name, spec in P.DTYPES.items()}


def dtype_name(dt: np.dtype) -> Optional[str]:
    """The protocol name of a numpy dtype (byte order aside), or None."""
    for name, spec in P.DTYPES.items():
        want = np.dtype(spec)
        if dt.kind == want.kind and dt.itemsize == want.itemsize:
            return name
    return None


def normalize_schema(schema: Iterable[Any]) -> list[dict]:
    """Accepts dicts ``{"name", "dtype", "shape"}`` or tuples ``(name, dtype, shape)``; a dtype may
    be a protocol name or anything ``np.dtype`` takes."""
    out = []
    for entry in schema:
        if isinstance(entry, Mapping):
            name, dtype, shape = entry["name"], entry["dtype"], entry.get("shape", [])
        else:
            name, dtype, shape = entry
        if dtype not in P.DTYPES:
            dn = dtype_name(np.dtype(dtype))
            if dn is None:
                raise TypeError(f"schema: tensor '{name}': dtype {np.dtype(dtype)} is not one of "
                                f"{', '.join(P.DTYPES)}")
            dtype = dn
        out.append(P.schema_entry(str(name), dtype, tuple(shape)))
    if not out:
        raise ValueError("schema: at least one tensor is needed")
    return out


def as_array(value: Any) -> tuple[np.ndarray, bool]:
    """``(array, from_python)``: the numpy array of a tensor without a copy where its memory
    allows (a numpy array, a CPU PyTorch tensor, an object with ``__array__``), and whether it
    came from Python values (lists, scalars), whose floats may round into float32."""
    if isinstance(value, np.ndarray):
        return value, False
    mod = type(value).__module__ or ""
    if mod.startswith("torch") and hasattr(value, "detach"):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        try:
            return t.numpy(), False  # shares the tensor's memory
        except TypeError:  # bfloat16 and other dtypes numpy lacks: float32 holds them exactly
            return t.float().numpy(), False
    if hasattr(value, "numpy") and mod.startswith("tensorflow"):
        return np.asarray(value.numpy()), False
    if hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
        return np.asarray(value), False
    return np.asarray(value), True


def rows_of(value: Any) -> Optional[int]:
    """The rows of one tensor (its length) without converting it, or None."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else None
        except (TypeError, IndexError):
            return None
    try:
        return len(value)
    except TypeError:
        return None


def _range(a: np.ndarray) -> tuple[Any, Any]:
    return (a.min(), a.max()) if a.size else (0, 0)


def convert(name: str, value: Any, entry: dict, round_floats: bool = False) -> np.ndarray:
    """The C-contiguous little-endian array of the schema entry's dtype for one tensor, by the
    rules of this module's docstring; TypeError naming the tensor, the dtype expected and the
    one received (and ``round_floats`` where it would allow the conversion) otherwise."""
    want = _DTYPE[entry["dtype"]]
    if type(value) is np.ndarray and value.dtype == want and value.flags.c_contiguous:
        return value  # the common case, first
    a, from_python = as_array(value)
    got = a.dtype
    if got.kind == want.kind and got.itemsize == want.itemsize:
        if got == want and a.flags.c_contiguous:
            return a
        return np.ascontiguousarray(a, dtype=want)
    what = f"tensor '{name}': expected dtype {entry['dtype']}, got {got}"
    if got.kind not in "biuf":
        raise TypeError(f"{what}, which does not convert to a number")
    if np.can_cast(got, want, "safe"):
        return np.ascontiguousarray(a.astype(want))
    if want.kind in "iu":
        if got.kind == "f":
            if not np.all(np.isfinite(a)) or not np.array_equal(a, np.trunc(a)):
                raise TypeError(f"{what} holding values that are not whole numbers; an integer "
                                f"tensor takes whole numbers only (labels are never rounded)")
        lo, hi = _range(a)
        info = np.iinfo(want)
        if lo < info.min or hi > info.max:
            raise TypeError(f"{what} holding values from {lo} to {hi}, which do not fit "
                            f"{entry['dtype']} ({info.min} to {info.max})")
        return np.ascontiguousarray(a.astype(want))
    # into float32: from a wider float, or from integers that may not be exact
    if got.kind in "iub":
        lo, hi = _range(a)
        if -_FLOAT32_EXACT <= lo and hi <= _FLOAT32_EXACT or round_floats:
            return np.ascontiguousarray(a.astype(want))
        raise TypeError(f"{what} holding values from {lo} to {hi}, beyond 2**24, which float32 "
                        f"rounds: pass round_floats=True (Producer or infeed.feed) to round them, "
                        f"or convert them yourself (.astype(np.float32))")
    if round_floats or from_python:
        return np.ascontiguousarray(a.astype(want))
    raise TypeError(f"{what}: converting rounds the values to float32, which happens only with "
                    f"round_floats=True (Producer or infeed.feed); or convert them yourself "
                    f"(.astype(np.float32))")


def item_tensors(item: Any, names: Sequence[str]) -> dict[str, Any]:
    """One batch as the mapping ``name -> tensor``: a mapping as it is (keyword order never
    matters), a tuple or list as the tensors in schema order, and, for a schema of one tensor,
    that tensor alone."""
    if type(item) is dict:
        return item
    if isinstance(item, Mapping):
        return dict(item)
    if isinstance(item, (tuple, list)):
        if len(item) != len(names):
            raise ValueError(f"batch: a {type(item).__name__} of {len(item)} tensors, the schema "
                             f"has {len(names)} ({', '.join(names)}): a tuple or list gives the "
                             f"tensors in schema order (or give a dict by name)")
        return dict(zip(names, item))
    if len(names) == 1:
        return {names[0]: item}
    raise TypeError(f"batch: expected a dict of tensors by name or a tuple in schema order "
                    f"({', '.join(names)}), got {type(item).__name__}")


def item_rows(item: Any) -> Optional[int]:
    """The rows of a batch item (its first tensor's length) without converting it, or None."""
    if isinstance(item, Mapping):
        first = next(iter(item.values()), None)
    elif isinstance(item, (tuple, list)):
        first = item[0] if item else None
    else:
        first = item
    return None if first is None else rows_of(first)


def encode(batch: Any, schema: Sequence[dict], round_floats: bool = False
           ) -> tuple[list[np.ndarray], int]:
    """One batch as the arrays of ``schema`` (in its order) and its rows: matched by name (or
    position, :func:`item_tensors`), converted (:func:`convert`) and checked against the per-row
    shapes; ValueError naming the tensor otherwise."""
    names = [e["name"] for e in schema]
    arrays = item_tensors(batch, names)
    if len(arrays) != len(names) or any(n not in arrays for n in names):
        missing = [n for n in names if n not in arrays]
        extra = [n for n in arrays if n not in names]
        parts = []
        if missing:
            parts.append("missing " + ", ".join(repr(n) for n in missing))
        if extra:
            parts.append("unknown " + ", ".join(repr(n) for n in extra))
        raise ValueError(f"send: tensors {'; '.join(parts)} (the schema has "
                         f"{', '.join(repr(n) for n in names)})")
    out = []
    rows = None
    for entry in schema:
        name = entry["name"]
        a = convert(name, arrays[name], entry, round_floats)
        shape = tuple(entry["shape"])
        if a.ndim != 1 + len(shape) or a.shape[1:] != shape:
            want = "(rows" + "".join(f", {d}" for d in shape) + ")"
            raise ValueError(f"tensor '{name}': expected shape {want} (per-row shape "
                             f"{list(shape)}), got {a.shape}")
        if rows is None:
            rows = a.shape[0]
        elif a.shape[0] != rows:
            raise ValueError(f"tensor '{name}': {a.shape[0]} rows, but '{schema[0]['name']}' "
                             f"has {rows}")
        out.append(a)
    assert rows is not None
    return out, rows
