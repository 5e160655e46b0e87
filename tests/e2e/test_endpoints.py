"""The endpoints infeedd binds and says it bound: ports the system chooses
(tcp://127.0.0.1:*) reported in the log line, in status and in the --ready-file (written whole,
once every socket is served, removed at exit; a stale one removed at start); the missing folders
of an ipc:// endpoint created with mode 0700; the default control socket, private to the
daemon's user (an ipc socket in a folder of mode 0700 that infeedctl finds); and the README's
multi-host example, which binds ipc endpoints in a folder that does not exist yet, run as
written."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import infeed
from conftest import ROOT, control_request, infeedd_path
from helpers import (MPI_ENV, infeedctl_path, mpi_skip_reason, steps_data, stream_until_end,
                     subscribed, wait_ready_file)


def start(tmp: Path, *args: str) -> subprocess.Popen:
    exe = infeedd_path()
    if exe is None:
        pytest.skip("infeedd is not built (set INFEEDD)")
    log = open(tmp / "infeedd.log", "wb")
    return subprocess.Popen([exe, *args], stdout=log, stderr=subprocess.STDOUT)


def log_of(tmp: Path) -> str:
    return (tmp / "infeedd.log").read_text(errors="replace")


def train_through(listen: str, rng, features: int, classes: int, batch: int) -> int:
    """Streams random batches until the run ends; the batches sent."""
    x, y = steps_data(rng.randrange(1 << 30), 4, batch, features, classes)
    _, sent = stream_until_end(listen, lambda i: {"x": x[i % 4 * batch:(i % 4 + 1) * batch],
                                                  "y": y[i % 4 * batch:(i % 4 + 1) * batch]})
    return sent


def test_wildcard_ports_are_reported_and_used(tmp_path, rng):
    """All three sockets on tcp://127.0.0.1:*: the ready file, status and the log line name the
    same bound ports, and a producer and a subscriber that use them train the run to its end."""
    features, classes = rng.randint(2, 12), rng.randint(2, 5)
    batch, steps = rng.choice([4, 8, 16]), rng.randint(3, 12)
    ready = tmp_path / "run" / "ready.json"
    ready.parent.mkdir()
    proc = start(tmp_path, "--features", str(features), "--classes", str(classes),
                 "--batch-size", str(batch), "--steps", str(steps), "--iterations-per-loop", "1",
                 "--summary-every", "1", "--listen", "tcp://127.0.0.1:*", "--publish",
                 "tcp://127.0.0.1:*", "--control", "tcp://127.0.0.1:*", "--ready-file",
                 str(ready))
    try:
        r = wait_ready_file(ready, proc, 15, lambda: log_of(tmp_path))
        assert set(r) == {"listen", "publish", "control", "pid"}, r
        assert r["pid"] == proc.pid, r
        ports = []
        for key in ("listen", "publish", "control"):
            m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", r[key])
            assert m and 0 < int(m.group(1)) < 65536, r
            ports.append(int(m.group(1)))
        assert len(set(ports)) == 3, r
        # written whole: no temporary file beside it
        assert [p.name for p in ready.parent.iterdir()] == ["ready.json"]
        assert f"ingest on {r['listen']}, summaries on {r['publish']}, control on " \
               f"{r['control']}" in log_of(tmp_path), log_of(tmp_path)
        st = control_request(r["control"], {"cmd": "status"})
        assert st["endpoints"] == {k: r[k] for k in ("listen", "publish", "control")}, st
        assert st["pid"] == proc.pid, st
        # a PUB socket drops what it sends before the subscription arrives
        sub = subscribed(infeed.Subscriber(r["publish"], timeout=20))
        assert train_through(r["listen"], rng, features, classes, batch) >= steps
        got = list(sub)
        sub.close()
        assert got and got[-1]["event"] == "end" and got[-1]["global_step"] == steps, got[-3:]
        assert proc.wait(20) == 0, log_of(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not ready.exists(), "the ready file outlived the daemon"
    assert list(ready.parent.iterdir()) == []


def test_ipc_folders_are_created(tmp_path, rng):
    """ipc:// endpoints in folders that do not exist: each missing folder is made with mode 0700,
    and the run trains through them."""
    depth = rng.randint(1, 3)
    base = tmp_path / "made"
    folder = base.joinpath(*[f"d{i}" for i in range(depth)])
    listen, control = f"ipc://{folder}/in", f"ipc://{base}/ctl/c"
    ready = tmp_path / "ready.json"
    proc = start(tmp_path, "--features", "4", "--classes", "3", "--batch-size", "8", "--steps",
                 "4", "--iterations-per-loop", "2", "--listen", listen, "--control", control,
                 "--publish", "", "--ready-file", str(ready))
    try:
        r = wait_ready_file(ready, proc, 15, lambda: log_of(tmp_path))
        assert r == {"listen": listen, "publish": None, "control": control, "pid": proc.pid}, r
        made = [base, *folder.parents, folder, base / "ctl"]
        for d in {m for m in made if m == base or base in m.parents}:
            assert d.is_dir() and stat.S_IMODE(d.stat().st_mode) == 0o700, \
                f"{d}: {oct(d.stat().st_mode)}"
        assert train_through(listen, rng, 4, 3, 8) >= 4
        assert proc.wait(20) == 0, log_of(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_endpoint_and_ready_file_errors(tmp_path):
    """An ipc folder that cannot be made, and a ready file that cannot be written: exit 1 with
    one sentence naming the key and the path; a stale ready file is gone either way."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ready = tmp_path / "ready.json"
    ready.write_text('{"listen": "tcp://127.0.0.1:1", "pid": 1}\n')  # another run's
    base = ["--features", "4", "--classes", "3", "--steps", "1", "--publish", "",
            "--control", ""]
    proc = start(tmp_path, *base, "--listen", f"ipc://{blocker}/sub/in", "--ready-file",
                 str(ready))
    assert proc.wait(20) == 1, log_of(tmp_path)
    err = [ln for ln in log_of(tmp_path).splitlines() if ln.startswith("infeedd: ")]
    assert len(err) == 1 and "listen" in err[0] and str(blocker) in err[0], log_of(tmp_path)
    assert not ready.exists(), "a stale ready file stayed"
    proc = start(tmp_path, *base, "--listen", "tcp://127.0.0.1:*", "--ready-file",
                 str(tmp_path / "no-such-folder" / "ready.json"))
    assert proc.wait(20) == 1, log_of(tmp_path)
    err = [ln for ln in log_of(tmp_path).splitlines() if ln.startswith("infeedd: ")]
    assert len(err) == 1 and "ready_file: cannot write" in err[0] and "no-such-folder" in err[0], \
        log_of(tmp_path)





def test_default_control_is_private(daemon, rng, tmp_path, monkeypatch):
    """Without --control the control socket is ipc://$XDG_RUNTIME_DIR/infeed/control, in a
    folder of mode 0700 (no other user reaches it); infeedctl finds it by itself; a folder that
    others may enter is refused with a sentence, and so is a second daemon on the same socket."""
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    d = daemon(features=4, classes=3, batch_size=8, steps=100000, control="default")
    folder = xdg / "infeed"
    assert d.control_endpoint == f"ipc://{folder}/control", d.ready
    st = os.stat(folder)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(), oct(st.st_mode)
    r = subprocess.run([infeedctl_path(), "status", "--json"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["endpoints"]["control"] == d.control_endpoint
    if os.geteuid() == 0:  # another user cannot connect
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(f"{folder}/control")
                except PermissionError:
                    code = 0
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0, "another user reached the control socket"
    second = daemon(features=4, classes=3, batch_size=8, steps=100000, control="default",
                    wait_ready=False)
    assert second.wait() == 1  # as any endpoint that cannot be bound
    assert "another process serves that socket" in second.log(), second.log()
    r = subprocess.run([infeedctl_path(), "stop"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert d.wait() == 0, d.log()
    shared = tmp_path / "shared"
    (shared / "infeed").mkdir(parents=True)
    os.chmod(shared / "infeed", 0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
    bad = daemon(features=4, classes=3, batch_size=8, steps=10, control="default",
                 wait_ready=False)
    assert bad.wait() == 1
    assert "that no one else may enter (mode 0700)" in bad.log(), bad.log()


def test_readme_multihost_example_as_written(tmp_path, rng):
    """The README's mpirun example (its ipc folder made fresh under tmp_path, and the PUB
    socket moved off the default port so that tests run side by side), fed by a producer per
    host that ends after a few global batches: the job ends with the input, exit 0."""
    reason = mpi_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^mpirun -np 2 infeedd (?:.*\\\n)*.*$", text, re.M)
    assert m, "the README's multi-host example is gone"
    cmd = m.group(0).replace("\\\n", " ")
    folder = tmp_path / "fresh" / "infeed"
    assert "ipc:///tmp/infeed/" in cmd, cmd
    cmd = cmd.replace("/tmp/infeed/", f"{folder}/").replace(" infeedd ",
                                                                    f" {os.path.abspath(infeedd_path())} ")
    argv = ["sh", "-c", cmd + " --publish 'tcp://127.0.0.1:*' --log-level info"]
    log = open(tmp_path / "infeedd.log", "wb")
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                            env=MPI_ENV, start_new_session=True)
    try:
        flags = dict(re.findall(r"--([a-z-]+) '?([^' ]+)'?", cmd))
        features, classes = int(flags["features"]), int(flags["classes"])
        rows = int(flags["batch-size"]) // 2
        batches = rng.randint(2, 5)
        x, y = steps_data(rng.randrange(1 << 30), 1, rows, features, classes)

        def feed(rank):  # each host's producer: a few batches, then END
            with infeed.Producer(f"ipc://{folder}/in-{rank}", name=f"h{rank}", timeout=60,
                                 connect_timeout=60) as p:
                for _ in range(batches):
                    p.send(x=x, y=y)

        with ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(feed, rank) for rank in range(2)]:
                try:
                    f.result()
                except TimeoutError as e:
                    pytest.fail(f"{e}\n{log_of(tmp_path)}")
        assert proc.wait(120) == 0, log_of(tmp_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    summaries = [json.loads(ln) for ln in (tmp_path / "summaries-0.jsonl").read_text().splitlines()]
    end = summaries[-1]
    assert (end["event"], end["status"], end["reason"]) == ("end", "ok", "input_ended"), end
    assert end["global_step"] == batches, end
