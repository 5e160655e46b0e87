"""The BLAS kernel of a running infeedd (docs/design.md, "The BLAS kernel"): never a generic
fallback on a CPU with AVX2, logged at start, in `status` and `infeedctl status`; --blas-kernel
and OPENBLAS_CORETYPE choose another; a bad name is a usage error naming the key."""

import re
import subprocess
from pathlib import Path

import pytest

from conftest import infeedd_path
from helpers import ctl, ctl_endpoints

FALLBACKS_ON_AVX2 = {"katmai", "coppermine", "northwood", "prescott", "banias", "atom", "core2",
                     "penryn", "dunnington", "nehalem", "athlon", "opteron", "opteron_sse3",
                     "barcelona", "nano", "bobcat", "sandybridge", "bulldozer", "piledriver",
                     "steamroller"}
AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def has_avx2() -> bool:
    return {"avx2", "fma"} <= cpu_flags()


def start(daemon, **flags):
    return daemon(program="softmax", features=8, classes=3, batch_size=8, steps=100000,
                  iterations_per_loop=10, **flags)


def blas(d) -> dict:
    s = d.control({"cmd": "status"})
    assert "blas" in s, s
    return s["blas"]


def test_the_kernel_is_no_fallback(daemon, monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    d = start(daemon)
    b = blas(d)
    if not has_avx2():
        pytest.skip(f"this CPU has no AVX2 (kernel {b['kernel']})")
    assert b["kernel"].lower() not in FALLBACKS_ON_AVX2, b
    want = "AVX-512" if AVX512 <= cpu_flags() else "AVX2"
    assert b["cpu_isa"] == want and b["kernel_isa"] == want, b
    assert b["how"] in ("detected", "corrected"), b
    assert not is_fallback(b), b
    # logged at start, and in infeedctl status
    assert f"BLAS {b['text']}" in d.log(), d.log()
    r = ctl("status", *ctl_endpoints(d))
    assert r.returncode == 0, r.stderr
    assert f"BLAS          {b['text']}" in r.stdout, r.stdout
    assert b["library"].startswith("OpenBLAS"), b


LEVEL = {"SSE": 1, "AVX": 2, "AVX2": 3, "AVX-512": 4}


def is_fallback(b) -> bool:
    k, c = LEVEL.get(b["kernel_isa"]), LEVEL.get(b["cpu_isa"])
    return k is not None and c is not None and c >= LEVEL["AVX"] and k < c


def test_keep_leaves_the_library_pick(daemon, monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    b = blas(start(daemon, blas_kernel="keep"))
    assert b["kernel"] == b["picked"], b
    assert b["how"] == ("keep" if is_fallback(b) else "detected"), b


@pytest.mark.parametrize("how", ["flag", "config", "env"])
def test_a_kernel_by_name(daemon, monkeypatch, tmp_path, how, rng):
    if not has_avx2():
        pytest.skip("this CPU has no AVX2")
    name = rng.choice(["Haswell", "Sandybridge"] + (["SkylakeX"] if AVX512 <= cpu_flags() else []))
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    if how == "flag":
        d = start(daemon, blas_kernel=name.lower())
    elif how == "config":
        cfg = tmp_path / "c.json"
        cfg.write_text('{"blas_kernel": "%s"}' % name.upper())
        d = start(daemon, config=str(cfg))
    else:
        monkeypatch.setenv("OPENBLAS_CORETYPE", name)
        d = start(daemon)
    b = blas(d)
    assert b["kernel"] == name, b
    assert b["how"] == ("OPENBLAS_CORETYPE" if how == "env" else "blas_kernel"), b
    assert b["kernel"] in d.log(), d.log()


@pytest.mark.parametrize("value,words", [
    ("Bogus", "expected auto, keep or an OpenBLAS kernel name"),
    ("skylake", "got 'skylake'"),
    ("", "expected auto, keep or an OpenBLAS kernel name"),
])
def test_a_bad_name_is_a_usage_error(value, words):
    exe = infeedd_path()
    if exe is None:
        pytest.skip("infeedd is not built")
    r = subprocess.run([exe, "--blas-kernel", value, "--features", "8", "--classes", "3",
                        "--steps", "10", "--listen", "ipc:///nonexistent/x", "--publish", "",
                        "--control", ""], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--blas-kernel: " in r.stderr and words in r.stderr, r.stderr
