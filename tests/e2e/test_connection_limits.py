"""Connection limits (issue 19, items 4, 6 and 7): a connection over --max-connections is told so
(ERROR EBUSY naming the flag) instead of waiting for a reply that dies with it; a new connection
takes the place of an idle one (ingest: no producer on it for 5 s; summaries: no subscription;
control: the oldest), so idle connections cannot lock producers or control clients out; a
subscriber may hold at most 8 subscriptions; --max-connections is checked and logged with the
memory bound it gives."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import zmq

import infeed
from conftest import run_infeedd
from helpers import (FLOOD_BATCH as BATCH, FLOOD_D as D, FLOOD_K as K, HANDSHAKE_S, Collector,
                     memory_bound, note_baseline, port, rss, sanitized, train, train_retry,
                     wait_log)
from zmtp import RawZmtp, frame

SUBS_MAX = 8  # host/limits.h, IFD_PUB_SUBS_MAX


def idle_peers(endpoint: str, kind: str, n: int) -> list[RawZmtp]:
    """n connections that finish the ZMTP handshake as kind and then say nothing."""
    host, p = "127.0.0.1", port(endpoint)
    return [RawZmtp(host, p, kind) for _ in range(n)]


def test_refused_connection_is_told_why(daemon, rng):
    """With every allowed connection taken by a producer, one more producer's HELLO is answered
    with ERROR EBUSY naming --max-connections within its timeout (today it waited for a reply
    that died with its connection, or was welcomed and then cut off); once a producer leaves,
    a new one gets in."""
    n = rng.randint(2, 4)  # the input stays open once one of them ended (expect_producers)
    d = daemon(features=D, classes=K, batch_size=BATCH, steps=100000, credit=4, max_producers=n,
               max_connections=n, expect_producers=n)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    producers = [infeed.Producer(d.listen, name=f"p{i}", timeout=10) for i in range(n)]
    for p in producers:
        p.hello()
    t0 = time.monotonic()
    with pytest.raises(infeed.InfeedError) as e:
        infeed.Producer(d.listen, name="one-more", timeout=10).hello()
    took = time.monotonic() - t0
    assert not isinstance(e.value, TimeoutError), e.value
    assert e.value.code == "EBUSY" and "--max-connections" in str(e.value), e.value
    assert f"limit of {n} connections" in str(e.value), e.value
    print(f"{n} producers: the next was told in {took:.2f} s: {e.value}")
    wait_log(d, "each was told so in an ERROR")
    producers[0].end(wait_bye=False)
    producers[0].close()
    train_retry(d, rng.randint(1, 5), nrng, within=10)  # its place is free again
    for p in producers[1:]:
        p.close()


def test_idle_connections_make_room_for_producers(daemon, rng):
    """Connections that finished the handshake and say nothing (no producer on them) take every
    place, answering heartbeats (so they stay); after 5 s a new producer takes the place of the
    oldest of them (before, none got in while they stayed), and a producer's own connection is
    never the one closed."""
    limit = rng.randint(3, 8)
    d = daemon(features=D, classes=K, batch_size=BATCH, steps=100000, credit=4, max_producers=2,
               max_connections=limit, expect_producers=2)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    keeper = infeed.Producer(d.listen, name="keeper", timeout=10)
    keeper.hello()
    # libzmq DEALERs: they answer the daemon's heartbeats (a raw peer is closed after 10 s) and
    # connect again when closed
    idle = [zmq.Context.instance().socket(zmq.DEALER) for _ in range(limit - 1)]
    for s in idle:
        s.setsockopt(zmq.LINGER, 0)
        s.connect(d.listen)
    t0 = time.monotonic()
    attempts = train_retry(d, rng.randint(1, 5), nrng, within=2 * HANDSHAKE_S + 5)
    took = time.monotonic() - t0
    print(f"limit {limit}: a producer got in after {took:.1f} s ({attempts} attempts)")
    wait_log(d, "idle connection")
    assert "(no producer on it) closed to make room" in d.log(), d.log()
    x = nrng.standard_normal((BATCH, D)).astype(np.float32)
    keeper.send(x=x, y=np.zeros(BATCH, np.int32))  # its connection is still there
    keeper.wait()
    assert keeper.acked_seq == 0
    keeper.end(wait_bye=False)
    keeper.close()
    for s in idle:
        s.close(0)


def test_control_always_answers(daemon, rng):
    """Idle connections on every place of a tcp control socket: a new one takes the place of the
    oldest, so status is answered at once (it waited for one of them to leave)."""
    limit = rng.randint(2, 8)
    d = daemon(features=D, classes=K, batch_size=BATCH, steps=100000, max_producers=2,
               max_connections=limit)
    idle = idle_peers(d.control_endpoint, "REQ", limit + rng.randint(0, 3))
    for _ in range(rng.randint(2, 5)):
        st = d.control({"cmd": "status"}, timeout=3)
        assert st["ok"], st
    wait_log(d, "control: ")
    assert "(the oldest) closed to make room" in d.log(), d.log()
    assert sum(p.closed(0.5) for p in idle) >= 1
    for p in idle:
        p.close()


def test_subscriptions_are_bounded(daemon, rng):
    """A subscriber may hold 8 subscriptions (a reader needs one); one that makes more is
    closed, which drops them all. Thousands of distinct 1 KiB subscriptions from a few
    connections (each costs libzmq ~48 KiB) leave RSS under the bound, and a reader with 8 keeps
    receiving the summaries."""
    d = daemon(features=D, classes=K, batch_size=BATCH, steps=100000, iterations_per_loop=2,
               summary_every=1, credit=8, max_producers=2, expect_producers=2)
    note_baseline(d)
    host, pp = "127.0.0.1", port(d.publish)
    col = Collector(d.publish)
    col.start()
    eight = RawZmtp(host, pp, "SUB")
    eight.send(b"".join(frame(b"\x01" + b"{" + bytes([65 + i])) for i in range(SUBS_MAX - 1)) +
               frame(b"\x01"))  # 7 prefixes nothing matches, and everything
    floods = [RawZmtp(host, pp, "SUB") for _ in range(rng.randint(2, 5))]
    per = rng.randint(2000, 6000)
    for i, f in enumerate(floods):
        try:
            for k in range(0, per, 100):
                f.send(b"".join(frame(b"\x01%d-%d-" % (i, j) + os.urandom(1000))
                                for j in range(k, k + 100)))
        except OSError:
            pass  # closed by the daemon
    for f in floods:
        assert f.closed(10.0), "a subscriber over the subscription limit stays connected"
    wait_log(d, f"a subscriber made more than {SUBS_MAX} subscriptions")
    train(d, rng.randint(20, 60), np.random.default_rng(rng.randrange(1 << 30)))
    got = b""
    eight.sock.settimeout(5)
    while b'"event":"train"' not in got:  # the summaries reach the subscriber with 8
        chunk = eight.sock.recv(65536)
        assert chunk, "a subscriber with 8 subscriptions was closed"
        got += chunk
    bound = memory_bound(2, 8, 1, 2 + len(floods), 2)
    print(f"{len(floods)} floods of {per} subscriptions: RSS {rss(d) >> 20} MiB, bound "
          f"{bound >> 20} MiB")
    assert sanitized() or rss(d) < bound, f"RSS {rss(d) >> 20} MiB, bound {bound >> 20} MiB"
    col.halt_after("train")
    for p in (eight, *floods):
        p.close()


def test_max_connections_config(daemon, rng):
    """--max-connections below --max-producers or above 65536 is refused with a sentence; 0
    (auto) is twice max_producers, at least 256; the daemon logs the limit and its bound."""
    base = ["--steps", "1", "--features", "4", "--classes", "3"]
    producers = rng.randint(2, 1000)  # 3 x 2000 connections fit the descriptors
    for bad in (rng.randint(1, producers - 1), rng.randint(65537, 1 << 30), -rng.randint(1, 9)):
        r = run_infeedd(*base, "--max-producers", str(producers), "--max-connections", str(bad))
        assert r.returncode == 2, r.stderr
        assert f"--max-connections: expected 0 (auto) or --max-producers ({producers}) to 65536, " \
               f"got {bad}" in r.stderr, r.stderr
    d = daemon(features=D, classes=K, batch_size=BATCH, steps=100000, credit=8,
               max_producers=producers, max_connections=0)
    note_baseline(d)
    want = max(256, 2 * producers)
    bound = memory_bound(producers, 8, want, want, want)
    wait_log(d, f"at most {want} connections a socket; memory bound {bound >> 20} MiB")
