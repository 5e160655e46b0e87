"""Shared helpers of the e2e tests: data, streaming until the daemon has had enough."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import infeed

ROOT = Path(__file__).resolve().parent.parent.parent


def steps_data(seed: int, steps: int, batch: int, features: int, classes: int):
    """Random (x float32, y int32) of steps x batch rows, the same for the same seed."""
    r = np.random.default_rng(seed)
    return (r.standard_normal((steps * batch, features)).astype(np.float32),
            r.integers(0, classes, steps * batch, dtype=np.int32))


def seeded_batch(seed: int, rows: int, features: int, classes: int) -> dict:
    """A batch {x float32 [rows, features] normal, y int32 [rows] in [0, classes)}: the same
    bytes whenever it is made with the same seed (a stream that replays after a restart)."""
    r = np.random.default_rng(seed)
    return {"x": r.standard_normal((rows, features)).astype(np.float32),
            "y": r.integers(0, classes, rows, dtype=np.int32)}


def separable(rng: np.random.Generator, rows: int, features: int, classes: int,
              centers: np.ndarray, noise: float = 0.3):
    """Rows around one center per class: learnable by a softmax classifier."""
    y = rng.integers(0, classes, rows, dtype=np.int32)
    x = (centers[y] + noise * rng.standard_normal((rows, features))).astype(np.float32)
    return x, y


def gpu_visible() -> bool:
    """Whether nvidia-smi is here and lists a GPU."""
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def teacher_data(seed: int, steps: int, batch: int, features: int, classes: int):
    """As steps_data, with each row's label from a random linear teacher (argmax of x @ T): data
    that training learns, as tests/util's tu_batches_teacher."""
    r = np.random.default_rng(seed)
    x = r.uniform(-1, 1, (steps * batch, features)).astype(np.float32)
    t = r.uniform(-1, 1, (features, classes))
    return x, np.argmax(x.astype(np.float64) @ t, axis=1).astype(np.int32)


def wait_ready_file(path: Path, proc: subprocess.Popen, deadline_s: float = 15,
                    log=lambda: "") -> dict:
    """The JSON of infeedd's --ready-file once it is written (proc must not exit first)."""
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"infeedd exited with {proc.returncode} before writing "
                                 f"{path}:\n{log()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"infeedd wrote no {path} within {deadline_s} s:\n{log()}")
        time.sleep(0.02)
    return json.loads(path.read_text())


def stream_until_end(endpoint: str, batch_fn, max_batches: int = 100000, timeout: float = 20,
                     name=None, **kw):
    """Sends batch_fn(i) -> dict until the daemon ends the run (RunEnded) or max_batches were
    sent; then END. Returns (producer, batches sent)."""
    p = infeed.Producer(endpoint, name=name, timeout=timeout, **kw)
    sent = 0
    try:
        for i in range(max_batches):
            p.send(batch_fn(i))
            sent += 1
    except infeed.RunEnded:
        pass
    p.end()
    p.close()
    return p, sent


# ---- waiting for an event (never for a fixed time) -----------------------------------------------

def wait_until(cond, what: str, d=None, timeout: float = 20) -> None:
    """Polls cond() until it is true; AssertionError naming what (and d's log) after timeout."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s\n{d.log() if d else ''}")
        time.sleep(0.02)


def status_until(d, pred, timeout: float = 10, what: str = "the status") -> dict:
    """Polls the daemon's control status until pred(status) holds; returns that status."""
    got = {}

    def holds() -> bool:
        got["st"] = d.control({"cmd": "status"})
        return bool(pred(got["st"]))

    wait_until(holds, f"{what} (the last: {got.get('st')})", d, timeout)
    return got["st"]


def wait_log(d, text: str, timeout: float = 10) -> None:
    """Until the daemon's log says text."""
    wait_until(lambda: text in d.log(), f"the log does not say {text!r}", d, timeout)


def subscribed(sub, timeout: float = 10):
    """Until the ZMTP handshake of infeed.Subscriber sub with the daemon succeeded (the event
    its connect watch takes from the socket's monitor): its subscription, queued at connect,
    goes out right after it. Returns sub. (The daemon's status does not count subscribers, so
    this subscriber-side event is the one a test can wait for; PUB drops what it sends before
    the subscription arrives.)"""
    assert sub._watch.timeout is not None, "a Subscriber without connect_timeout has no watch"
    wait_until(lambda: sub._watch.poll(), f"the subscriber's handshake with {sub.endpoint}",
               None, timeout)
    return sub


def tcp_connections(endpoint: str) -> int:
    """Established TCP connections whose local side is endpoint's port (the daemon's side of
    its clients' connections), from /proc/net/tcp and tcp6."""
    want = int(endpoint.rsplit(":", 1)[1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == want:  # ESTABLISHED
                n += 1
    return n


def wait_connected(endpoint: str, n: int = 1, timeout: float = 20) -> None:
    """Until n clients (another process's, such as a subscriber started as a command) are
    connected to the daemon's tcp endpoint."""
    wait_until(lambda: tcp_connections(endpoint) >= n,
               f"{n} connection(s) to {endpoint} ({tcp_connections(endpoint)} now)", None,
               timeout)


# ---- programs of this tree ----------------------------------------------------------------------

def infeedctl_path() -> str:
    """$INFEEDCTL, or tools/infeedctl beside the daemon's build; the test is skipped without."""
    from conftest import infeedd_path

    p = os.environ.get("INFEEDCTL")
    if not p and infeedd_path():
        p = str(Path(infeedd_path()).parent.parent / "tools" / "infeedctl")
    if not p or not os.access(p, os.X_OK):
        pytest.skip("infeedctl is not built (set INFEEDCTL)")
    return p


def ctl(*args, timeout=30):
    return subprocess.run([infeedctl_path(), *args], capture_output=True, text=True,
                          timeout=timeout)


def ctl_endpoints(d) -> list:
    """infeedctl's flags that name daemon d's sockets."""
    return ["--control", d.control_endpoint, "--publish", d.publish]


def c_producer() -> str:
    """The C producer example ($INFEED_C_PRODUCER); the test is skipped without."""
    p = os.environ.get("INFEED_C_PRODUCER") or str(ROOT / "build" / "clients" / "c" /
                                                    "infeed-producer-example")
    if not os.path.isfile(p):
        pytest.skip(f"the C producer example is not built ({p})")
    return p


def run_program(argv, timeout=60):
    """Runs an example to completion with the Python client on its path; prints its output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "clients" / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
    return r


# ---- several hosts (docs/multihost.md) ----------------------------------------------------------

# Under AddressSanitizer, Open MPI's own leaks are suppressed (tests/lsan.supp, with slow unwinding
# and its components kept loaded so that the stacks reach its libraries), as the C tests do
# (tests/CMakeLists.txt); our own leaks still fail the run.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_MCA_mca_base_component_disable_dlclose="1",
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":fast_unwind_on_malloc=0",
               LSAN_OPTIONS=os.environ.get("LSAN_OPTIONS", "") + ":suppressions="
               + str(Path(__file__).resolve().parents[1] / "lsan.supp") + ":fast_unwind_on_malloc=0")


@functools.lru_cache(maxsize=None)
def mpi_skip_reason():
    """Why infeedd cannot run under mpirun here (None: it can); asked once a session."""
    from conftest import infeedd_path

    exe = infeedd_path()
    if exe is None:
        return "infeedd is not built (set INFEEDD)"
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    r = subprocess.run(["mpirun", "-np", "2", exe, "--version"], capture_output=True, text=True,
                       timeout=60, env=MPI_ENV)
    if r.returncode != 0:
        return f"infeedd cannot run under mpirun here: {(r.stderr or r.stdout)[-300:]}"
    return None


# ---- CURVE (docs/protocol.md, "Security"): the runs of the curve_daemon fixture ----------------

CURVE_FEATURES, CURVE_CLASSES, CURVE_BATCH = 8, 3, 16
CURVE_SCHEMA = [("x", "float32", (CURVE_FEATURES,)), ("y", "int32", ())]


def curve_batch(rng, i=0):
    """A learnable batch of the curve_daemon's program (numpy Generator rng)."""
    y = rng.integers(0, CURVE_CLASSES, CURVE_BATCH, dtype=np.int32)
    x = (np.eye(CURVE_CLASSES, CURVE_FEATURES, dtype=np.float32)[y] * 2 +
         0.1 * rng.standard_normal((CURVE_BATCH, CURVE_FEATURES))).astype(np.float32)
    return {"x": x, "y": y}


def curve_producer(d, keys, who, name, timeout=10, **kw):
    """A Producer of the curve_daemon d with the key pair keys[who]."""
    return infeed.Producer(d.listen, name=name, timeout=timeout, schema=CURVE_SCHEMA,
                           server_key=keys["server"], keypair=keys[who], **kw)


class Collector(threading.Thread):
    """Reads a Subscriber in a thread until the end summary (or stop())."""

    def __init__(self, endpoint: str):
        super().__init__(daemon=True)
        self.sub = infeed.Subscriber(endpoint, timeout=0.1)
        self.got: list[dict] = []
        self.error = None
        self._halt = threading.Event()

    def run(self):
        try:
            while not self._halt.is_set() and not self.sub.ended:
                try:
                    self.got.append(self.sub.recv())
                except TimeoutError:
                    pass
        except Exception as e:  # pragma: no cover
            self.error = e
        finally:
            self.sub.close()

    def subscribed(self, timeout: float = 10) -> "Collector":
        """Until its subscriber's handshake succeeded (helpers.subscribed; the reading thread
        takes the monitor's events, this one only looks at the flag)."""
        wait_until(lambda: self.sub._watch.connected or self.error is not None,
                   f"the subscriber's handshake with {self.sub.endpoint}", None, timeout)
        assert self.error is None, self.error
        return self

    def halt_after(self, event: str, timeout: float = 10) -> None:
        """Waits until a summary of this event arrived (AssertionError after timeout), then
        stops reading."""
        deadline = time.monotonic() + timeout
        while not any(s.get("event") == event for s in self.got):
            assert time.monotonic() < deadline, f"no {event} summary reached the subscriber"
            time.sleep(0.1)
        self._halt.set()
        self.join(5)

    def stop(self, timeout: float = 10):
        deadline = time.monotonic() + timeout
        while self.is_alive() and not self.sub.ended and time.monotonic() < deadline:
            time.sleep(0.02)
        self._halt.set()
        self.join(5)
        return self.got


class FakeDataset:
    """Something with as_numpy_iterator, as a tf.data.Dataset has."""

    def __init__(self, items):
        self.items = items

    def as_numpy_iterator(self):
        return iter(self.items)

    def __iter__(self):  # a tf.data.Dataset iterates tensors; the adapter must not use this
        raise AssertionError("iterated as tensors")


# ---- memory and connection bounds (docs/protocol.md, "Memory and connection bounds") ----------

FLOOD_D, FLOOD_K, FLOOD_BATCH = 4, 3, 8  # the softmax runs of the flood and limit tests
MiB = 1 << 20

# docs/protocol.md and host/limits.h
HANDSHAKE_S = 5.0
HOLD_S, HELD = 1.0, 16  # refused ingest connections wait for their answer (host/conns.h)
HELLO_MAX = 64 << 10
ROUTER_RCVHWM, CONTROL_MAXMSG, CONTROL_HWM = 32, 16 << 10, 4
PUB_MAXMSG, PUB_RCVHWM, PUB_SNDHWM, OUTBOX = 1024, 4, 256, 4096
PUB_SUBS_MAX, PUB_RCVBUF, SUB_COST = 8, 4096, 24 << 10  # a subscription costs libzmq's trie
SUMMARY_MAX, CONN_COST, BASE = 4 << 10, 96 << 10, 64 * MiB


def memory_bound(max_producers, credit, conns_ingest, conns_publish, conns_control,
                 batch_rows=FLOOD_BATCH, features=FLOOD_D):
    """docs/protocol.md's formula, for the softmax program (x float32 [features], y int32)."""
    tensors = [batch_rows * features * 4, batch_rows * 4]
    batch_bytes, max_frame = sum(tensors), max(max(tensors), HELLO_MAX)
    replies = (2 * credit + 16) * 3  # queued in libzmq, and twice that in the outbox
    ingest = ROUTER_RCVHWM * (len(tensors) + 2) * max_frame + replies * 512 + CONN_COST
    control = CONTROL_HWM * CONTROL_MAXMSG + CONN_COST
    publish = (PUB_SUBS_MAX + PUB_RCVHWM + (2 * PUB_RCVBUF + 8192) // 1024) * SUB_COST + CONN_COST
    return (BASE + max_producers * credit * 2 * batch_bytes + (conns_ingest + HELD) * ingest
            + conns_control * control + conns_publish * publish
            + (OUTBOX + PUB_SNDHWM) * SUMMARY_MAX)


def sanitized() -> bool:
    """A sanitizer build: its allocator keeps freed memory (quarantine) and glibc's mallinfo2
    does not see it, so heap figures say nothing there."""
    from conftest import infeedd_path

    exe = infeedd_path()
    data = open(exe, "rb").read() if exe else b""
    return b"__asan_init" in data or b"__tsan_init" in data


def vmrss(d) -> int:
    for line in open(f"/proc/{d.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def note_baseline(d) -> None:
    """The daemon's RSS once it is up, before any peer: its libraries' share (a build with the
    cuda backend maps cuBLAS and the CUDA runtime, ~150 MiB) is not heap the formula bounds."""
    d.rss0 = vmrss(d)


def rss(d) -> int:
    """RSS less what the libraries hold beyond the formula's base (the base covers the rest)."""
    return vmrss(d) - max(0, getattr(d, "rss0", 0) - BASE)


def port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def train(d, batches: int, nrng, timeout: float = 20, features: int = FLOOD_D,
          classes: int = FLOOD_K, rows: int = FLOOD_BATCH) -> None:
    """A real producer of softmax batches: every batch is ACKed (the run goes on: END without
    waiting for BYE)."""
    p = infeed.Producer(d.listen, timeout=timeout)
    try:
        for _ in range(batches):
            y = nrng.integers(0, classes, rows, dtype=np.int32)
            p.send(x=nrng.standard_normal((rows, features)).astype(np.float32), y=y)
        p.wait()
        assert p.acked_seq == batches - 1, p.acked_seq
        p.end(wait_bye=False)
    finally:
        p.close()


def train_retry(d, batches: int, nrng, within: float) -> int:
    """train(), again while the daemon is still refusing: a connection beyond the limit is told
    so (EBUSY) until an idle one can make room. Returns the attempts it took."""
    deadline = time.monotonic() + within
    attempt = 0
    while True:
        attempt += 1
        try:
            train(d, batches, nrng, timeout=3)
            return attempt
        except (infeed.InfeedError, TimeoutError) as e:
            assert time.monotonic() < deadline, f"no producer got in within {within} s: {e!r}"
            print(f"attempt {attempt}: {e!r}")
            time.sleep(0.1)
