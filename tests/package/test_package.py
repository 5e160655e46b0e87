"""The installed package, used as a project outside the tree would (README.md, "Install" and
"Using infeed from your project").

Installs the build ($IFD_BUILD_DIR) to a temporary prefix and moves the prefix (everything must be
relative to it: the RPATHs, the CMake package, the .pc files; the systemd units name the prefix
the install was given, and are hardened). Starts the installed infeedd with
the installed example config (a few flags override its paths and endpoints) and JOURNAL_STREAM
naming its stderr. Builds tests/package/consumer four times, out of tree: find_package(infeed)
with the shared and with the static targets, pkg-config with infeed-client + infeed and with
infeed-client-static + infeed-static; runs each against the daemon (WELCOME, every batch
ACKed), and the installed infeedctl asks it for its status. The daemon's log lines carry journald
priority prefixes. Builds examples/custom_program (the mlp2 program plugin) and examples/host_call
(the calibration host call) out of tree with find_package(infeed), as their READMEs say, and
runs them with the installed infeedd (--program-lib, --host-call-lib), under
MemoryDenyWriteExecute's rule (prctl PR_SET_MDWE) where the kernel has it, as the units of a
build without cuda run it.

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
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "clients/python"))
sys.path.insert(0, str(HERE.parent / "e2e"))
import infeed  # noqa: E402
from helpers import wait_ready_file  # noqa: E402
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


def needed(exe: Path) -> list[str]:
    out = run(["readelf", "-d", exe]).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the prefix given to cmake --install, where that prefix was moved)"""
    if not (BUILD / "CMakeCache.txt").is_file():
        pytest.skip(f"no build in {BUILD} (set IFD_BUILD_DIR)")
    tmp = tmp_path_factory.mktemp("pkg")
    staged = tmp / "staged"
    run([CMAKE, "--install", BUILD, "--prefix", staged])
    moved = tmp / "moved prefix"  # a blank in the path too
    staged.rename(moved)
    return staged, moved


@pytest.fixture(scope="module")
def prefix(installed) -> Path:
    return installed[1]


def no_ld_path() -> dict:
    return {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}


def cache_value(name: str) -> str:
    m = re.search(rf"^{name}:[A-Z]+=(.*)$", (BUILD / "CMakeCache.txt").read_text(), re.M)
    return m.group(1) if m else ""


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
    # infeedd and infeedctl find the prefix's libraries through their RPATH, with no
    # LD_LIBRARY_PATH, and start
    for exe, lib in [("infeedd", "libinfeed.so.0"), ("infeedctl", "libinfeed-client.so.0")]:
        assert lib in needed(prefix / "bin" / exe), exe
        ldd = run(["ldd", prefix / "bin" / exe], env=no_ld_path()).stdout
        line = next(ln for ln in ldd.splitlines() if lib in ln)
        assert str(prefix / "lib" / lib) in line or "moved prefix/bin/../lib" in line, ldd
        r = subprocess.run([prefix / "bin" / exe, "--version"], capture_output=True, text=True,
                           env=no_ld_path(), timeout=30)
        assert r.returncode == 0 and r.stdout.startswith(f"{exe} "), (exe, r.stdout, r.stderr)


def test_systemd_units_name_the_install_prefix(installed):
    """The units name the prefix cmake --install was given, not the one the build was
    configured with."""
    staged, moved = installed
    assert str(staged) != cache_value("CMAKE_INSTALL_PREFIX")
    for unit, config in [("infeedd.service", "infeedd"), ("infeedd@.service", "%i")]:
        text = (moved / "lib/systemd/system" / unit).read_text()
        execs = re.findall(r"^ExecStart=(.*)$", text, re.M)
        assert execs == [f"{staged}/bin/infeedd --config {staged}/etc/infeed/{config}.json"], \
            (unit, execs)
        assert f"file://{staged}/share/infeed/infeedd.example.json" in text, unit


# What the units must say, whatever the build (docs/design.md, "systemd units").
HARDENING = {
    "Restart": "on-failure", "RestartPreventExitStatus": "2", "DynamicUser": "yes",
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
    "PrivateTmp": "yes", "PrivateUsers": "yes", "PrivateMounts": "yes", "ProtectClock": "yes",
    "ProtectHostname": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes", "ProtectProc": "invisible",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK", "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes", "RestrictSUIDSGID": "yes", "LockPersonality": "yes",
    "SystemCallArchitectures": "native", "CapabilityBoundingSet": "", "UMask": "0077",
}


def unit_keys(text: str) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for m in re.finditer(r"^([A-Za-z]+)=(.*)$", text, re.M):
        keys.setdefault(m.group(1), []).append(m.group(2))
    return keys


def test_systemd_units_hardened(prefix):
    """Every hardening key is set; a build without cuda also denies devices and writable
    executable memory (the cuda driver needs both)."""
    cuda = cache_value("IFD_CUDA_BACKEND").upper() in ("ON", "1", "TRUE")
    devices = "no" if cuda else "yes"
    for unit in ["infeedd.service", "infeedd@.service"]:
        keys = unit_keys((prefix / "lib/systemd/system" / unit).read_text())
        for k, v in dict(HARDENING, PrivateDevices=devices,
                         MemoryDenyWriteExecute=devices).items():
            assert keys.get(k) == [v], f"{unit}: {k}={keys.get(k)}, expected [{v!r}]"
        assert keys.get("SystemCallFilter") == ["@system-service", "~@privileged"], unit


def test_systemd_units_verify(prefix, tmp_path):
    """systemd-analyze verify finds nothing wrong in the units (their ExecStart pointed at the
    installed infeedd, since they name the prefix before it moved), and systemd-analyze
    security rates them OK (2.0 or less; the units before hardening were 8.4, EXPOSED)."""
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
        r = subprocess.run([analyze, "security", "--offline=true", "--no-pager",
                            tmp_path / instance], capture_output=True, text=True, timeout=60)
        m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
        if m is None and "--offline" in r.stderr:
            continue  # a systemd before 250 rates only loaded units
        assert m, f"systemd-analyze security {instance}: {r.returncode}\n{r.stdout}\n{r.stderr}"
        print(f"systemd-analyze security {instance}: {m.group(1)}")
        assert float(m.group(1)) <= 2.0, f"{instance} is rated {m.group(1)}:\n{r.stdout}"


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


def test_readme_pkg_config_lines(prefix, tmp_path):
    """The README's pkg-config lines, run as written (PREFIX the installed prefix, loader.c the
    C example producer, train.c examples/train_synthetic.c): every program finds its libraries with no
    LD_LIBRARY_PATH (the shared ones through the line's rpath), and the trainer trains."""
    root = HERE.parent.parent
    lines = re.findall(r"^(cc (loader|train)\.c \$\(pkg-config [^#]*?)\s+#",
                       (root / "README.md").read_text(), re.M)
    assert [k for _, k in lines] == ["loader", "loader", "train", "train"], lines
    link = tmp_path / "prefix"  # no blank: the shell splits $(pkg-config ...) on blanks
    link.symlink_to(prefix)
    env = dict(no_ld_path(), PKG_CONFIG_PATH=str(link / "lib/pkgconfig"))
    src = {"loader": root / "examples/c_producer.c",
           "train": root / "examples/train_synthetic.c"}
    for i, (line, kind) in enumerate(lines):
        exe = tmp_path / f"{kind}{i}"
        cmd = line.replace("PREFIX", shlex.quote(str(link))).replace(
            f"cc {kind}.c", shlex.join([CC, *SAN_FLAGS, "-o", str(exe), str(src[kind])]), 1)
        run(["bash", "-c", cmd], env=env)
        ldd = run(["ldd", exe], env=no_ld_path()).stdout
        assert "not found" not in ldd, f"{line}\n{ldd}"
        if kind == "train":
            r = run([exe, "--steps", "20", "--replicas", "1", "--iterations-per-loop", "5"],
                    env=no_ld_path(), timeout=120)
            assert '"event":"end"' in r.stdout.replace(" ", ""), f"{line}\n{r.stdout[-2000:]}"


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

    log_path = tmp_path / "infeedd.log"
    log = open(log_path, "wb")
    st = os.fstat(log.fileno())
    env = no_ld_path()
    env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    daemon = subprocess.Popen(
        [prefix / "bin/infeedd", "--config", prefix / "share/infeed/infeedd.example.json",
         "--listen", "tcp://127.0.0.1:*", "--publish", "", "--control", "tcp://127.0.0.1:*",
         "--ready-file", tmp_path / "ready.json",
         "--summaries", tmp_path / "summaries.jsonl", "--checkpoint-dir", tmp_path / "ckpt",
         "--steps", "100000"], stdout=log, stderr=log, env=env)
    try:
        ready = wait_ready_file(tmp_path / "ready.json", daemon, 15, log_path.read_text)
        listen, ctl = ready["listen"], ready["control"]
        for name, exe in exes.items():
            batches = rng.randint(1, 6)
            r = subprocess.run([exe, listen, name, "64", "10", str(batches),
                                str(rng.randrange(1 << 62))],
                               capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
            assert "welcome batch_size=64 " in r.stdout, f"{name}: {r.stdout}"
            assert f"acked {batches}\n" in r.stdout, f"{name}: {r.stdout}"
        # the installed infeedctl (its RPATH) talks to the installed daemon
        r = subprocess.run([prefix / "bin/infeedctl", "--control", ctl, "status", "--json"],
                           capture_output=True, text=True, timeout=60, env=no_ld_path())
        assert r.returncode == 0, f"infeedctl: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        st = json.loads(r.stdout)
        assert st["ok"] and st["program"] == "softmax", st
        assert sorted(p["name"] for p in st["producers"]) == sorted(exes), st["producers"]
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


def deny_write_execute() -> None:
    """In the child before exec: the rule of systemd's MemoryDenyWriteExecute=yes (no mapping
    both writable and executable, none made executable later), which execve keeps; nothing on a
    kernel before 6.3 (no PR_SET_MDWE) or in a sanitizer build (its runtime may need it)."""
    if SANITIZE:
        return
    import ctypes
    PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)


def build_example(prefix: Path, tmp: Path, folder: str, module: str) -> Path:
    """examples/FOLDER built out of tree against the installed prefix with find_package(infeed),
    as its README says: the MODULE.so it makes."""
    b = tmp / folder
    run([CMAKE, "-S", HERE.parent.parent / "examples" / folder, "-B", b,
         f"-DCMAKE_PREFIX_PATH={prefix}", f"-DCMAKE_C_COMPILER={CC}", "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_C_FLAGS={' '.join(SAN_FLAGS)}",
         f"-DCMAKE_MODULE_LINKER_FLAGS={' '.join(SAN_FLAGS)}"])
    run([CMAKE, "--build", b])
    plugin = b / f"{module}.so"
    assert plugin.is_file(), list(b.iterdir())
    return plugin


def train_installed(prefix: Path, tmp: Path, flags: list, make_batch) -> list[dict]:
    """The installed infeedd with flags, fed make_batch() until the run ends; its summaries."""
    summaries = tmp / "s.jsonl"
    daemon = subprocess.Popen(
        [prefix / "bin/infeedd", *flags, "--listen", "tcp://127.0.0.1:*", "--publish", "",
         "--control", "", "--ready-file", tmp / "ready.json", "--summaries", summaries],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=no_ld_path(),
        preexec_fn=deny_write_execute)
    try:
        listen = wait_ready_file(tmp / "ready.json", daemon, 15,
                                 lambda: daemon.stdout.read().decode(errors="replace")
                                 if daemon.poll() is not None else "")["listen"]
        p = infeed.Producer(listen, name="plugin-test", timeout=30)
        try:
            while True:
                p.send(make_batch())
        except infeed.RunEnded:
            pass
        p.close()
        out, _ = daemon.communicate(timeout=60)
        assert daemon.returncode == 0, out
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    return [json.loads(ln) for ln in summaries.read_text().splitlines()]


def learnable(seed: int, batch: int, features: int, classes: int):
    nrng = np.random.default_rng(seed)
    w = nrng.standard_normal((features, classes))

    def make():
        x = nrng.standard_normal((batch, features)).astype(np.float32)
        return {"x": x, "y": np.argmax(x @ w, axis=1).astype(np.int32)}
    return make


def test_custom_program_plugin_out_of_tree(prefix, tmp_path):
    """examples/custom_program, built out of tree against the installed prefix with
    find_package(infeed) as its README says, is loaded by the installed infeedd (--program-lib)
    and trains: the loss of its last steps is below that of its first."""
    seed = int(os.environ.get("IFD_TEST_SEED", random.randrange(1 << 31)))
    print(f"seed {seed} (IFD_TEST_SEED={seed} repeats this run)")
    rng = random.Random(seed)
    plugin = build_example(prefix, tmp_path, "custom_program", "mlp2")
    features, classes, hidden = rng.randint(3, 12), rng.randint(2, 5), rng.randint(4, 16)
    batch, steps = rng.choice([8, 16, 32]), 300
    train = train_installed(
        prefix, tmp_path,
        ["--program-lib", plugin, "--program", "mlp2", "--features", str(features), "--classes",
         str(classes), "--hidden", str(hidden), "--batch-size", str(batch), "--steps", str(steps),
         "--iterations-per-loop", "10", "--summary-every", "50", "--learning-rate", "0.1"],
        learnable(seed, batch, features, classes))
    train = [s for s in train if s["event"] == "train"]
    assert train[-1]["global_step"] == steps, train
    assert train[-1]["loss"] < train[0]["loss"], [s["loss"] for s in train]


def test_host_call_plugin_out_of_tree(prefix, tmp_path):
    """examples/host_call, built out of tree against the installed prefix, runs in the installed
    infeedd (--host-call-lib): its calibration counts every row of each summary, right as the
    summary's accuracy says."""
    rng = random.Random()
    plugin = build_example(prefix, tmp_path, "host_call", "calibration")
    features, classes = rng.randint(2, 8), rng.randint(2, 5)
    batch, steps = rng.choice([8, 16]), rng.randint(20, 60)
    summ = train_installed(
        prefix, tmp_path,
        ["--host-call-lib", plugin, "--program", "softmax", "--features", str(features),
         "--classes", str(classes), "--batch-size", str(batch), "--steps", str(steps),
         "--summary-every", "10", "--replicas", "2"],
        learnable(rng.randrange(1 << 30), batch, features, classes))
    train = [s for s in summ if s["event"] == "train"]
    assert train and train[-1]["global_step"] == steps, summ[-1]
    for s in train:
        cal = s["host_calls"]["calibration"]
        assert cal["right"] + cal["wrong"] == s["examples"], s
        assert cal["right"] / s["examples"] == pytest.approx(s["accuracy"], abs=1e-9), s


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
