"""Vanished and silent producers against a real infeedd (--producer-timeout): one killed or
stopped mid-stream is timed out by name and the input ends without it, one silent while holding
credit is timed out and resumes with a HELLO, and one waiting without credit keeps its slot."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from infeed import protocol as P
from rawpeer import RawPeer, batch_frames, hello, xy_schema, xy_tensors

K = 4
B = 4


schema = xy_schema


def good(nrng, d, rows=B):
    return xy_tensors(nrng, rows, d, K)


PRODUCER = r"""
import sys, time, numpy as np, infeed
endpoint, name, d, k, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = np.random.default_rng(5)
with infeed.Producer(endpoint, name=name) as p:
    while True:
        seq = p.send(x=rng.random((b, d), dtype=np.float32), y=rng.integers(0, k, b, dtype=np.int32))
        print(seq, flush=True)
        time.sleep(0.01)  # paces the stream: mid-stream when the signal comes
"""


def spawn_producer(dm, name, d):
    env = dict(os.environ)
    return subprocess.Popen([sys.executable, "-c", PRODUCER, dm.listen, name, str(d), str(K),
                             str(B)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_producer_killed_or_stopped_mid_stream_is_timed_out(daemon, rng, how):
    """The producer is killed (its connection closes) or stopped (its heartbeats stop): after
    producer_timeout it is timed out by name, its accepted batches are trained on, and the
    input ends without it (it was the only producer)."""
    timeout = 1.5
    d = int(rng.randrange(1, 20))
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=3, summary_every=0, producer_timeout=timeout)
    proc = spawn_producer(dm, "doomed", d)
    try:
        for _ in range(int(rng.randrange(5, 30))):  # a few batches ACKed, so it is mid-stream
            line = proc.stdout.readline()
            assert line, "the producer ended early"
        st = dm.control({"cmd": "status"})
        acked = [q for q in st["producers"] if q["name"] == "doomed"][0]["acked_seq"]
        proc.send_signal(getattr(signal, how))
        t0 = time.monotonic()
        rc = dm.wait(timeout=30)
        took = time.monotonic() - t0
        assert rc == 0, dm.log()
        log = dm.log()
        # killed: its connection closes; stopped: it holds credit and says nothing, and its
        # heartbeats stop: either is seen first
        why = "connection gone" if how == "SIGKILL" else "(connection gone|silent with credit)"
        assert re.search(rf"producer 'doomed' timed out \({why} for {timeout:g} s", log), log
        end = dm.end_summary()
        assert end["status"] == "ok" and end["reason"] == "input_ended", end
        # everything acknowledged before the signal was trained on (and what was accepted
        # after it too; a batch still in the producer's socket when it died never arrived)
        assert end["global_step"] >= acked + 1, (acked, end)
        # gone at once (SIGKILL) or after the heartbeat timeout (1 s: half the producer timeout,
        # at least 1 s), then the producer timeout
        assert took < timeout + 1.0 + 5.0, took
        status_free = re.search(r"ended its stream", log) is None
        assert status_free, log  # it never sent END
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait()


def test_a_silent_producer_holding_credit_is_timed_out_then_resumes(daemon, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = 3
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=1, summary_every=0, producer_timeout=0.8, credit=4)
    keeper = RawPeer(dm.listen)  # keeps the input open
    keeper.send(hello(schema(d), name="keeper"))
    keeper.welcome()
    p = RawPeer(dm.listen)
    p.send(hello(schema(d), name="sleepy"))
    p.welcome()
    p.send(batch_frames(0, good(nrng, d)))
    p.ack(0)
    deadline = time.monotonic() + 10
    kseq = 0
    while "producer 'sleepy' timed out (silent with credit" not in dm.log():
        assert time.monotonic() < deadline, dm.log()
        keeper.send(batch_frames(kseq, good(nrng, d)))  # the keeper is not silent
        keeper.ack(kseq)
        kseq += 1
        time.sleep(0.05)  # the keeper's pace while the log is polled
    assert "producer 'keeper' timed out" not in dm.log(), dm.log()
    st = dm.control({"cmd": "status"})
    sleepy = [q for q in st["producers"] if q["name"] == "sleepy"][0]
    assert sleepy["ended"] and sleepy["credit"] == 0, sleepy
    # its next batch is refused with the reason, a HELLO resumes it where it was
    p.send(batch_frames(1, good(nrng, d)))
    e = p.error()
    assert e["code"] == "ECLOSED" and "timed out" in e["message"], e
    p.send(hello(schema(d), name="sleepy"))
    assert p.welcome()["next_seq"] == 1
    p.send(batch_frames(1, good(nrng, d)))
    p.ack(1)
    for q in (p, keeper):
        q.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    assert dm.end_summary()["global_step"] == 2 + kseq
    p.close()
    keeper.close()


def test_a_producer_waiting_without_credit_is_not_timed_out(daemon, rng):
    """Silence is the daemon's doing when the producer has no credit: it keeps its slot."""
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = 3
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=1, summary_every=0, producer_timeout=0.5, credit=2,
                initial_infeed_sleep=2.5)
    p = RawPeer(dm.listen)
    p.send(hello(schema(d), name="patient"))
    p.welcome()
    p.send(batch_frames(0, good(nrng, d)))
    p.send(batch_frames(1, good(nrng, d)))
    # four producer timeouts with no credit (the infeed sleeps, nothing is ACKed): time passing
    # is what is tested
    time.sleep(2.0)
    assert "timed out" not in dm.log(), dm.log()
    p.ack(1, timeout=10)
    p.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    p.close()
