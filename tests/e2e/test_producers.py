"""Several producers at once: every accepted batch is consumed exactly once (one ACK each, the
global step counts them all) and each producer's batches keep their order."""

import threading
import time

import numpy as np

import infeed
from infeed import protocol as P
from helpers import status_until
from rawpeer import RawPeer, batch_frames, hello

D, K = 4, 3


def test_three_producers(daemon, rng):
    replicas = rng.choice([1, 2, 3])
    batch = replicas * rng.randint(1, 4)
    ipl = rng.randint(1, 20)
    credit = rng.randint(1, 8)
    counts = [rng.randint(5, 40) for _ in range(3)]
    first = [rng.choice([0, rng.randint(1, 10000)]) for _ in range(3)]
    print(f"replicas {replicas} batch {batch} ipl {ipl} credit {credit} counts {counts} "
          f"first {first}")
    d = daemon(replicas=replicas, batch_size=batch, features=D, classes=K, steps=100000,
               iterations_per_loop=ipl, credit=credit, summary_every=7, expect_producers=3)
    total = sum(counts)
    acks = [[] for _ in range(3)]
    byes = [None] * 3
    errors = []
    seeds = [rng.randrange(1 << 30) for _ in range(3)]

    def produce(i):
        try:
            nrng = np.random.default_rng(seeds[i])
            with infeed.Producer(d.listen, name=f"producer-{i}", first_seq=first[i], timeout=20,
                                 on_ack=acks[i].append) as p:
                for k in range(counts[i]):
                    seq = first[i] + k
                    x = nrng.random((batch, D), dtype=np.float32)
                    x[:, 0], x[:, 1], x[:, 2] = i, seq, np.arange(batch)  # who and which
                    y = np.full(batch, i % K, np.int32)
                    assert p.send(x=x, y=y) == seq
                    assert p.credit >= 0
                    if nrng.random() < 0.2:  # producers at different paces, on purpose
                        time.sleep(float(nrng.random()) * 0.01)
            byes[i] = p.bye
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert d.wait() == 0, d.log()
    for i in range(3):
        want = list(range(first[i], first[i] + counts[i]))
        assert acks[i] == want, f"producer {i}: ACKs {acks[i]}, sent {want}"
        assert byes[i] is not None, f"producer {i}: no BYE"
        assert byes[i]["status"] == "ok" and byes[i]["reason"] == "input_ended", byes[i]
        assert byes[i]["global_step"] == total and byes[i]["acked_seq"] == want[-1], byes[i]
    summ = d.summaries()
    end = summ[-1]
    assert end["event"] == "end" and end["status"] == "ok", end
    assert end["reason"] == "input_ended" and end["global_step"] == total, end
    assert "input ended" in end.get("message", ""), end
    train = [s for s in summ if s["event"] == "train"]
    assert sum(s["examples"] for s in train) == total * batch
    assert train[-1]["global_step"] == total


def test_reconnect_same_name(daemon, rng):
    """A producer that comes back under its name gets next_seq after what was accepted, and a
    resent batch that was already consumed is ACKed again without being trained on twice."""
    d = daemon(replicas=1, batch_size=2, features=D, classes=K, steps=100000,
               iterations_per_loop=3, summary_every=0)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    schema = [P.schema_entry("x", "float32", [D]), P.schema_entry("y", "int32", [])]

    def b(seq):
        return batch_frames(seq, [nrng.random((2, D), dtype=np.float32),
                                  nrng.integers(0, K, 2, dtype=np.int32)])

    a = RawPeer(d.listen)
    a.send(hello(schema, name="again", first_seq=10))
    assert a.welcome()["next_seq"] == 10
    for s in (10, 11, 12):
        a.send(b(s))
    a.ack(12)
    a.close()  # gone without END
    a2 = RawPeer(d.listen)
    a2.send(hello(schema, name="again"))
    assert a2.welcome()["next_seq"] == 13
    a2.send(b(12))  # the duplicate of a consumed batch
    a2.until(lambda: 12 in a2.acks or a2.errors, "the duplicate's ACK")
    assert not a2.errors, a2.errors
    a2.send(b(13))
    a2.ack(13)
    status = d.control({"cmd": "status"})
    assert isinstance(status.get("global_step"), int) and status["global_step"] <= 4, status
    a2.send(P.end_frames())
    a2.until(lambda: a2.byes, "BYE", timeout=10)
    assert a2.byes[0]["global_step"] == 4 and a2.byes[0]["acked_seq"] == 13, a2.byes
    assert d.wait() == 0, d.log()
    a2.close()


def test_immediate_reconnects_are_welcomed(daemon, rng):
    """A producer that closes and at once reconnects under its name is welcomed, not refused
    EBUSY: its HELLO waits (at most a second) for the old connection's route to go. Repeated
    many times in a row, since the race is between the close and the new HELLO."""
    d = daemon(replicas=1, batch_size=2, features=D, classes=K, steps=100000,
               iterations_per_loop=rng.randint(1, 4), summary_every=0)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    schema = [P.schema_entry("x", "float32", [D]), P.schema_entry("y", "int32", [])]
    rounds = rng.randint(15, 30)
    seq = rng.randint(0, 1000)
    peer = RawPeer(d.listen)
    peer.send(hello(schema, name="bouncer", first_seq=seq))
    assert peer.welcome()["next_seq"] == seq
    for r in range(rounds):
        n = rng.randint(0, 3)
        for s in range(seq, seq + n):
            peer.send(batch_frames(s, [nrng.random((2, D), dtype=np.float32),
                                       nrng.integers(0, K, 2, dtype=np.int32)]))
        if n:
            peer.ack(seq + n - 1)
        seq += n
        # connected before the close, so its HELLO follows it at once
        nxt = RawPeer(d.listen, handshake=True).connected()
        peer.close()
        peer = nxt
        peer.send(hello(schema, name="bouncer"))
        w = peer.welcome()  # asserts no ERROR (EBUSY) came instead
        assert w["next_seq"] == seq, (r, w, seq)
    assert "IFD_EBUSY" not in d.log(), d.log()
    peer.close()


def test_expect_producers_keeps_the_input_open(daemon, rng):
    """Without --expect-producers the input ends when every producer welcomed so far has sent
    END; with --expect-producers 2, a first producer's END leaves it open for a second one that
    connects later, and the input ends only with the second END."""
    schema = [P.schema_entry("x", "float32", [D]), P.schema_entry("y", "int32", [])]
    nrng = np.random.default_rng(rng.randrange(1 << 30))

    def b(seq):
        return batch_frames(seq, [nrng.random((2, D), dtype=np.float32),
                                  nrng.integers(0, K, 2, dtype=np.int32)])

    for expect in (0, 2):
        d = daemon(replicas=1, batch_size=2, features=D, classes=K, steps=100000,
                   iterations_per_loop=1, summary_every=0, expect_producers=expect)
        a = RawPeer(d.listen)
        a.send(hello(schema, name="first"))
        a.welcome()
        n = rng.randint(1, 5)
        for s in range(n):
            a.send(b(s))
        a.ack(n - 1)
        a.send(P.end_frames())
        if expect == 0:
            a.until(lambda: a.byes, "BYE", timeout=10)
            assert a.byes[0]["reason"] == "input_ended" and a.byes[0]["global_step"] == n
            assert d.wait() == 0, d.log()
            a.close()
            continue
        status = status_until(d, lambda st: any(q["name"] == "first" and q["ended"]
                                                 for q in st["producers"]), what="its END handled")
        assert not status["input_closed"], status
        c = RawPeer(d.listen)
        c.send(hello(schema, name="second"))
        c.welcome()
        c.send(b(0))
        c.ack(0)
        assert not d.control({"cmd": "status"})["input_closed"]
        c.send(P.end_frames())
        c.until(lambda: c.byes, "BYE", timeout=10)
        assert c.byes[0]["reason"] == "input_ended" and c.byes[0]["global_step"] == n + 1, c.byes
        assert d.wait() == 0, d.log()
        a.close()
        c.close()


def test_bye_reaches_ended_producers_whose_slots_were_reused(daemon, rng):
    """Producers that sent END and wait for their BYE give their slots to newcomers once
    --max-producers are taken (one producer keeps streaming, so the input stays open); each
    still gets its BYE when the run ends (its end() returned only on a timeout before)."""
    schema = [P.schema_entry("x", "float32", [D]), P.schema_entry("y", "int32", [])]
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    slots = rng.randint(2, 3)
    d = daemon(replicas=1, batch_size=2, features=D, classes=K, steps=100000,
               iterations_per_loop=rng.randint(1, 3), summary_every=0, max_producers=slots)

    def b(seq):
        return batch_frames(seq, [nrng.random((2, D), dtype=np.float32),
                                  nrng.integers(0, K, 2, dtype=np.int32)])

    def stream(p, n):
        for s in range(n):
            p.send(b(s))
        p.ack(n - 1)
        p.send(P.end_frames())  # and it stays connected, waiting for its BYE

    keeper = RawPeer(d.listen)
    keeper.send(hello(schema, name="keeper"))
    keeper.welcome()
    peers, counts = [], []
    for i in range(rng.randint(slots, 2 * slots + 2)):
        p = RawPeer(d.listen)
        p.send(hello(schema, name=f"p{i}"))
        p.welcome()  # the slot of an ended producer once all are taken
        counts.append(rng.randint(1, 4))
        stream(p, counts[-1])
        peers.append(p)
        # the next HELLO may take this slot once it ended
        status_until(d, lambda st: any(q["name"] == f"p{i}" and q["ended"]
                                       for q in st["producers"]), what="the END handled")
    peers.append(keeper)
    counts.append(rng.randint(1, 4))
    stream(keeper, counts[-1])
    for i, p in enumerate(peers):
        p.until(lambda: p.byes, f"producer {i}'s BYE", timeout=20)
        bye = p.byes[0]
        assert bye["reason"] == "input_ended" and bye["acked_seq"] == counts[i] - 1, (i, bye)
        assert bye["global_step"] == sum(counts), (i, bye)
    assert d.wait() == 0, d.log()
    for p in peers:
        p.close()
