"""Producer names against a real infeedd (docs/protocol.md, HELLO): a live producer's name cannot
be taken over, peers that HELLO and vanish or close all at once give their slots back, names are
escaped in the log and HELLO lines rate-limited, and the names a daemon keeps are bounded."""

import re
import time

import numpy as np

from infeed import protocol as P
from rawpeer import RawPeer, batch_frames, hello, xy_schema, xy_tensors

K = 4
B = 4
NAMES_PER_CONN = 8  # new names a connection may start (host/limits.h, IFD_NAMES_PER_CONN)


schema = xy_schema


def good(nrng, d, rows=B):
    return xy_tensors(nrng, rows, d, K)


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
    deadline = time.monotonic() + 5
    while True:
        thief.send(hello(schema(d), name="victim"))
        thief.until(lambda: thief.welcomes or thief.errors, "WELCOME")
        if thief.welcomes:
            break
        e = thief.errors.pop()
        assert e["code"] == "EBUSY" and time.monotonic() < deadline, e
        time.sleep(0.02)  # polls: the route is dropped a moment after the close
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
    nxt = RawPeer(dm.listen, handshake=True).connected()
    for k in range(3 * m):
        v = nxt
        v.send(hello(schema(d), name=f"ghost-{k}"))
        v.welcome()
        nxt = RawPeer(dm.listen, handshake=True).connected()
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
        newcomer = RawPeer(dm.listen, handshake=True).connected()  # before the closes
        for p in holders:
            p.close()
        newcomer.send(hello(schema(d), name=f"newcomer-{trial}"))
        newcomer.welcome()  # asserts no ERROR (too many producers) came instead
        newcomer.close()
    assert "too many producers" not in dm.log(), dm.log()


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
