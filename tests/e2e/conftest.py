"""Fixtures of the end-to-end suite: a real infeedd on loopback ports it chooses.

The daemon binary is $INFEEDD (CTest sets it to the built target); without it, the tests that
need the daemon are skipped. Each test gets a ``daemon`` factory: ``daemon(flag=value, ...)``
starts one (flags are written --flag-name value; True alone for a bare flag; "default" for
listen, publish or control leaves the flag out; preexec_fn=f runs f in the child before exec), waits until its --ready-file names the endpoints it bound (it serves
them then), and the fixture always kills it at teardown.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
import zmq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
if os.environ.get("PYTHONPATH") is None:
    sys.path.insert(0, str(ROOT / "clients" / "python"))
from helpers import CURVE_BATCH, CURVE_CLASSES, CURVE_FEATURES, wait_ready_file  # noqa: E402
from infeed import keys as K  # noqa: E402


def infeedd_path() -> Optional[str]:
    p = os.environ.get("INFEEDD") or str(ROOT / "build" / "host" / "infeedd")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def dead_tcp_endpoint() -> str:
    """A tcp endpoint where nothing listens, on a port below the kernel's ephemeral range: a
    client reconnecting to a closed ephemeral port can be given that same port as its own local
    port and connect to itself (TCP simultaneous open), which a ZeroMQ DEALER takes for a
    handshake with a peer (CI saw "no WELCOME" instead of "no daemon answered")."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(low, 10001))
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        return f"tcp://127.0.0.1:{port}"
    raise RuntimeError(f"no free port below the ephemeral range ({low})")


def control_request(endpoint: str, request, timeout: float = 5.0, server=None, keypair=None):
    """One request on a control REP socket (a dict is sent as JSON, bytes as they are), as a
    CURVE client of server with keypair when keypair is given."""
    s = zmq.Context.instance().socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    try:
        if keypair is not None:
            K.apply_client(s, K.client_keys(server_key=server, keypair=keypair))
        s.connect(endpoint)
        s.send(request if isinstance(request, bytes) else json.dumps(request).encode())
        if not s.poll(int(timeout * 1000)):
            raise TimeoutError(f"control {endpoint}: no answer to {request!r} within {timeout} s")
        return json.loads(s.recv())
    finally:
        s.close(0)


def run_infeedd(*args: str, timeout: float = 10) -> subprocess.CompletedProcess:
    """Runs infeedd to completion (for flag and config errors, --help, --version)."""
    exe = infeedd_path()
    if exe is None:
        pytest.skip("infeedd is not built (set INFEEDD)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


class Daemon:
    """infeedd with the given flags. Unless a test names them, its three sockets bind ports the
    system chooses (tcp://127.0.0.1:*), which it reports in its --ready-file: no port is picked
    here and released before the daemon binds it."""

    def __init__(self, tmp: Path, flags: dict, wait_ready: bool = True):
        exe = infeedd_path()
        if exe is None:
            pytest.skip("infeedd is not built (set INFEEDD)")
        self.tmp = tmp
        self.flags = dict(flags)
        preexec = self.flags.pop("preexec_fn", None)  # e.g. a lower RLIMIT_NOFILE
        n = len(list(tmp.glob("infeedd*.log")))
        self.summaries_path = Path(self.flags.setdefault("summaries",
                                                         str(tmp / f"summaries{n}.jsonl")))
        self.ready_path = Path(self.flags.setdefault("ready_file", str(tmp / f"ready{n}.json")))
        for key in ("listen", "publish", "control"):
            if self.flags.get(key) == "default":  # the daemon's own default: no flag
                del self.flags[key]
            else:
                self.flags[key] = self.flags.get(key) or "tcp://127.0.0.1:*"
        self.listen, self.publish, self.control_endpoint = \
            (self.flags.get(k) for k in ("listen", "publish", "control"))
        self.argv = [exe]
        for k, v in self.flags.items():
            if v is None or v is False:
                continue
            self.argv.append("--" + k.replace("_", "-"))
            if v is not True:
                self.argv.append(str(v))
        self.log_path = tmp / f"infeedd{n}.log"
        self._log = open(self.log_path, "wb")
        print("starting:", " ".join(self.argv))
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec)
        self.started = time.monotonic()
        if wait_ready:
            self._wait_ready()

    def _wait_ready(self, deadline_s: float = 15) -> None:
        """Until the ready file names the bound endpoints (the daemon serves them then)."""
        self.ready = wait_ready_file(self.ready_path, self.proc, deadline_s, self.log)
        self.listen = self.ready["listen"]
        self.publish = self.ready["publish"]
        self.control_endpoint = self.ready["control"]

    def control(self, request, timeout: float = 5.0):
        """One request on the control REP socket: a dict is sent as JSON, bytes as they are."""
        return control_request(self.control_endpoint, request, timeout)

    def log(self, tail: int | None = None) -> str:
        """The daemon's log, whole (a test looks for lines in it), or its last `tail`
        characters."""
        try:
            if not self._log.closed:  # (kill() closes it; the file stays readable)
                self._log.flush()
            text = self.log_path.read_text(errors="replace")
            return text if tail is None else text[-tail:]
        except OSError:
            return ""

    def wait(self, timeout: float = 20) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"infeedd still running after {timeout} s:\n{self.log()}")

    def summaries(self) -> list[dict]:
        if not self.summaries_path.exists():
            return []
        return [json.loads(line) for line in self.summaries_path.read_text().splitlines()
                if line.strip()]

    def end_summary(self) -> dict:
        s = self.summaries()
        assert s, f"no summaries in {self.summaries_path}:\n{self.log()}"
        assert s[-1]["event"] == "end", f"the last summary is not the end: {s[-1]}"
        return s[-1]

    def signal(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._log.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test item, so fixtures can tell a failed test."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def started_daemons(request, make):
    """A fixture's body: yields start(**flags), which makes a daemon with make(**flags); at
    teardown each is killed, and, when the test failed, its state, exit status and log are
    printed."""
    started: list[Daemon] = []

    def start(**flags) -> Daemon:
        d = make(**flags)
        started.append(d)
        return d

    yield start
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for d in started:
        if failed:  # the daemon's side of a failure: its state, exit status and log
            alive = d.proc.poll() is None
            if alive:
                try:
                    print(f"status of {d.listen}: {d.control({'cmd': 'status'}, timeout=2)}")
                except Exception as e:  # noqa: BLE001 - diagnostics only
                    print(f"status of {d.listen}: no answer ({e!r})")
            print(f"infeedd {' '.join(d.argv[1:])}: "
                  f"{'still running' if alive else f'exited {d.proc.returncode}'}\n"
                  f"{d.log()[-4000:]}")
        d.kill()


@pytest.fixture
def daemon(tmp_path, request):
    yield from started_daemons(request, lambda wait_ready=True, **flags:
                               Daemon(tmp_path, flags, wait_ready))


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("INFEED_TEST_SEED", random.randrange(1 << 30)))
    print(f"{request.node.name}: seed {seed} (INFEED_TEST_SEED={seed} repeats it)")
    return random.Random(seed)


# ---- CURVE (docs/protocol.md, "Security"): keys and a daemon that requires them ------------

def keygen(prefix: Path) -> tuple:
    r = run_infeedd("keygen", str(prefix))
    assert r.returncode == 0, r.stderr
    return K.load_keypair(f"{prefix}.key")


@pytest.fixture
def keys(tmp_path):
    """The daemon's key pair and four clients: a (bound to loader-0, loader-1), b (any free
    name), admin, stranger (listed nowhere); the authorized- and admin-keys files."""
    k = {n: keygen(tmp_path / n) for n in ("daemon", "a", "b", "admin")}
    k["stranger"] = K.generate_keypair()
    (tmp_path / "authorized").write_text(
        f"# producers\n{k['a'][0]}  loader-0, loader-1\n\n{k['b'][0]}\n")
    (tmp_path / "admins").write_text(f"{k['admin'][0]}\n")
    k["flags"] = dict(curve_secret_key=str(tmp_path / "daemon.key"),
                      authorized_keys=str(tmp_path / "authorized"),
                      admin_keys=str(tmp_path / "admins"))
    k["server"] = k["daemon"][0]
    k["dir"] = tmp_path
    return k


class CurveDaemon(Daemon):
    """A Daemon whose readiness check and control requests use the admin key."""

    def __init__(self, tmp, flags, keys):
        self.keys = keys
        super().__init__(tmp, flags)

    def control(self, request, timeout: float = 5.0, keypair=...):
        return control_request(self.control_endpoint, request, timeout, self.keys["server"],
                               self.keys["admin"] if keypair is ... else keypair)


@pytest.fixture
def curve_daemon(tmp_path, keys, request):
    """daemon for CURVE: the keys' flags, a softmax program of helpers.CURVE_*."""
    def make(**flags) -> CurveDaemon:
        f = dict(keys["flags"], program="softmax", features=CURVE_FEATURES, classes=CURVE_CLASSES,
                 batch_size=CURVE_BATCH, iterations_per_loop=5, summary_every=5)
        f.update(flags)
        return CurveDaemon(tmp_path, f, keys)

    yield from started_daemons(request, make)
