"""Ending a run from outside (SIGTERM, a second signal, the control socket) and subscribers that
cannot keep up."""

import signal
import threading
import time

import numpy as np
import zmq

import infeed
from conftest import ROOT
from helpers import Collector, status_until, wait_connected

D, K, B = 4, 3, 4


class Streamer(threading.Thread):
    """Streams batches until the daemon ends the run."""

    def __init__(self, endpoint, seed, sleep=0.0):
        super().__init__(daemon=True)
        self.endpoint, self.seed, self.sleep = endpoint, seed, sleep
        self.sent = 0
        self.bye = None
        self.error = None
        self.ended = threading.Event()

    def run(self):
        nrng = np.random.default_rng(self.seed)
        try:
            p = infeed.Producer(self.endpoint, name="streamer", timeout=20)
            try:
                while True:
                    p.send(x=nrng.random((B, D), dtype=np.float32),
                           y=nrng.integers(0, K, B, dtype=np.int32))
                    self.sent += 1
                    if self.sleep:  # a slow producer on purpose
                        time.sleep(self.sleep)
            except infeed.RunEnded as e:
                self.bye = e.bye or p.end()
            p.close()
        except BaseException as e:  # noqa: BLE001
            self.error = e
        finally:
            self.ended.set()


def wait_steps(d, n, timeout=15):
    return status_until(d, lambda st: st.get("global_step", 0) >= n, timeout, f"global step {n}")


def test_sigterm_stops_gracefully(daemon, rng):
    d = daemon(replicas=2, batch_size=B, features=D, classes=K, steps=10 ** 9,
               iterations_per_loop=rng.randint(1, 50), summary_every=20)
    s = Streamer(d.listen, rng.randrange(1 << 30))
    s.start()
    wait_steps(d, 30)
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait(10) == 0, d.log()
    assert time.monotonic() - t0 < 5
    end = d.end_summary()
    assert (end["status"], end["reason"]) == ("ok", "stopped"), end
    assert end["global_step"] >= 30
    assert s.ended.wait(10) and s.error is None, s.error
    assert s.bye is not None and s.bye["reason"] == "stopped", s.bye
    assert s.bye["global_step"] == end["global_step"]


def test_second_signal_aborts(daemon, rng):
    d = daemon(replicas=2, batch_size=B, features=D, classes=K, steps=10 ** 9,
               iterations_per_loop=1000, summary_every=0)
    s = Streamer(d.listen, rng.randrange(1 << 30), sleep=0.001)
    s.start()
    wait_steps(d, 5)
    t0 = time.monotonic()
    # two different signals back to back cannot merge into one pending signal
    d.signal(signal.SIGTERM)
    d.signal(signal.SIGINT)
    rc = d.wait(10)
    assert rc == 1, f"a second signal should abort (exit 1), got {rc}:\n{d.log()}"
    assert time.monotonic() - t0 < 5
    # the end event as docs/config.md says it, its source as docs/summaries.md lists it
    end = d.end_summary()
    assert (end["status"], end["code"]) == ("error", "IFD_ECANCELED"), end
    assert end["error"].startswith("abort: "), end
    assert "`code: IFD_ECANCELED`" in (ROOT / "docs" / "config.md").read_text()
    assert "`abort`" in (ROOT / "docs" / "summaries.md").read_text()


def test_control_status_and_stop(daemon, rng):
    d = daemon(replicas=2, batch_size=B, features=D, classes=K, steps=10 ** 9,
               iterations_per_loop=rng.randint(1, 20), summary_every=0)
    st = d.control({"cmd": "status"})
    assert st.get("global_step") == 0, st
    s = Streamer(d.listen, rng.randrange(1 << 30))
    s.start()
    st = wait_steps(d, 20)
    print("status:", st)
    assert isinstance(st["global_step"], int) and st["global_step"] >= 20
    for key in ("producers", "loop"):
        assert key in st, f"status lacks {key!r}: {st}"
    bad = d.control({"cmd": "dance"})
    assert bad.get("ok") is False and "dance" in bad.get("error", ""), bad
    bad = d.control(b"not json")
    assert bad.get("ok") is False and bad.get("error"), bad
    assert d.control({"cmd": "stop"}) == {"ok": True}
    assert d.wait(10) == 0, d.log()
    end = d.end_summary()
    assert (end["status"], end["reason"]) == ("ok", "stopped"), end
    assert s.ended.wait(10) and s.error is None, s.error
    assert s.bye is not None and s.bye["reason"] == "stopped"


def run_many_summaries(d, steps):
    nrng = np.random.default_rng(1)
    x = nrng.random((1, 2), dtype=np.float32)
    y = np.zeros(1, np.int32)
    t0 = time.monotonic()
    p = infeed.Producer(d.listen, timeout=20)
    try:
        while True:
            p.send(x=x, y=y)
    except infeed.RunEnded:
        pass
    p.end()
    p.close()
    assert d.wait(30) == 0, d.log()
    assert d.end_summary()["global_step"] == steps
    return time.monotonic() - t0


def test_no_subscriber_never_blocks(daemon):
    steps = 5000
    d = daemon(replicas=1, batch_size=1, features=2, classes=2, steps=steps,
               iterations_per_loop=100, summary_every=1, credit=64)
    took = run_many_summaries(d, steps)
    print(f"{steps} steps, a summary each, no subscriber: {took:.2f} s")
    assert took < 30
    assert len(d.summaries()) == steps + 1


def test_stuck_subscriber_never_blocks(daemon):
    steps = 20000  # ~7 MB of summaries: more than the socket buffers of a reader that stalls
    d = daemon(replicas=1, batch_size=1, features=2, classes=2, steps=steps,
               iterations_per_loop=100, summary_every=1, credit=64)
    ctx = zmq.Context.instance()
    stuck = ctx.socket(zmq.SUB)  # connects, subscribes, never reads
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.RCVBUF, 4096)
    stuck.setsockopt(zmq.LINGER, 0)
    stuck.setsockopt(zmq.SUBSCRIBE, b"")
    stuck.connect(d.publish)
    col = Collector(d.publish)  # and one that reads
    col.start()
    col.subscribed()
    wait_connected(d.publish, 2)  # the stuck one too
    took = run_many_summaries(d, steps)
    print(f"{steps} steps, a summary each, a stuck subscriber: {took:.2f} s")
    assert len(d.summaries()) == steps + 1
    assert took < 30
    got = col.stop()
    assert got, "the reading subscriber got nothing"
    stuck.close(0)
