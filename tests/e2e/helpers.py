"""Shared helpers of the e2e tests: data, streaming until the daemon has had enough."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

import infeed


def steps_data(seed: int, steps: int, batch: int, features: int, classes: int):
    """Random (x float32, y int32) of steps x batch rows, the same for the same seed."""
    r = np.random.default_rng(seed)
    return (r.standard_normal((steps * batch, features)).astype(np.float32),
            r.integers(0, classes, steps * batch, dtype=np.int32))


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
