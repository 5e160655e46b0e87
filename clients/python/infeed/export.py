"""Writes a checkpoint's parameters by name as ``.npz`` (numpy) and as safetensors.

    python -m infeed.export ck --npz model.npz --safetensors model.safetensors

``CKPT`` is a checkpoint file or a checkpoint folder (its newest checkpoint that loads, as
``infeed.checkpoint.load`` takes it). Each array is named as the program names the parameter
(mlp: ``W1`` [features, hidden], ``b1``, ``W2`` [hidden, classes], ``b2``), float32, of the
parameter's shape. The safetensors file's metadata holds the program, its settings (JSON), the
global step and the checkpoint's path. Safetensors needs the ``safetensors`` package
(``pip install safetensors``, or the client's ``[safetensors]`` extra); the rest of the client
never imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import secrets
import zipfile
from pathlib import Path
from typing import Optional, Union

import numpy as np

from .checkpoint import Checkpoint, PathLike, load
from .errors import CheckpointError


def _safetensors_save():
    try:
        from safetensors.numpy import save
    except ImportError as e:
        raise ImportError(f"infeed.export: safetensors output needs the safetensors package, "
                          f"which is not installed ({e}): pip install safetensors") from e
    return save


def _atomic(out: PathLike, write) -> None:
    """write(temporary path) beside out, then renamed over it: a failed export leaves no part of
    a file under out's name."""
    out = Path(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask's mode
    try:
        write(tmp)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def _write_npz(path: str, params: dict) -> None:
    # as numpy.savez, without its keyword arguments: a parameter may be named "file"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, a in params.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, a, allow_pickle=False)


def metadata(c: Checkpoint) -> dict:
    """The safetensors metadata of a checkpoint's export (strings only, as the format wants)."""
    return {"format": "infeed-checkpoint", "program": c.program,
            "settings": json.dumps(c.settings, sort_keys=True),
            "global_step": str(c.global_step), "checkpoint": os.path.basename(c.path)}


def export(checkpoint: Union[Checkpoint, PathLike], npz: Optional[PathLike] = None,
           safetensors: Optional[PathLike] = None) -> Checkpoint:
    """Writes the parameters of checkpoint (a loaded :class:`Checkpoint`, or a file or folder
    that :func:`infeed.checkpoint.load` loads) to npz and/or safetensors, each atomically;
    returns the checkpoint. Raises ValueError when neither output is given, ImportError (before
    writing anything) when safetensors is asked for and the package is missing,
    :class:`infeed.CheckpointError` for a checkpoint that does not load."""
    if npz is None and safetensors is None:
        raise ValueError("infeed.export: expected an output (npz= or safetensors=), got none")
    save = _safetensors_save() if safetensors is not None else None
    c = checkpoint if isinstance(checkpoint, Checkpoint) else load(checkpoint)
    params = {name: np.array(a, dtype=np.float32, order="C") for name, a in c.params.items()}
    if npz is not None:
        _atomic(npz, lambda tmp: _write_npz(tmp, params))
    if save is not None:
        data = save(params, metadata=metadata(c))
        _atomic(safetensors, lambda tmp: Path(tmp).write_bytes(data))
    return c


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m infeed.export",
        description="Writes the parameters of an infeedd checkpoint by name, as .npz (numpy) "
                    "and/or safetensors (docs/checkpoint.md, 'Loading and exporting').")
    ap.add_argument("checkpoint", metavar="CKPT",
                    help="a checkpoint file, or a checkpoint folder (its newest checkpoint that "
                         "loads, as infeedd --resume takes it)")
    ap.add_argument("--npz", metavar="OUT.npz", help="write the parameters as a numpy .npz")
    ap.add_argument("--safetensors", metavar="OUT.safetensors",
                    help="write the parameters as safetensors (needs the safetensors package)")
    a = ap.parse_args(argv)
    if a.npz is None and a.safetensors is None:
        ap.error("expected --npz OUT.npz, --safetensors OUT.safetensors or both, got neither")
    try:
        c = export(a.checkpoint, npz=a.npz, safetensors=a.safetensors)
    except (CheckpointError, ImportError, OSError) as e:
        print(f"infeed.export: {e}" if not str(e).startswith("infeed.export") else e,
              file=sys.stderr)
        return 1
    outs = " and ".join(p for p in (a.npz, a.safetensors) if p is not None)
    print(f"infeed.export: {len(c.params)} parameters of '{c.program}' at global step "
          f"{c.global_step} ({c.path}) written to {outs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
