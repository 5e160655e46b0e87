"""The installed package, used as a project outside the tree would (README.md, "Install" and
"Using infeed from your project").

Installs the build ($IFD_BUILD_DIR) to a temporary prefix and moves the prefix (everything must be
relative to it: the RPATHs, the CMake package, the .pc files). Starts the installed infeedd with
the installed example config (a few flags override its paths and endpoints) and JOURNAL_STREAM
naming its stderr. Builds tests/package/consumer four times, out of tree: find_package(infeed)
with the shared and with the static targets, pkg-config with infeed-client + infeed and with
infeed-client-static + infeed-static; runs each against the daemon (WELCOME, every batch
ACKed). The daemon's log lines carry journald priority prefixes.
Builds examples/custom_program (the mlp2 program plugin) out of tree with find_package(infeed),
as its README says, and trains it with the installed infeedd --program-lib.

$IFD_SANITIZE (the build's sanitizer) is passed to the consumers' compiles and links.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "clients/python"))
import infeed  # noqa: E402
BUILD = Path(os.environ.get("IFD_BUILD_DIR", HERE.parent.parent / "build"))
CMAKE = os.environ.get("CMAKE_COMMAND", "cmake")
CC = os.environ.get("CC", "cc")
SANITIZE = os.environ.get("IFD_SANITIZE", "")
SAN_FLAGS = [f"-fsanitize={SANITIZE}"] if SANITIZE else []


def run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 180), **kw)
    assert r.returncode == 0, f"{shlex.join(map(str, cmd))} failed ({r.returncode}):\n" \
                              f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def needed(exe: Path) -> list[str]:
    out = run(["readelf", "-d", exe]).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def control(endpoint: str, request: str) -> str:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 2000)
    s.connect(endpoint)
    try:
        s.send_string(request)
        return s.recv_string()
    finally:
        s.close()


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    if not (BUILD / "CMakeCache.txt").is_file():
        pytest.skip(f"no build in {BUILD} (set IFD_BUILD_DIR)")
    tmp = tmp_path_factory.mktemp("pkg")
    staged = tmp / "staged"
    run([CMAKE, "--install", BUILD, "--prefix", staged])
    moved = tmp / "moved prefix"  # a blank in the path too
    staged.rename(moved)
    return moved


def test_installed_files(prefix):
    for f in ["bin/infeedd", "include/infeed/client.h", "include/infeed/infeed.h",
              "lib/libinfeed.a", "lib/libinfeed-client.a", "lib/cmake/infeed/infeedConfig.cmake",
              "lib/cmake/infeed/infeedConfigVersion.cmake", "lib/pkgconfig/infeed.pc",
              "lib/pkgconfig/infeed-client.pc", "lib/pkgconfig/infeed-static.pc",
              "lib/pkgconfig/infeed-client-static.pc", "lib/systemd/system/infeedd.service",
              "lib/systemd/system/infeedd@.service", "share/infeed/infeedd.example.json"]:
        assert (prefix / f).is_file(), f"{f} is not installed"
    libs = {p.name for p in (prefix / "lib").iterdir()}
    assert {"libinfeed.so.0", "libinfeed-client.so.0"} <= libs, libs
    # infeedd finds the prefix's libinfeed through its RPATH, with no LD_LIBRARY_PATH.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    assert "libinfeed.so.0" in needed(prefix / "bin/infeedd")
    ldd = run(["ldd", prefix / "bin/infeedd"], env=env).stdout
    line = next(ln for ln in ldd.splitlines() if "libinfeed.so.0" in ln)
    assert str(prefix / "lib/libinfeed.so.0") in line or "moved prefix/bin/../lib" in line, ldd
    unit = (prefix / "lib/systemd/system/infeedd@.service").read_text()
    assert re.search(r"^ExecStart=/\S*/infeedd --config /\S*/infeed/%i\.json$", unit, re.M), unit


def test_systemd_units_verify(prefix, tmp_path):
    """systemd-analyze verify finds nothing wrong in the units (their ExecStart pointed at the
    installed infeedd, since they name the configured prefix)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze")
    (tmp_path / "infeedd").symlink_to(prefix / "bin/infeedd")
    for unit, instance in [("infeedd.service", "infeedd.service"),
                           ("infeedd@.service", "infeedd@digits.service")]:
        text = (prefix / "lib/systemd/system" / unit).read_text()
        text = re.sub(r"^ExecStart=\S+/infeedd ", f"ExecStart={tmp_path}/infeedd ", text, flags=re.M)
        (tmp_path / unit).write_text(text)
        r = subprocess.run([analyze, "verify", tmp_path / instance], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), \
            f"systemd-analyze verify {instance}: {r.returncode}\n{r.stdout}\n{r.stderr}"


def test_pkg_config_static_resolves(prefix):
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib/pkgconfig"))
    out = run(["pkg-config", "--static", "--libs", "infeed", "infeed-client"], env=env).stdout
    for lib in ["-linfeed", "-linfeed-client", "-ljansson", "-lzmq", "-lopenblas", "-lz", "-lm"]:
        assert lib in out.split(), f"{lib} missing in pkg-config --static --libs: {out}"
    out = run(["pkg-config", "--libs", "infeed", "infeed-client"], env=env).stdout
    assert "-ljansson" not in out.split() and "-lzmq" not in out.split(), out


def build_consumers(prefix: Path, tmp: Path) -> dict[str, Path]:
    src = HERE / "consumer"
    exes = {}
    for kind in ["shared", "static"]:
        b = tmp / f"cmake-{kind}"
        run([CMAKE, "-S", src, "-B", b, f"-DCMAKE_PREFIX_PATH={prefix}",
             f"-DCONSUMER_STATIC={'ON' if kind == 'static' else 'OFF'}",
             f"-DCMAKE_C_COMPILER={CC}", "-DCMAKE_BUILD_TYPE=Release",
             f"-DCMAKE_C_FLAGS={' '.join(SAN_FLAGS)}",
             f"-DCMAKE_EXE_LINKER_FLAGS={' '.join(SAN_FLAGS)}"])
        run([CMAKE, "--build", b])
        exes[f"cmake-{kind}"] = b / "consumer"
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib/pkgconfig"))
    for kind, mods, extra in [("shared", ["infeed-client", "infeed"],
                               [f"-Wl,-rpath,{prefix / 'lib'}"]),
                              ("static", ["infeed-client-static", "infeed-static"], [])]:
        flags = shlex.split(run(["pkg-config", "--cflags", "--libs", *mods], env=env).stdout)
        exe = tmp / f"pkgconfig-{kind}"
        run([CC, "-O1", *SAN_FLAGS, "-o", exe, src / "consumer.c", *flags, *extra])
        exes[f"pkgconfig-{kind}"] = exe
    return exes


def test_consumers_against_installed_daemon(prefix, tmp_path):
    seed = int(os.environ.get("IFD_TEST_SEED", random.randrange(1 << 31)))
    print(f"seed {seed} (IFD_TEST_SEED={seed} repeats this run)")
    rng = random.Random(seed)
    exes = build_consumers(prefix, tmp_path)
    for name, exe in exes.items():
        libs = needed(exe)
        if name.endswith("shared"):
            assert "libinfeed-client.so.0" in libs, f"{name} does not link libinfeed-client.so: {libs}"
        else:
            assert not any(lib.startswith("libinfeed") for lib in libs), \
                f"{name} links a shared infeed library: {libs}"

    lp, cp = free_ports(2)
    listen, ctl = f"tcp://127.0.0.1:{lp}", f"tcp://127.0.0.1:{cp}"
    log_path = tmp_path / "infeedd.log"
    log = open(log_path, "wb")
    st = os.fstat(log.fileno())
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    daemon = subprocess.Popen(
        [prefix / "bin/infeedd", "--config", prefix / "share/infeed/infeedd.example.json",
         "--listen", listen, "--publish", "", "--control", ctl,
         "--summaries", tmp_path / "summaries.jsonl", "--checkpoint-dir", tmp_path / "ckpt",
         "--steps", "100000"], stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert daemon.poll() is None, f"infeedd exited: {log_path.read_text()}"
            try:
                control(ctl, "status")
                break
            except zmq.Again:
                assert time.monotonic() < deadline, f"infeedd did not answer: {log_path.read_text()}"
        for name, exe in exes.items():
            batches = rng.randint(1, 6)
            r = subprocess.run([exe, listen, name, "64", "10", str(batches),
                                str(rng.randrange(1 << 62))],
                               capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
            assert "welcome batch_size=64 " in r.stdout, f"{name}: {r.stdout}"
            assert f"acked {batches}\n" in r.stdout, f"{name}: {r.stdout}"
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
    text = log_path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln]
    assert lines, "infeedd logged nothing at --log-level info"
    for ln in lines:
        assert re.match(r"<[3467]>infeed (error|warn |info |debug) \[", ln), \
            f"a line without the journald priority prefix: {ln!r}\n{text}"
    assert any(ln.startswith("<6>infeed info ") for ln in lines), text


def test_custom_program_plugin_out_of_tree(prefix, tmp_path):
    """examples/custom_program, built out of tree against the installed prefix with
    find_package(infeed) as its README says, is loaded by the installed infeedd (--program-lib)
    and trains: the loss of its last steps is below that of its first."""
    seed = int(os.environ.get("IFD_TEST_SEED", random.randrange(1 << 31)))
    print(f"seed {seed} (IFD_TEST_SEED={seed} repeats this run)")
    rng = random.Random(seed)
    b = tmp_path / "custom_program"
    run([CMAKE, "-S", HERE.parent.parent / "examples/custom_program", "-B", b,
         f"-DCMAKE_PREFIX_PATH={prefix}", f"-DCMAKE_C_COMPILER={CC}", "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_C_FLAGS={' '.join(SAN_FLAGS)}",
         f"-DCMAKE_MODULE_LINKER_FLAGS={' '.join(SAN_FLAGS)}"])
    run([CMAKE, "--build", b])
    plugin = b / "mlp2.so"
    assert plugin.is_file(), list(b.iterdir())
    features, classes, hidden = rng.randint(3, 12), rng.randint(2, 5), rng.randint(4, 16)
    batch, steps = rng.choice([8, 16, 32]), 300
    (lp,) = free_ports(1)
    listen = f"tcp://127.0.0.1:{lp}"
    summaries = tmp_path / "s.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    daemon = subprocess.Popen(
        [prefix / "bin/infeedd", "--program-lib", plugin, "--program", "mlp2", "--features",
         str(features), "--classes", str(classes), "--hidden", str(hidden), "--batch-size",
         str(batch), "--steps", str(steps), "--iterations-per-loop", "10", "--summary-every",
         "50", "--learning-rate", "0.1", "--listen", listen, "--publish", "", "--control", "",
         "--summaries", summaries], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        nrng = np.random.default_rng(seed)
        w = nrng.standard_normal((features, classes))
        p = infeed.Producer(listen, name="plugin-test", timeout=30)
        try:
            while True:
                x = nrng.standard_normal((batch, features)).astype(np.float32)
                p.send(x=x, y=np.argmax(x @ w, axis=1).astype(np.int32))
        except infeed.RunEnded:
            pass
        p.close()
        out, _ = daemon.communicate(timeout=60)
        assert daemon.returncode == 0, out
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    train = [json.loads(ln) for ln in summaries.read_text().splitlines()]
    train = [s for s in train if s["event"] == "train"]
    assert train[-1]["global_step"] == steps, train
    assert train[-1]["loss"] < train[0]["loss"], [s["loss"] for s in train]


def test_install_right_after_the_demo_build(tmp_path):
    """./demo.sh builds only the install-set target (Release, no tests, no CUDA): a
    `cmake --install` of that tree must find everything it copies. Plain builds only (a fresh
    tree builds everything once more)."""
    if SANITIZE:
        pytest.skip("sanitizer build: the plain build checks this")
    src = HERE.parent.parent
    demo = (src / "demo.sh").read_text()
    assert "--target install-set" in demo, "demo.sh no longer builds install-set"
    b = tmp_path / "build"
    run([CMAKE, "-S", src, "-B", b, "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_TESTING=OFF",
         "-DIFD_CUDA=OFF", f"-DCMAKE_C_COMPILER={CC}"], timeout=300)
    run([CMAKE, "--build", b, "-j", str(os.cpu_count() or 2), "--target", "install-set"],
        timeout=900)
    run([CMAKE, "--install", b, "--prefix", tmp_path / "prefix"], timeout=300)
    for f in ["bin/infeedd", "bin/infeedctl", "lib/libinfeed.so.0", "lib/libinfeed-client.a"]:
        assert (tmp_path / "prefix" / f).exists(), f"{f} not installed"
