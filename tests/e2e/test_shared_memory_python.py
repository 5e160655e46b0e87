"""The shared-memory transport (docs/protocol.md, "Shared memory"), the Python client's side.

Against a fake daemon (no infeedd needed): the pool's bytes are the batches sent, slots are
taken in a row from a cursor and freed by ACK and ERROR, a pool that cannot be used falls back
to the socket in auto mode (one warning, HELLO again without shm) and raises ShmError with
shm=True, close() unmaps it. Against infeedd: shm and socket runs of the same data train the
same bits (tcp loopback and ipc, steps of several batches, buffer()/commit() writing into the
slots), --shm off, hostile descriptors from a raw peer, labels rewritten in flight, the sealed
memfd, and predict mode."""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest

import infeed
from infeed import protocol as P
from infeed import shm as S
from fake_daemon import SOFTMAX_SCHEMA, FakeDaemon, make_pool, read_slot
from helpers import status_until, steps_data
from rawpeer import RawPeer, hello, shm_frames, xy_schema

D, K = 5, 3
SCHEMA = xy_schema(D)


# -- the client alone (a fake daemon) ------------------------------------------------------------


@pytest.mark.parametrize("endpoint,local", [
    ("ipc:///tmp/infeed.sock", True), ("tcp://127.0.0.1:5555", True),
    ("tcp://127.8.9.10:1", True), ("tcp://localhost:5555", True), ("tcp://LocalHost:5", True),
    ("tcp://[::1]:5555", True), ("tcp://10.0.0.1:5555", False), ("tcp://[::2]:5555", False),
    ("tcp://example.com:5555", False), ("tcp://128.0.0.1:5555", False),
    ("tcp://10.1.1.1:0;127.0.0.1:5555", True), ("inproc://x", False),
    ("ws://127.0.0.1:5555", False)])
def test_which_endpoints_are_local(endpoint, local):
    assert S.is_local(endpoint) is local


def test_find_takes_the_first_free_run_when_the_cursor_has_none(rng):
    """Slots freed out of order (ERRORs, dropped buffers): find() at the cursor when its k slots
    are free, else the first run of k free slots, else None; against a plain scan."""
    for _ in range(500):
        n = rng.randint(1, 40)
        pool = S.Pool.__new__(S.Pool)
        pool.slots, pool.cursor = n, rng.randint(0, n - 1)
        pool.owner = np.array([S.FREE if rng.random() < 0.6 else rng.randint(-1, 99)
                               for _ in range(n)], dtype=np.int64)
        k = rng.randint(1, n)
        free = [o == S.FREE for o in pool.owner]
        at = pool.cursor if pool.cursor + k <= n else 0
        if all(free[at:at + k]):
            want = at
        else:
            want = next((i for i in range(n - k + 1) if all(free[i:i + k])), None)
        assert pool.find(k) == want, (list(pool.owner), pool.cursor, k)


def test_slots_in_a_row_are_found_whenever_there_is_credit(rng):
    """The spec's sizing, slots = credit + max_steps - 1, with messages of random steps and ACKs
    of random prefixes: k slots in a row are free whenever k credits are (at the cursor, or at 0),
    and never a slot in flight."""
    for _ in range(200):
        credit = rng.randint(1, 12)
        most = rng.randint(1, credit)
        pool = S.Pool.__new__(S.Pool)
        pool.slots, pool.cursor = credit + most - 1, 0
        pool.owner = np.full(pool.slots, S.FREE, dtype=np.int64)
        pool.inflight, pool.reserved = {}, None
        have, seq, acked, busy = credit, 0, -1, {}  # busy: slot -> seq, kept by the test
        for _ in range(rng.randint(1, 200)):
            k = rng.randint(1, most)
            if have >= k:
                s = pool.find(k)
                assert s is not None, (credit, most, k, pool.owner, pool.cursor)
                # the spec's rule alone finds them: at the cursor, or at 0 when fewer than k
                # are left before the end
                assert s == (pool.cursor if pool.cursor + k <= pool.slots else 0)
                assert not any(j in busy for j in range(s, s + k)), (s, k, busy)
                pool.take(s, k, seq)
                busy.update({s + j: seq + j for j in range(k)})
                seq += k
                have -= k
            if seq - 1 > acked and rng.random() < 0.6:
                acked += rng.randint(1, seq - 1 - acked)
                pool.ack(acked)
                for j, q in list(busy.items()):
                    if q <= acked:
                        del busy[j]
                have = credit - len(busy)
            assert {j: int(o) for j, o in enumerate(pool.owner) if o != S.FREE} == busy


def pooled(slots=None, tamper=None, refused=None):
    """A fake daemon's shm knob: a pool of `slots` (the credit by default), optionally
    tampered with (desc, pool), or none with the sentence `refused`."""
    def make(fake):
        def give(hello_body):
            if refused is not None:
                return None, refused
            pool = make_pool(fake.schema, fake.batch_size, slots or fake.credit)
            if tamper is not None:
                tamper(pool)
            return pool, None
        return give
    return make


def fake(credit=4, batch_size=8, **kw):
    shm = kw.pop("shm", None)
    d = FakeDaemon(credit=credit, batch_size=batch_size, **kw)
    if shm is not None:
        d.shm = shm(d)
    return d


def test_batches_are_written_into_the_slots(rng):
    credit, bs = rng.randint(1, 6), rng.randint(1, 9)
    r = np.random.default_rng(rng.randrange(1 << 30))
    with fake(credit=credit, batch_size=bs, shm=pooled(),
              ack_delay=rng.choice([0, 0.002])) as d:
        p = infeed.Producer(d.endpoint, name="p", timeout=5)
        sent = []
        for _ in range(rng.randint(1, 40)):
            x = r.standard_normal((bs, 4)).astype(np.float32)
            y = r.integers(0, 3, bs, dtype=np.int32)
            p.send(x=x, y=y)
            sent.append((x.copy(), y))
            x[:] = np.nan  # the caller's arrays are free at once: they were copied
        assert p.transport == "shm" and p.shm_refused is None
        assert d.hellos[0]["shm"] is True
        p.wait()
        assert [b[0] for b in d.batches] == list(range(len(sent)))
        for (x, y), (_, rows, frames) in zip(sent, d.batches):
            assert rows == bs and frames == [x.tobytes(), y.tobytes()]
        # one slot a batch, in a row from slot 0, round the pool
        assert [s for _, _, s in d.shm_batches] == [i % credit for i in range(len(sent))]
        p.end()
        p.close()


def test_buffer_hands_out_the_slots_themselves(rng):
    credit, bs = rng.randint(2, 5), rng.randint(1, 6)
    with fake(credit=credit, batch_size=bs, shm=pooled()) as d:
        p = infeed.Producer(d.endpoint, name="p", schema=SOFTMAX_SCHEMA, timeout=5)
        for i in range(3 * credit):
            a = p.buffer()
            a["x"][:] = i
            a["y"][:] = i % 3
            slot = i % credit
            # written where the daemon reads, before commit(): no copy
            assert read_slot(d.pools[0], slot, bs) == [a["x"].tobytes(), a["y"].tobytes()]
            assert p.commit() == i
        p.wait()
        assert [s for _, _, s in d.shm_batches] == [i % credit for i in range(3 * credit)]
        a = p.buffer()
        assert p.commit(rows=0) is None and p.next_seq == 3 * credit  # dropped: slot free
        assert p.buffer()["x"].shape == (bs, 4)
        p.close()


def test_error_frees_the_slots_of_the_refused_batch():
    bad = {2}
    with fake(credit=2, batch_size=4, shm=pooled(),
              reject=lambda seq, frames: ("ERANGE", "no") if seq in bad else None) as d:
        p = infeed.Producer(d.endpoint, name="p", timeout=5)
        x, y = np.ones((4, 4), np.float32), np.zeros(4, np.int32)
        p.send(x=x, y=y)
        p.send(x=x, y=y)
        p.send(x=x, y=y)  # seq 2: refused
        with pytest.raises(infeed.InfeedError, match="ERANGE"):
            p.wait()
        p.send(x=x, y=y)
        p.wait()
        assert (p._shm.owner == S.FREE).all() and not p._shm.inflight
        p.close()


@pytest.mark.parametrize("what", ["token", "magic", "size", "path", "step_bytes", "offsets"])
def test_auto_falls_back_to_the_socket_when_the_pool_cannot_be_used(what, rng):
    def tamper(pool):
        desc = pool["desc"]
        if what == "token":
            desc["token"] = os.urandom(16).hex()
        elif what == "magic":
            pool["mm"][:8] = b"IFDSHM2\0"
        elif what == "size":
            desc["size"] += 64
        elif what == "path":
            desc["path"] = "/proc/self/fd/999999"
        elif what == "step_bytes":
            desc["step_bytes"][1] += 4
        else:
            desc["offsets"][0] = 65
    bs = rng.randint(1, 8)
    with fake(batch_size=bs, shm=pooled(tamper=tamper)) as d:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            p = infeed.Producer(d.endpoint, name="p", schema=SOFTMAX_SCHEMA, timeout=5)
        assert len(got) == 1 and "over the socket" in str(got[0].message), \
            [str(w.message) for w in got]
        why = {"path": "cannot open the pool"}.get(what, what)
        assert why in str(got[0].message), str(got[0].message)
        # HELLO again without shm, so the daemon drops the pool; batches go as BATCH
        assert [h.get("shm") for h in d.hellos] == [True, None]
        assert p.transport == "socket" and p.shm_refused
        x, y = np.ones((bs, 4), np.float32), np.zeros(bs, np.int32)
        p.send(x=x, y=y)
        p.wait()
        assert not d.shm_batches and d.batches[0][2][0] == x.tobytes()
        # and does not ask again
        p.hello()
        assert "shm" not in d.hellos[-1]
        p.close()


def test_shm_true_raises_when_there_is_no_pool():
    with fake(shm=pooled(refused="--shm off: this daemon gives no pools")) as d:
        with pytest.raises(infeed.ShmError, match="shm_refused: --shm off: this daemon") as e:
            infeed.Producer(d.endpoint, name="p", schema=SOFTMAX_SCHEMA, timeout=5, shm=True)
        assert e.value.code == "ESHM"
        # auto: the socket, saying why
        p = infeed.Producer(d.endpoint, name="q", schema=SOFTMAX_SCHEMA, timeout=5)
        assert p.transport == "socket" and "--shm off" in p.shm_refused
        p.close()
    with fake(shm=pooled(tamper=lambda pool: pool["desc"].update(token="00" * 16))) as d:
        with pytest.raises(infeed.ShmError, match="token differs"):
            infeed.Producer(d.endpoint, name="p", schema=SOFTMAX_SCHEMA, timeout=5, shm=True)
    with fake() as d:  # a daemon that says nothing of shm: no pool, no reason
        with pytest.raises(infeed.ShmError, match="no shared-memory pool"):
            infeed.Producer(d.endpoint, name="p", schema=SOFTMAX_SCHEMA, timeout=5, shm=True)


def test_shm_false_never_asks():
    with fake(shm=pooled()) as d:
        p = infeed.Producer(d.endpoint, name="p", schema=SOFTMAX_SCHEMA, timeout=5, shm=False)
        assert "shm" not in d.hellos[0] and p.transport == "socket" and p.shm_refused is None
        p.close()
    with pytest.raises(ValueError, match="shm: expected"):
        infeed.Producer("tcp://127.0.0.1:1", shm="yes")


def mappings(name: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(name in line for line in f)


def test_close_and_hello_unmap_the_pool(rng):
    with fake(shm=pooled()) as d:
        def ours():  # the client's mappings of the fake's pools (the fake maps each once)
            return mappings("fake-infeedd-pool") - len(d.pools)
        p = infeed.Producer(d.endpoint, name="p", schema=SOFTMAX_SCHEMA, timeout=5)
        assert ours() == 1
        p.send(x=np.ones((8, 4), np.float32), y=np.zeros(8, np.int32))
        p.hello()  # a new pool replaces the old one, which is unmapped
        assert ours() == 1 and len(d.pools) == 2
        assert p._shm.path == d.pools[1]["desc"]["path"]
        p.wait()
        p.end()
        p.close()
        assert ours() == 0


# -- against infeedd ------------------------------------------------------------------------------


def split(rng, n: int, most: int) -> list[int]:
    out = []
    while n:
        out.append(rng.randint(1, min(most, n)))
        n -= out[-1]
    return out


def run(daemon, flags, x, y, batch, sizes, listen=None, use_buffer=False, rehello=None, **kw):
    """Trains on x, y in messages of `sizes` steps; `rehello`: HELLO again before that message
    (a new pool, the old one's steps still in flight). Returns (losses, transport)."""
    d = daemon(**flags, **({"listen": listen} if listen else {}))
    schema = [P.schema_entry("x", "float32", x.shape[1:]), P.schema_entry("y", "int32", [])]
    p = infeed.Producer(d.listen, name="loader", schema=schema, timeout=20, **kw)
    row = 0
    for i, k in enumerate(sizes):
        if i == rehello:
            token = p._shm.token
            p.hello()
            assert p.transport == "shm" and p._shm.token != token
        if use_buffer:
            a = p.buffer(k)
            if p.transport == "shm":
                assert np.shares_memory(a["x"], p._shm.views[0])
            a["x"][:] = x[row:row + k * batch]
            a["y"][:] = y[row:row + k * batch]
            p.commit()
        else:
            p.send(x=x[row:row + k * batch], y=y[row:row + k * batch])
        row += k * batch
    transport = p.transport
    p.end()
    p.close()
    assert d.wait() == 0, d.log()
    return [s["loss"] for s in d.summaries() if s["event"] == "train"], transport


def test_shm_trains_the_same_bits_as_the_socket(daemon, tmp_path, rng):
    replicas = rng.choice([1, 2])
    batch = replicas * rng.randint(1, 6)
    most = rng.randint(1, 5)
    n = rng.randint(15, 50)
    feats = rng.randint(1, 9)
    flags = dict(replicas=replicas, batch_size=batch, features=feats, classes=K, steps=n,
                 iterations_per_loop=rng.randint(1, 6), summary_every=1, seed=rng.randint(1, 999),
                 max_steps_per_message=most, credit=rng.choice([0, most, most + 3]))
    x, y = steps_data(rng.randrange(1 << 30), n, batch, feats, K)
    sizes = split(rng, n, most)
    print(f"replicas {replicas} batch {batch} features {feats} max {most} messages {sizes}")
    want, t = run(daemon, flags, x, y, batch, sizes, shm=False)
    assert t == "socket" and len(want) == n
    got, t = run(daemon, flags, x, y, batch, sizes, shm=True,
                 rehello=rng.randrange(1, len(sizes)) if len(sizes) > 1 else None)
    assert t == "shm" and got == want  # the same bits
    got, t = run(daemon, flags, x, y, batch, sizes, listen=f"ipc://{tmp_path}/ifd.sock")
    assert t == "shm" and got == want
    got, t = run(daemon, flags, x, y, batch, split(rng, n, most), use_buffer=True)
    assert t == "shm" and got == want


def test_auto_uses_the_socket_when_the_daemon_gives_no_pool(daemon, rng):
    batch = rng.randint(1, 6)
    d = daemon(replicas=1, batch_size=batch, features=D, classes=K, steps=4, summary_every=1,
               shm="off")
    with pytest.raises(infeed.ShmError, match="shm_refused: .*shm") as e:
        infeed.Producer(d.listen, name="strict", schema=SCHEMA, timeout=20, shm=True)
    print(e.value)
    p = infeed.Producer(d.listen, name="loader", schema=SCHEMA, timeout=20)
    assert p.transport == "socket" and p.shm_refused, p.welcome
    assert p.welcome.get("shm") is None and p.welcome.get("shm_refused")
    x, y = steps_data(rng.randrange(1 << 30), 4, batch, D, K)
    for i in range(4):
        p.send(x=x[i * batch:(i + 1) * batch], y=y[i * batch:(i + 1) * batch])
    p.end()
    p.close()
    assert d.wait() == 0, d.log()


def shm_peer(d, schema=SCHEMA, name="raw"):
    """A raw DEALER welcomed with a pool, mapped: (peer, WELCOME, Pool)."""
    peer = RawPeer(d.listen)
    peer.send(hello(schema, name=name, shm=True))
    w = peer.welcome()
    assert w.get("shm"), w
    return peer, w, S.Pool(w["shm"], schema, w["batch_size"])


def test_hostile_descriptors_are_refused_and_the_daemon_trains_on(daemon, rng):
    batch, most = rng.randint(1, 5), rng.randint(1, 4)
    credit = most + rng.randint(2, 5)
    n = rng.randint(3, credit)
    d = daemon(replicas=1, batch_size=batch, features=D, classes=K, steps=n, summary_every=1,
               credit=credit, max_steps_per_message=most, initial_infeed_sleep=1)
    # BATCH_SHM from a producer without a pool
    peer = RawPeer(d.listen)
    peer.send(hello(SCHEMA, name="nopool"))
    w = peer.welcome()
    assert w.get("shm") is None and "shm_refused" not in w, w
    peer.send(shm_frames(0, batch, 0))
    e = peer.error()
    assert e["code"] == "EPROTO" and e["seq"] == 0 and e["credit"] == 1, e
    print(e["message"])
    peer.close()

    peer, w, pool = shm_peer(d)
    slots = w["shm"]["slots"]
    assert slots == credit + most - 1, w["shm"]
    x, y = steps_data(rng.randrange(1 << 30), n, batch, D, K)
    pool.views[0][:n * batch] = x
    pool.views[1][:n * batch] = y
    bad = [(shm_frames(0, batch, slots), "EINVAL", "slot"),  # out of range
           (shm_frames(0, batch, 0, flags=1), "EINVAL", "flags"),
           (shm_frames(0, batch * (most + 1), 0), "ESHAPE", "rows")]
    if most > 1:
        bad.append((shm_frames(0, 2 * batch, slots - 1), "EINVAL", "slot"))
    if batch > 1:
        bad.append((shm_frames(0, batch - 1, 0), "ESHAPE", "rows"))
    for frames, code, word in rng.sample(bad, len(bad)):
        peer.send(frames)
        e = peer.error()
        print(e["message"])
        assert e["code"] == code and e["seq"] == 0 and e["credit"] >= 1, (frames, e)
        assert word in e["message"], e
    # a good one at slot 0, then another one naming slot 0 while it is in flight (the daemon
    # sleeps before its first step)
    peer.send(shm_frames(0, batch, 0))
    peer.send(shm_frames(1, batch, 0))
    e = peer.error()
    print(e["message"])
    assert e["code"] == "EINVAL" and e["seq"] == 1 and "slot 0" in e["message"], e
    for i in range(1, n):  # the rest, one slot each: trained
        peer.send(shm_frames(i, batch, i))
    peer.until(lambda: len(peer.acks) == n, f"{n} ACKs", timeout=20)
    peer.send([P.pack_header(P.END)])
    peer.until(lambda: peer.byes, "BYE", timeout=20)
    peer.close()
    pool.close()
    assert d.wait() == 0, d.log()
    losses = [s["loss"] for s in d.summaries() if s["event"] == "train"]
    assert len(losses) == n and all(math.isfinite(v) for v in losses), losses


def test_labels_rewritten_in_flight_do_not_reach_the_model(daemon, rng):
    """The daemon copies int tensors out of the slot when it accepts a batch: labels overwritten
    with values out of [0, classes) afterwards (while the batches wait in the queue) change
    nothing, the run trains the same bits as one whose labels were left alone."""
    batch, n = rng.randint(1, 6), rng.randint(4, 12)
    flags = dict(replicas=1, batch_size=batch, features=D, classes=K, steps=n, summary_every=1,
                 credit=n, seed=rng.randint(1, 999), iterations_per_loop=rng.randint(1, 4))
    x, y = steps_data(rng.randrange(1 << 30), n, batch, D, K)
    want, _ = run(daemon, flags, x, y, batch, [1] * n, shm=False)

    d = daemon(**flags, initial_infeed_sleep=1)
    p = infeed.Producer(d.listen, name="loader", schema=SCHEMA, timeout=20, shm=True)
    for i in range(n):
        p.send(x=x[i * batch:(i + 1) * batch], y=y[i * batch:(i + 1) * batch])
    assert len(p._shm.inflight) == n
    # accepted (the daemon sleeps 1 s before its first step): no ERROR
    status_until(d, lambda st: st["batches_accepted"] == n, what=f"{n} batches accepted")
    p.poll()
    assert p.unacked == list(range(n))
    r = np.random.default_rng(rng.randrange(1 << 30))
    labels = p._shm.views[1]
    labels[:] = r.choice([-1, K, 1 << 30, -(1 << 31), 2**31 - 1], labels.shape)
    p.end()
    p.close()
    assert d.wait() == 0, d.log()
    got = [s["loss"] for s in d.summaries() if s["event"] == "train"]
    assert got == want


def test_the_pool_cannot_be_shrunk_and_its_path_closes(daemon, rng):
    batch = rng.randint(1, 6)
    d = daemon(replicas=1, batch_size=batch, features=D, classes=K, steps=3, summary_every=1)
    p = infeed.Producer(d.listen, name="loader", schema=SCHEMA, timeout=20, shm=True)
    q = infeed.Producer(d.listen, name="other", schema=SCHEMA, timeout=20, shm=False)
    shm = {e["name"]: e.get("shm") for e in d.control({"cmd": "status"})["producers"]}
    assert shm == {"loader": True, "other": False}, shm
    q.end(wait_bye=False)
    q.close()
    desc = p.welcome["shm"]
    fd = os.open(desc["path"], os.O_RDWR)
    try:
        for size in (0, desc["size"] - 1, desc["size"] // 2):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
        assert os.fstat(fd).st_size == desc["size"]
    finally:
        os.close(fd)
    x, y = steps_data(rng.randrange(1 << 30), 3, batch, D, K)
    p.send(x=x[:batch], y=y[:batch])
    p.wait()
    # the daemon closed its descriptor at the first BATCH_SHM: nobody else can open the pool
    with pytest.raises(FileNotFoundError):
        os.open(desc["path"], os.O_RDWR)
    for i in (1, 2):
        p.send(x=x[i * batch:(i + 1) * batch], y=y[i * batch:(i + 1) * batch])
    p.end()
    p.close()
    assert d.wait() == 0, d.log()


def test_predict_over_shm_gives_the_socket_predictions(daemon, tmp_path, rng):
    replicas = rng.randint(1, 3)
    batch = replicas * rng.randint(1, 8)
    rows = rng.randint(1, 6 * batch)
    x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal((rows, D)).astype(
        np.float32)
    out = {}
    for shm in (False, True):
        d = daemon(mode="predict", program="softmax", replicas=replicas, batch_size=batch,
                   features=D, classes=K, steps=0, seed=7)
        with infeed.Producer(d.listen, name="p", timeout=20, shm=shm) as p:
            for i in range(0, rows, batch):
                if shm and i // batch % 2:  # buffer()/commit(rows) too
                    a = p.buffer()
                    n = min(batch, rows - i)
                    a["x"][:n] = x[i:i + n]
                    p.commit(rows=n)
                else:
                    p.send(x=x[i:i + batch])
            assert p.transport == ("shm" if shm else "socket")
            out[shm] = list(p.predictions())
            # more rows than a slot holds: refused by the daemon as over the socket
            p.send(x=np.zeros((batch + 1, D), np.float32))
            with pytest.raises(infeed.InfeedError, match="ESHAPE"):
                p.wait()
        assert d.wait() == 0, d.log()
    assert [s for s, _ in out[True]] == [s for s, _ in out[False]]
    for (_, a), (_, b) in zip(out[True], out[False]):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]), k
    assert sum(len(a["classes"]) for _, a in out[True]) == rows


@pytest.mark.parametrize("shm", [False, True])
def test_hello_again_with_batches_in_flight_keeps_the_credit(daemon, rng, shm):
    """WELCOME's credit is the daemon's less the steps still in flight: the client takes it as
    it is (it used to subtract them again, and a producer of credit 1 then waited for ever)."""
    credit, batch, n = rng.randint(1, 3), rng.randint(1, 4), rng.randint(6, 20)
    d = daemon(replicas=1, batch_size=batch, features=D, classes=K, steps=n, summary_every=1,
               credit=credit, initial_infeed_sleep=0.3)
    p = infeed.Producer(d.listen, name="loader", schema=SCHEMA, timeout=20, shm=shm)
    x, y = steps_data(rng.randrange(1 << 30), n, batch, D, K)
    again = rng.sample(range(n), 3)
    for i in range(n):
        if i in again:
            p.hello()
            # (ACKs that came after WELCOME are counted too)
            assert p.credit == credit - len(p.unacked), (p.credit, p.welcome, p.unacked)
        p.send(x=x[i * batch:(i + 1) * batch], y=y[i * batch:(i + 1) * batch])
    p.wait()
    assert p.credit == credit and p.transport == ("shm" if shm else "socket")
    p.end()
    p.close()
    assert d.wait() == 0, d.log()
