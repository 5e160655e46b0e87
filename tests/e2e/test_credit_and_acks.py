"""Credit is never lost (issue 19, item 2): a reply that carries state (ACK, CREDIT, WELCOME,
BYE, PREDICTION) waits for a producer that does not read its socket instead of being dropped
when the daemon's queue to it is full, and liveness probes, which any connection can cause, are
rate-limited per producer. The producers here stop reading with a socket that holds one message
and a small kernel buffer (an ipc endpoint), so that their queues fill after a few thousand
replies."""

from __future__ import annotations

import time

import numpy as np

from infeed import protocol as P
from rawpeer import RawPeer, batch_frames, hello, xy_tensors
from helpers import sanitized, status_until

D, K = 4, 3


def batch(nrng, seq: int, rows: int):
    return batch_frames(seq, xy_tensors(nrng, rows, D, K))


def wait_consumed(d, name: str, accepted: int, timeout: float = 20) -> dict:
    """Until status says the producer's batches were all accepted and consumed."""
    def mine(st):
        return next((p for p in st["producers"] if p["name"] == name), None)

    st = status_until(d, lambda st: (mine(st) or {}).get("accepted") == accepted and
                      mine(st)["in_flight"] == 0, timeout, f"producer {name}")
    return mine(st)


def flood_hellos(f: RawPeer, name: str, count: int) -> None:
    """From producer f: count HELLOs naming another, live producer (each waits for the name and
    is replaced by the next, or is answered EBUSY, and changes nothing for f: each is one more
    liveness probe of the name's owner), then a HELLO under f's own name, whose WELCOME (a reply
    the daemon never drops; its EBUSY answers it may) says that every HELLO before it was
    handled."""
    h = hello(None, name=name)
    welcomes = len(f.welcomes)
    for _ in range(count):
        f.send(h)
        while f.sock.poll(0):  # its own answers (EBUSY)
            f._recv(0)
    f.send(hello(None, name=f.welcomes[-1]["name"]))
    f.until(lambda: len(f.welcomes) > welcomes, "the WELCOME after the flood", timeout=120)


def test_probe_flood_keeps_credit(daemon, rng, tmp_path):
    """A producer stops reading while other connections make the daemon probe it tens of
    thousands of times (HELLOs naming it, HELLOs parked for its name, HELLOs with new names
    while the producer table is full); its batches are consumed meanwhile. Once it reads again
    every credit comes back (today's daemon dropped the ACK behind a queue full of probes), it
    finishes its stream and the run ends with all of it trained on."""
    credit, rows = rng.randint(1, 4), rng.randint(1, 3)
    d = daemon(listen=f"ipc://{tmp_path}/in", features=D, classes=K, batch_size=rows,
               steps=100000, iterations_per_loop=rng.randint(1, 4), credit=credit,
               max_producers=3, expect_producers=3, summary_every=0)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    victim = RawPeer(d.listen, slow_reader=True)
    victim.send(hello(None, name="victim"))
    assert victim.welcome()["credit"] == credit
    other, flooder = RawPeer(d.listen), RawPeer(d.listen)
    for peer, name in ((other, "other"), (flooder, "flooder")):
        peer.send(hello(None, name=name))
        peer.welcome()  # the table is full once both are welcomed (max_producers 3)
    t0 = time.monotonic()
    parked = [RawPeer(d.listen) for _ in range(8)]
    for p in parked:  # each waits (up to 1 s) for the name, its owner probed again and again
        p.send(hello(None, name="victim"))
    # new names from another connection while the table is full: every slot search probes the
    # live producers. They are queued before the flood below, so they are handled before its
    # last HELLO.
    newcomer = RawPeer(d.listen)
    for i in range(rng.randint(200, 500)):
        newcomer.send(hello(None, name=f"new-{i}"))
        while newcomer.sock.poll(0):
            newcomer._recv(0)
    # enough to fill the queue many times over on main (a few thousand over ipc); a sanitizer
    # build handles HELLOs tens of times slower
    hellos = rng.randint(4000, 8000) if sanitized() else rng.randint(20000, 40000)
    flood_hellos(flooder, "victim", hellos)
    for p in parked:
        p.until(lambda: p.errors, "EBUSY for the parked HELLO", timeout=30)
        assert p.errors[0]["code"] == P.EBUSY, p.errors
    for s in range(credit):
        victim.send(batch(nrng, s, rows))
    wait_consumed(d, "victim", credit)
    took = time.monotonic() - t0
    victim.until(lambda: victim.credit_returned() >= credit, "every credit back", timeout=10)
    print(f"credit {credit}: {hellos} HELLOs naming the victim in {took:.2f} s; it read "
          f"{victim.probes} probes")
    assert victim.credit_returned() == credit and sorted(victim.acks) == list(range(credit))
    # a probe at most every 5 ms (backing off while it stays silent), not one a HELLO
    assert victim.probes <= 2 + took * 200, f"{victim.probes} probes in {took:.2f} s"
    for s in range(credit, 2 * credit):
        victim.send(batch(nrng, s, rows))
    victim.ack(2 * credit - 1)
    for peer in (victim, other, flooder):
        peer.send(P.end_frames())
    victim.until(lambda: victim.byes, "BYE", timeout=20)
    assert victim.byes[0]["acked_seq"] == 2 * credit - 1, victim.byes
    assert d.wait() == 0, d.log()
    end = d.end_summary()
    assert end["reason"] == "input_ended" and end["global_step"] == 2 * credit, end
    for p in (victim, other, flooder, newcomer, *parked):
        p.close()


def test_replies_wait_for_a_producer_that_does_not_read(daemon, rng, tmp_path):
    """A producer that does not read resends a consumed batch thousands of times (each is
    answered by an ACK returning its credit) and then sends its credit's worth of new batches.
    Its queue fills; the replies wait in order, ACKs joined into one, and reach it once it
    reads: every credit, and in predict mode each batch's PREDICTION before the ACK that covers
    it."""
    mode = rng.choice(["train", "predict"])
    credit, rows = rng.randint(2, 6), rng.randint(1, 4)
    flags = dict(steps=100000) if mode == "train" else {}
    d = daemon(listen=f"ipc://{tmp_path}/in", mode=mode, features=D, classes=K, batch_size=rows,
               iterations_per_loop=1, credit=credit, summary_every=0, **flags)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    p = RawPeer(d.listen, slow_reader=True)
    p.send(hello(None, name="reader"))
    p.welcome()
    first = batch(nrng, 0, rows) if mode == "train" else batch_frames(
        0, [nrng.random((rows, D), dtype=np.float32)])
    p.send(first)
    p.ack(0)
    dups = rng.randint(3000, 6000) if sanitized() else rng.randint(5000, 15000)
    for _ in range(dups):
        p.send(first)
    for s in range(1, credit + 1):
        p.send(batch(nrng, s, rows) if mode == "train" else
               batch_frames(s, [nrng.random((rows, D), dtype=np.float32)]))
    wait_consumed(d, "reader", credit + 1)
    want = 1 + dups + credit
    p.until(lambda: p.credit_returned() >= want, f"{want} credits", timeout=30)
    assert p.credit_returned() == want, (p.credit_returned(), want)
    acks = [seq for t, seq, _ in p.received if t == P.ACK]
    assert max(acks) == credit, acks[-5:]
    print(f"{mode}: {dups} duplicates, {len(acks)} ACK messages carried {want} credits")
    if mode == "predict":
        preds = [(i, m.seq) for i, m in enumerate(p.other) if m.type == P.PREDICTION]
        assert sorted(s for _, s in preds) == list(range(credit + 1)), preds
        order = [(t, seq) for t, seq, _ in p.received if t in (P.ACK, P.PREDICTION)]
        for s in range(credit + 1):
            pred_at = order.index((P.PREDICTION, s))
            ack_at = next(i for i, (t, seq) in enumerate(order) if t == P.ACK and seq >= s)
            assert pred_at < ack_at, f"batch {s}: its ACK came before its PREDICTION: {order}"
    p.send(P.end_frames())
    p.until(lambda: p.byes, "BYE", timeout=20)
    assert p.byes[0]["acked_seq"] == credit, p.byes
    assert d.wait() == 0, d.log()
    p.close()
