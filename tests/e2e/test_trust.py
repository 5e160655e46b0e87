"""A sloppy or hostile peer against a real infeedd (issue 10's findings): bad float values are
rejected at ingest, END with extra frames and negative seqs are answered exactly, a live
producer's name cannot be taken over, vanished and silent producers are reclaimed, and names are
escaped in the log."""

import re

import numpy as np
import pytest

from infeed import protocol as P
from rawpeer import RawPeer, batch_frames, hello

K = 4
B = 4
NAMES_PER_CONN = 8  # new names a connection may start (host/limits.h, IFD_NAMES_PER_CONN)


def schema(d):
    return [P.schema_entry("x", "float32", [d]), P.schema_entry("y", "int32", [])]


def good(nrng, d, rows=B):
    return [nrng.random((rows, d), dtype=np.float32), nrng.integers(0, K, rows, dtype=np.int32)]


def test_non_finite_inputs_are_rejected_and_the_run_goes_on(daemon, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = int(nrng.integers(1, 40))
    dm = daemon(replicas=2, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=5, summary_every=1, credit=4, max_abs_input=1e6)
    p = RawPeer(dm.listen)
    p.send(hello(schema(d), name="loader"))
    p.welcome()
    seq = 0
    trained = 0
    for trial in range(12):
        x, y = good(nrng, d)
        row, col = int(nrng.integers(0, B)), int(nrng.integers(0, d))
        value, word = [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf"),
                       (np.float32(3e38), "3e+38"), (np.float32(-2e6), "-2e+06")][trial % 5]
        x[row, col] = value
        p.send(batch_frames(seq, [x, y]))
        e = p.error()
        assert e["code"] == "ERANGE" and e["seq"] == seq and e["credit"] == 1, e
        want = f"tensor 'x' row {row} element {col}"
        assert want in e["message"] and word in e["message"], (want, word, e)
        if trial == 0:
            assert f"rejected (IFD_ERANGE): batch {seq} from producer 'loader': {want}" \
                in dm.log(), dm.log()
        # the next good batch is accepted and trained on
        x[row, col] = 0.5
        p.send(batch_frames(seq, [x, y]))
        p.ack(seq)
        seq += 1
        trained += 1
    p.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    end = dm.end_summary()
    assert (end["status"], end["global_step"]) == ("ok", trained), end
    losses = [s["loss"] for s in dm.summaries() if s["event"] == "train"]
    assert losses and all(np.isfinite(losses)), losses
    p.close()


def test_check_finite_off_lets_nan_through_and_the_model_diverges(daemon, rng):
    """The documented behaviour of a diverging model: a NaN loss skips its step, and
    --max-skipped-steps of them in a row (here 1) end the run with ENUMERIC."""
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = int(nrng.integers(1, 20))
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=100,
                iterations_per_loop=1, summary_every=1, check_finite="off", max_skipped_steps=1)
    p = RawPeer(dm.listen)
    p.send(hello(schema(d), name="loader"))
    p.welcome()
    x, y = good(nrng, d)
    x[int(nrng.integers(0, B)), int(nrng.integers(0, d))] = np.nan
    p.send(batch_frames(0, [x, y]))
    p.until(lambda: p.byes, "BYE")
    assert p.byes[0]["status"] == "error", p.byes
    assert dm.wait() == 1, dm.log()
    end = dm.end_summary()
    assert end["status"] == "error" and end["code"] == "IFD_ENUMERIC", end
    assert "diverged" in end["error"], end
    p.close()


def test_end_with_extra_frames_and_negative_seq(daemon, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = 3
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=5, summary_every=0, credit=4)
    p = RawPeer(dm.listen)
    keeper = RawPeer(dm.listen)
    keeper.send(hello(schema(d), name="keeper"))
    keeper.welcome()
    p.send(hello(schema(d), name="loader"))
    p.welcome()
    extra = int(nrng.integers(1, 4))
    p.send(P.end_frames() + [b"x"] * extra)
    e = p.error()
    assert e["code"] == "EPROTO" and e["seq"] is None, e
    assert f"END: expected 1 frame (header), got {1 + extra}" in e["message"], e
    # the stream did not end: a batch is still accepted
    p.send(batch_frames(0, good(nrng, d)))
    p.ack(0)
    neg = -int(nrng.integers(1, 1 << 40))
    p.send(batch_frames(neg, good(nrng, d)))
    e = p.error()
    assert e["code"] == "EINVAL" and e["seq"] == neg and e["credit"] == 1, e
    assert str(neg) in e["message"], e
    p.send(P.end_frames())
    keeper.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    p.close()
    keeper.close()


# ---- producer names: no takeover while the owner lives ------------------------------------------

def test_a_live_producers_name_cannot_be_taken(daemon, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = int(nrng.integers(1, 10))
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=2, summary_every=0, credit=4)
    victim = RawPeer(dm.listen)
    victim.send(hello(schema(d), name="victim"))
    victim.welcome()
    n = int(nrng.integers(2, 5))  # within its credit of 4
    for s in range(n):
        victim.send(batch_frames(s, good(nrng, d)))
    victim.ack(n - 1)
    thief = RawPeer(dm.listen)
    for attempt in range(3):  # with and without first_seq, again and again
        thief.send(hello(schema(d), name="victim", first_seq=attempt * 100))
        e = thief.error()
        assert e["code"] == "EBUSY" and e["seq"] is None, e
        assert "'victim'" in e["message"] and "in use" in e["message"], e
    # the victim lost nothing: its credit and stream go on
    for s in range(n, n + 4):
        victim.send(batch_frames(s, good(nrng, d)))
    victim.ack(n + 3)
    assert not victim.errors and not victim.other, (victim.errors, victim.other)
    assert re.search(r"rejected \(IFD_EBUSY\): HELLO: name 'victim' is in use", dm.log()), dm.log()
    # once the owner's connection is closed, the name passes on (a restarted producer)
    victim.close()
    # (libzmq drops the closed connection's route a moment after the close: EBUSY until then)
    deadline = __import__("time").monotonic() + 5
    while True:
        thief.send(hello(schema(d), name="victim"))
        thief.until(lambda: thief.welcomes or thief.errors, "WELCOME")
        if thief.welcomes:
            break
        e = thief.errors.pop()
        assert e["code"] == "EBUSY" and __import__("time").monotonic() < deadline, e
        __import__("time").sleep(0.02)
    w = thief.welcomes[-1]
    assert w["next_seq"] == n + 4, w
    thief.send(batch_frames(n + 4, good(nrng, d)))
    thief.ack(n + 4)
    thief.send(P.end_frames())
    thief.until(lambda: thief.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    assert dm.end_summary()["global_step"] == n + 5
    thief.close()


def test_peers_that_hello_and_vanish_do_not_fill_the_table(daemon, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = 2
    m = int(nrng.integers(2, 7))
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=2, summary_every=0, max_producers=m)
    keeper = RawPeer(dm.listen)
    keeper.send(hello(schema(d), name="keeper"))
    keeper.welcome()
    # HELLO, then gone without END; the next peer is connected before the close, so that its
    # HELLO follows the close at once (a slot frees only once libzmq drops the closed route)
    nxt = RawPeer(dm.listen)
    for k in range(3 * m):
        v = nxt
        v.send(hello(schema(d), name=f"ghost-{k}"))
        v.welcome()
        nxt = RawPeer(dm.listen)
        __import__("time").sleep(0.02)
        v.close()
    real = nxt
    real.send(hello(schema(d), name="real"))
    real.welcome()
    real.send(batch_frames(0, good(nrng, d)))
    real.ack(0)
    assert "gives its slot to a new producer" in dm.log(), dm.log()
    # a live producer's slot is never taken: with every slot live, a newcomer is refused
    live = [RawPeer(dm.listen) for _ in range(m - 2)]
    for i, p in enumerate(live):
        p.send(hello(schema(d), name=f"live-{i}"))
        p.welcome()
    extra = RawPeer(dm.listen)
    extra.send(hello(schema(d), name="extra"))
    e = extra.error()
    assert e["code"] == "EINVAL" and "max_producers" in e["message"], e
    for p in [keeper, real] + live:
        p.send(P.end_frames())
    keeper.until(lambda: keeper.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    for p in [keeper, real, extra] + live:
        p.close()


def test_a_full_table_takes_a_producer_as_soon_as_closed_ones_are_gone(daemon, rng):
    """Every slot held by connections that close all at once, and a new producer's HELLO right
    after: it is welcomed (it waits for libzmq to drop the closed routes), not refused as one
    too many."""
    d = 2
    m = rng.randint(2, 6)
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=2, summary_every=0, max_producers=m)
    for trial in range(rng.randint(3, 6)):
        holders = [RawPeer(dm.listen) for _ in range(m)]
        for i, p in enumerate(holders):
            p.send(hello(schema(d), name=f"holder-{trial}-{i}"))
            p.welcome()
        newcomer = RawPeer(dm.listen)  # connected before the closes
        __import__("time").sleep(0.02)
        for p in holders:
            p.close()
        newcomer.send(hello(schema(d), name=f"newcomer-{trial}"))
        newcomer.welcome()  # asserts no ERROR (too many producers) came instead
        newcomer.close()
    assert "too many producers" not in dm.log(), dm.log()


# ---- vanished producers are timed out -----------------------------------------------------------

PRODUCER = r"""
import sys, time, numpy as np, infeed
endpoint, name, d, k, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = np.random.default_rng(5)
with infeed.Producer(endpoint, name=name) as p:
    while True:
        seq = p.send(x=rng.random((b, d), dtype=np.float32), y=rng.integers(0, k, b, dtype=np.int32))
        print(seq, flush=True)
        time.sleep(0.01)
"""


def spawn_producer(dm, name, d):
    import os
    import subprocess
    import sys
    env = dict(os.environ)
    return subprocess.Popen([sys.executable, "-c", PRODUCER, dm.listen, name, str(d), str(K),
                             str(B)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_producer_killed_or_stopped_mid_stream_is_timed_out(daemon, rng, how):
    """The producer is killed (its connection closes) or stopped (its heartbeats stop): after
    producer_timeout it is timed out by name, its accepted batches are trained on, and the
    input ends without it (it was the only producer)."""
    import signal
    import time
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
    import time
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
        time.sleep(0.05)
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
    import time
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
    time.sleep(2.0)  # four producer timeouts with no credit: the infeed sleeps, nothing is ACKed
    assert "timed out" not in dm.log(), dm.log()
    p.ack(1, timeout=10)
    p.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    p.close()


# ---- the log ------------------------------------------------------------------------------------

def test_names_are_escaped_and_hello_lines_rate_limited(daemon, rng):
    d = 2
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=1000000,
                iterations_per_loop=2, summary_every=0, max_producers=4)
    p = RawPeer(dm.listen)
    p.send(hello(schema(d), name="evil\ninfeed error [forged] line\\"))
    p.welcome()
    # a rejected batch is logged at info with the (escaped) name; a flood of them is rate-limited
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    nbad = 200
    for s in range(nbad):
        p.send(batch_frames(s, good(nrng, d, rows=B + 1)))
    p.until(lambda: len(p.errors) >= nbad, "the ERRORs", timeout=20)
    rejected = re.findall(r"rejected \(IFD_ESHAPE\): batch \d+ from producer "
                          r"'evil\\x0ainfeed error \[forged\] line\\x5c': rows", dm.log())
    assert 1 <= len(rejected) < nbad // 2, len(rejected)
    n = 300
    for k in range(n):  # one connection renaming itself: a HELLO line each, unthrottled before
        p.send(hello(schema(d), name=f"n{k % (NAMES_PER_CONN - 1)}"))  # and "evil...": 8
    p.until(lambda: len(p.welcomes) > n, "the WELCOMEs", timeout=20)
    log = dm.log()
    assert "evil\\x0ainfeed error [forged] line\\x5c" in log, log
    assert not any(line.startswith("infeed error [forged]") for line in log.splitlines()), log
    connected = len(re.findall(r"producer 'n\d+' connected", log))
    assert connected < n // 2, f"{connected} HELLO lines for {n} HELLOs"
    assert "similar lines suppressed" in log or connected < 25, log
    p.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    p.close()


def test_names_ever_seen_are_bounded(daemon, rng):
    """Connections that rename themselves for every batch fill the position table (every name
    with a consumed batch must stay for checkpoints): a connection may start at most 8 new names
    (the next is refused with a sentence, a known one is welcomed), and past 4 x max_producers
    names, at least 1024, a new name is refused with a sentence; known names still work."""
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = 1
    dm = daemon(replicas=1, batch_size=1, features=d, classes=K, steps=1000000,
                iterations_per_loop=1, summary_every=0, max_producers=2, credit=8,
                log_level="warn")
    cap = 1024
    x = nrng.random((1, d), dtype=np.float32)
    y = np.zeros(1, dtype=np.int32)
    keeper = RawPeer(dm.listen)  # holds the input open while the others END
    keeper.send(hello(schema(d), name="keeper"))
    keeper.welcome()
    p = None
    for k in range(cap - 1):  # each name's batch consumed before the next name
        if k % NAMES_PER_CONN == 0:
            if p is not None:
                p.send(hello(schema(d), name=f"over-{k}"))  # a ninth new name
                e = p.error()
                assert e["code"] == "EINVAL" and f"at most {NAMES_PER_CONN} a connection" in \
                    e["message"], e
                p.send(hello(schema(d), name=f"r{k - rng.randint(1, NAMES_PER_CONN)}"))
                p.welcome()  # a name it started is welcomed again
                p.send(P.end_frames())  # so that it does not hold the input open
                p.close()
            p = RawPeer(dm.listen)
        p.send(hello(schema(d), name=f"r{k}"))
        p.send(batch_frames(0, [x, y]))
        p.until(lambda: len(p.acks) + len(p.errors) > k % NAMES_PER_CONN,
                f"the ACK of r{k}'s batch")
        assert not p.errors, p.errors[:3]
    p.send(P.end_frames())
    p.close()
    p = RawPeer(dm.listen)
    p.send(hello(schema(d), name="one-too-many"))
    e = p.error()
    assert e["code"] == "EINVAL" and "too many producer names" in e["message"], e
    assert str(cap) in e["message"], e
    p.send(hello(schema(d), name="r7"))  # a known name is welcomed
    assert p.welcome()["next_seq"] == 1
    for q in (p, keeper):
        q.send(P.end_frames())
    p.until(lambda: p.byes, "BYE", timeout=20)
    assert dm.wait() == 0, dm.log()
    p.close()
    keeper.close()
