"""The daemon's side of the shared-memory transport (docs/protocol.md, "Shared memory"), spoken
raw over a DEALER: the pool WELCOME describes, its seals, when it is dropped, and the refusals.
The clients' side (Producer(shm=...), buffer/commit) is in test_shared_memory_python.py."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import time

import numpy as np
import pytest
import zmq

HELLO, WELCOME, BATCH, CREDIT, ACK, END, ERROR, BATCH_SHM = 1, 2, 3, 4, 5, 6, 7, 10


def hdr(t: int) -> bytes:
    return b"IFDP" + struct.pack("<HH", 1, t)


def batch_shm(seq: int, rows: int, slot: int, flags: int = 0) -> bytes:
    return hdr(BATCH_SHM) + struct.pack("<qqII", seq, rows, flags, slot)


class Raw:
    """A DEALER that speaks the protocol by hand."""

    def __init__(self, endpoint: str):
        self.s = zmq.Context.instance().socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.connect(endpoint)

    def send(self, *frames):
        self.s.send_multipart(list(frames))

    def hello(self, schema, **keys):
        self.send(hdr(HELLO), json.dumps(dict(schema=schema, **keys)).encode())
        return self.recv_type(WELCOME, ERROR)

    def recv(self, timeout=10):
        """The next message other than a CREDIT 0 (the daemon's liveness probe)."""
        while True:
            if not self.s.poll(int(timeout * 1000)):
                raise TimeoutError("no reply")
            f = self.s.recv_multipart()
            t = struct.unpack("<H", f[0][6:8])[0]
            if t == CREDIT and struct.unpack("<I", f[0][8:12])[0] == 0:
                continue
            return t, f

    def recv_type(self, *types):
        t, f = self.recv()
        assert t in types, (t, f)
        return t, json.loads(f[1]) if len(f) > 1 else f[0]

    def close(self):
        self.s.close()


def schema(features):
    return [{"name": "x", "dtype": "float32", "shape": [features]},
            {"name": "y", "dtype": "int32", "shape": []}]


def map_pool(shm):
    fd = os.open(shm["path"], os.O_RDWR)
    try:
        assert os.fstat(fd).st_size == shm["size"]
        m = mmap.mmap(fd, shm["size"])
        with pytest.raises(PermissionError):  # F_SEAL_SHRINK: nobody cuts the daemon's memory
            os.ftruncate(fd, shm["size"] // 2)
        with pytest.raises(PermissionError):  # F_SEAL_GROW
            os.ftruncate(fd, shm["size"] + 4096)
    finally:
        os.close(fd)
    assert m[:8] == b"IFDSHM1\0" and m[8:24] == bytes.fromhex(shm["token"])
    return m


def views(m, shm, batch, features):
    n = shm["slots"]
    x = np.frombuffer(m, np.float32, n * batch * features, shm["offsets"][0])
    y = np.frombuffer(m, np.int32, n * batch, shm["offsets"][1])
    return x.reshape(n, batch, features), y.reshape(n, batch)


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_pool_layout_seals_and_training(daemon, tmp_path, rng, transport):
    """WELCOME's pool: slots = credit + max_steps - 1, regions aligned to 64 and sized for a
    step batch each, sealed; steps written there train (ACKs come back), the daemon's descriptor
    is closed after the first BATCH_SHM, status reports the pool until END drops it."""
    f, b, k = rng.randint(1, 40), rng.randint(1, 9), rng.randint(1, 5)
    credit = k + rng.randint(0, 6)
    steps = 3 * k + rng.randint(1, 6)
    listen = f"ipc://{tmp_path}/in.sock" if transport == "ipc" else None
    d = daemon(features=f, classes=3, batch_size=b, steps=steps, iterations_per_loop=1,
               credit=credit, max_steps_per_message=k, **({"listen": listen} if listen else {}))
    r = Raw(d.listen)
    _, w = r.hello(schema(f), name="pool", shm=True)
    shm = w["shm"]
    assert shm is not None and "shm_refused" not in w, w
    assert shm["slots"] == credit + k - 1
    assert shm["step_bytes"] == [b * f * 4, b * 4]
    assert all(o % 64 == 0 for o in shm["offsets"]) and shm["offsets"][0] >= 64
    assert shm["offsets"][1] >= shm["offsets"][0] + shm["slots"] * b * f * 4
    assert shm["size"] >= shm["offsets"][1] + shm["slots"] * b * 4
    m = map_pool(shm)
    x, y = views(m, shm, b, f)
    st = d.control({"cmd": "status"})
    assert [p["shm"] for p in st["producers"]] == [True], st
    seq, slot, acked = 0, 0, -1
    while seq < steps:
        n = min(k, steps - seq)
        if slot + n > shm["slots"]:
            slot = 0
        x[slot:slot + n] = np.random.default_rng(seq).standard_normal((n, b, f))
        y[slot:slot + n] = seq % 3
        r.send(batch_shm(seq, n * b, slot))
        if seq == 0:  # the producer mapped it: the path is gone
            t, fr = r.recv()
            assert t == ACK, (t, fr)
            acked = struct.unpack("<q", fr[0][8:16])[0]
            with pytest.raises(OSError):
                os.close(os.open(shm["path"], os.O_RDWR))
        while acked < seq + n - 1:  # one message at a time: its slots are free after
            t, fr = r.recv()
            assert t == ACK, (t, fr)
            acked = struct.unpack("<q", fr[0][8:16])[0]
        seq += n
        slot += n
    r.send(hdr(END))
    assert d.wait() == 0
    summaries = [json.loads(line) for line in open(d.summaries_path)]
    assert summaries[-1]["global_step"] == steps, summaries[-1]
    r.close()
    del x, y  # numpy views of the mapping
    m.close()


def test_end_drops_the_pool_and_hello_again_makes_a_new_one(daemon, rng):
    f = rng.randint(1, 16)
    d = daemon(features=f, classes=3, batch_size=4, steps=100, expect_producers=2)
    r = Raw(d.listen)
    _, w1 = r.hello(schema(f), name="again", shm=True)
    _, w2 = r.hello(schema(f), name="again", shm=True)
    assert w1["shm"]["path"] != w2["shm"]["path"] or w1["shm"]["token"] != w2["shm"]["token"]
    r.send(hdr(END))
    deadline = 50
    while deadline:
        st = d.control({"cmd": "status"})
        if st["producers"] and st["producers"][0]["ended"]:
            break
        deadline -= 1
        time.sleep(0.05)
    assert st["producers"][0]["shm"] is False, st
    # after END (pool dropped) a BATCH_SHM is ECLOSED; after a HELLO without shm, EPROTO
    _, w3 = r.hello(schema(f), name="again")
    assert w3["shm"] is None and "shm_refused" not in w3, w3
    r.send(batch_shm(0, 4, 0))
    _, e = r.recv_type(ERROR)
    assert e["code"] == "EPROTO" and "no shared-memory pool" in e["message"], e
    assert e["credit"] == 1
    r.close()
    d.kill()


def test_refusals(daemon, rng):
    """--shm off: welcomed without a pool, shm_refused says why; a non-boolean shm is EINVAL;
    BATCH_SHM with frames after the header is EPROTO."""
    f = rng.randint(1, 16)
    d = daemon(features=f, classes=3, batch_size=4, steps=100, shm="off")
    r = Raw(d.listen)
    t, w = r.hello(schema(f), name="off", shm=True)
    assert t == WELCOME and w["shm"] is None, w
    assert "--shm off" in w["shm_refused"], w
    t, e = r.hello(schema(f), name="off", shm="yes")
    assert t == ERROR and e["code"] == "EINVAL" and "shm: expected true or false" in e["message"]
    r.send(batch_shm(0, 4, 0), b"extra")
    _, e = r.recv_type(ERROR)
    assert e["code"] == "EPROTO" and "expected no frames" in e["message"], e
    r.close()
    d.kill()


def test_pools_held_at_exit_are_freed(daemon, rng):
    """A stop while producers hold pools (one with steps in flight, one without) frees them all:
    under AddressSanitizer a pool left behind is a leak and a nonzero exit."""
    f = rng.randint(1, 16)
    d = daemon(features=f, classes=3, batch_size=4, steps=100, credit=4)
    a, b = Raw(d.listen), Raw(d.listen)
    _, w = a.hello(schema(f), name="a", shm=True)
    m = map_pool(w["shm"])
    _, w = b.hello(schema(f), name="b", shm=True)
    assert w["shm"] is not None
    a.send(batch_shm(0, 4, 0))
    assert a.recv_type(ACK)[0] == ACK
    d.signal()
    assert d.wait() == 0, d.log()
    assert "Sanitizer" not in d.log(), d.log()
    m.close()
    a.close()
    b.close()


def pool_mappings(pid: int) -> int:
    """The daemon's mappings of shared-memory pools (each pool alive is mapped once)."""
    with open(f"/proc/{pid}/maps") as f:
        return sum("infeed-pool" in line for line in f)


def send_one_step(r, w, f, seq):
    """Maps the WELCOME's pool, writes one step into slot 0 and sends it as batch seq."""
    b = w["batch_size"]
    m = map_pool(w["shm"])
    x, y = views(m, w["shm"], b, f)
    x[0], y[0] = 0.5, 1
    r.send(batch_shm(seq, b, 0))
    del x, y
    m.close()


def stuck_daemon(daemon, f, credit):
    """per-core with 2 replicas and a producer for replica 0 only: every step it sends stays in
    flight (the step waits for replica 1's batch), so its pool stays alive."""
    return daemon(features=f, classes=3, batch_size=4, replicas=2, input_mode="per-core",
                  steps=100, credit=credit, max_producers=2)


def test_renaming_connection_drops_its_old_pool(daemon, rng):
    """A connection that says HELLO under another name leaves its old stream: the old stream's
    pool is dropped (its steps in flight keep it alive, no longer the ended stream)."""
    f = rng.randint(1, 16)
    d = stuck_daemon(daemon, f, 4)
    r = Raw(d.listen)
    _, w = r.hello(schema(f), name="first", replica=0, shm=True)
    m = map_pool(w["shm"])
    r.send(batch_shm(0, 2, 0))  # in flight: the old stream keeps its slot
    _, w2 = r.hello(schema(f), name="second", replica=0, shm=True)
    assert w2["shm"] is not None, w2
    st = {p["name"]: p for p in d.control({"cmd": "status"})["producers"]}
    assert st["first"]["ended"] and st["first"]["in_flight"] == 1, st
    assert st["first"]["shm"] is False, st
    assert pool_mappings(d.proc.pid) == 2  # first's, alive for its step; second's
    m.close()
    r.close()
    d.kill()


def test_rehello_in_a_loop_holds_at_most_two_pools(daemon, rng):
    """S in docs/protocol.md counts 2 pools a producer (its own and an old one whose steps are in
    flight): a producer that says HELLO with shm again and again, each time with a step in flight
    in its current pool, gets shm_refused once it holds 2 (after waiting 1 s for them to be
    consumed, which never happens here), instead of a pool each time."""
    f, credit = rng.randint(1, 16), rng.randint(3, 5)
    d = stuck_daemon(daemon, f, credit)
    r = Raw(d.listen)
    refused = []
    for seq in range(credit):
        _, w = r.hello(schema(f), name="looper", replica=0, shm=True)
        if w["shm"] is None:
            refused.append(w["shm_refused"])
            continue
        send_one_step(r, w, f, seq)
        assert d.control({"cmd": "status"})["producers"][0]["in_flight"] == seq + 1 - len(refused)
        assert pool_mappings(d.proc.pid) <= 2, (seq, pool_mappings(d.proc.pid))
    assert pool_mappings(d.proc.pid) <= 2
    assert len(refused) >= credit - 2, refused
    assert all("pools of this producer: expected at most 2 alive at once, got 2" in s
               and "in flight" in s for s in refused), refused
    # another producer is not affected: it gets its pool
    r2 = Raw(d.listen)
    _, w = r2.hello(schema(f), name="other", replica=0, shm=True)
    assert w["shm"] is not None, w
    r.close()
    r2.close()
    d.kill()


@pytest.mark.parametrize("shm", ["on", "off"])
def test_pool_descriptors_count_in_the_descriptor_budget(daemon, rng, shm):
    """A pool's memfd stays open until its producer maps it: with --shm on, max_producers of
    them count in the descriptors the connection limit must leave (3 x N + 80 + P: 64 besides, and
    16 refused ingest connections held for their answer)."""
    import resource

    producers, conns = rng.randint(2, 20), rng.randint(40, 80)
    reserve = 64 + 16  # host/main.c DESC_RESERVE
    nofile = 3 * conns + reserve  # enough for the sockets alone, not for the pools besides

    def low_nofile():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    d = daemon(features=4, classes=3, batch_size=4, steps=100, max_producers=producers,
               max_connections=conns, shm=shm, preexec_fn=low_nofile)
    fit = (nofile - reserve - producers) // 3
    said = f"the descriptor limit ({nofile}, ulimit -n) covers {fit} connections"
    deadline = time.monotonic() + 5
    while shm == "on" and said not in d.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (said in d.log()) == (shm == "on"), d.log()
    assert ("covers" in d.log()) == (shm == "on"), d.log()
    d.kill()


def test_pools_survive_hellos_ends_and_timeouts_with_steps_in_flight(daemon, rng):
    """A producer that streams messages of several steps into its pool and, at random, says
    HELLO again (a new pool, the old one's steps in flight), sends END and HELLO, goes silent
    past producer_timeout, asks for no pool, repeats the last steps it sent in a longer message
    (only the new ones taken, only their slots checked), or rewrites the whole pool, slots in
    flight and header included: every step is acknowledged, and the daemon (built with
    AddressSanitizer or ThreadSanitizer: no use of a freed pool, no race on its slots, no label
    read from the pool after its check) exits cleanly on SIGTERM."""
    f, b = rng.randint(1, 8), rng.randint(1, 4)
    k_most = rng.randint(1, 4)
    credit = k_most + rng.randint(0, 4)
    d = daemon(features=f, classes=3, batch_size=b, steps=1 << 30, iterations_per_loop=1,
               credit=credit, max_steps_per_message=k_most, expect_producers=2,
               producer_timeout=1)
    r = Raw(d.listen)
    st = {"credit": 0, "seq": 0, "pool": None, "busy": {}, "acked": -1, "m": None,
          "need_hello": False, "msgs": {}}
    ECLOSED_SEEN = []

    def hello(shm=True):
        """What comes before the WELCOME (ACKs, ECLOSED for batches sent after a timeout) is
        covered by its credit and next_seq."""
        r.send(hdr(HELLO), json.dumps(dict(schema=schema(f), name="churn", shm=shm)).encode())
        while True:
            t, fr = r.recv()
            if t == ACK:
                st["acked"] = max(st["acked"], struct.unpack("<q", fr[0][8:16])[0])
            if t == WELCOME:
                break
            assert t in (ACK, CREDIT, ERROR), (t, fr)
        w = json.loads(fr[1])
        st["need_hello"] = False
        if st["m"] is not None:
            st["x"] = st["y"] = None
            st["m"].close()
        st.update(credit=w["credit"], seq=w["next_seq"], pool=w["shm"], busy={}, msgs={}, m=None)
        if w["shm"]:
            st["m"] = map_pool(w["shm"])
            st["x"], st["y"] = views(st["m"], w["shm"], b, f)

    def handle(t, fr):
        if t == ACK:
            seq, n = struct.unpack("<qI", fr[0][8:20])
            st["credit"] += n
            st["acked"] = max(st["acked"], seq)
            st["busy"] = {s: q for s, q in st["busy"].items() if q > seq}
            st["msgs"] = {q: sl for q, sl in st["msgs"].items() if q + len(sl) - 1 > seq}
        elif t == CREDIT:
            st["credit"] += struct.unpack("<I", fr[0][8:12])[0]
        elif t == ERROR:
            e = json.loads(fr[1])
            if e["code"] == "ERANGE":  # labels rewritten before the daemon took the message
                assert "tensor 'y'" in e["message"] and "out of range" in e["message"], e
                st["credit"] += e["credit"]
                for slot in st["msgs"].pop(e["seq"], []):
                    st["busy"].pop(slot, None)
                return
            assert e["code"] == "ECLOSED" and "timed out" in e["message"], e
            ECLOSED_SEEN.append(e)
            st["need_hello"] = True
        else:
            raise AssertionError((t, fr))

    def drain(block=False):
        while True:
            try:
                t, fr = r.recv(timeout=5 if block else 0)
            except TimeoutError:
                assert not block, "no reply"
                return
            handle(t, fr)
            block = False

    hello()
    sent = 0
    for _ in range(rng.randint(60, 120)):
        a = rng.random()
        if a < 0.08:
            hello(shm=rng.random() < 0.8)
        elif a < 0.12:
            r.send(hdr(END))
            hello()
        elif a < 0.13 and not ECLOSED_SEEN:
            time.sleep(1.3)  # silent on purpose past producer_timeout (when it holds credit: timed
            # out, its pool dropped)
        while st["credit"] < 1 and not st["need_hello"]:
            drain(block=True)
        if st["need_hello"]:
            hello()
        k = rng.randint(1, min(k_most, st["credit"]))
        data = np.random.default_rng(sent).standard_normal((k, b, f)).astype(np.float32)
        back = 0
        if st["pool"] is None:
            r.send(hdr(BATCH) + struct.pack("<qqII", st["seq"], k * b, 0, 2),
                   data.tobytes(), np.ones(k * b, np.int32).tobytes())
        else:
            n = st["pool"]["slots"]
            free = []
            while not free and not st["need_hello"]:
                free = [s for s in range(n - k + 1)
                        if all(s + j not in st["busy"] for j in range(k))]
                if not free:
                    drain(block=True)
            if not free:
                continue
            s = rng.choice(free)
            st["x"][s:s + k] = data
            st["y"][s:s + k] = 1
            # a message that repeats the last steps sent: those are dropped (a CREDIT), the
            # others taken, and only their slots checked and marked
            back = rng.randint(1, k - 1) if k > 1 and st["seq"] > 0 and rng.random() < 0.2 else 0
            back = min(back, st["seq"])
            if st["seq"] - back in st["msgs"]:  # an ERROR names a message by its seq alone
                back = 0
            for j in range(k):
                st["busy"][s + j] = st["seq"] - back + j
            st["msgs"][st["seq"] - back] = list(range(s, s + k))
            r.send(batch_shm(st["seq"] - back, k * b, s))  # k credits; a CREDIT of back
            if rng.random() < 0.1:  # hostile: rewrite every slot, in flight or not, and the header
                st["y"][:] = rng.choice([-1, 3, 1 << 30, -(1 << 31)])
                st["x"][:] = 1e3 * rng.random()
                st["m"][:64] = os.urandom(64)
        st["credit"] -= k
        st["seq"] += k - back
        sent += k
        drain()
    deadline = time.monotonic() + 20  # every step taken is acknowledged
    while d.control({"cmd": "status"})["producers"][0]["in_flight"] and \
            time.monotonic() < deadline:
        drain()
        time.sleep(0.01)
    assert d.control({"cmd": "status"})["producers"][0]["in_flight"] == 0
    d.signal()
    assert d.wait() == 0, d.log()
    assert "Sanitizer" not in d.log(), d.log()
    r.close()
    if st["m"] is not None:
        st["x"] = st["y"] = None
        st["m"].close()


def test_a_third_pool_waits_for_the_old_steps(daemon, rng):
    """A HELLO that would make a producer's third pool waits (up to 1 s) for the steps that hold
    its old pools to be consumed, then gets its pool: a producer that says HELLO three times in a
    row while its first steps wait for the device is not refused."""
    f = rng.randint(1, 16)
    d = daemon(features=f, classes=3, batch_size=4, steps=100, credit=4,
               initial_infeed_sleep=0.5)
    r = Raw(d.listen)
    acked = -1
    for seq in range(3):
        r.send(hdr(HELLO), json.dumps(dict(schema=schema(f), name="thrice", shm=True)).encode())
        while True:  # the ACKs of the steps it waits for come first
            t, fr = r.recv()
            if t == WELCOME:
                break
            assert t == ACK, (t, fr)
            acked = struct.unpack("<q", fr[0][8:16])[0]
        w = json.loads(fr[1])
        assert w["shm"] is not None, w
        assert pool_mappings(d.proc.pid) <= 2
        send_one_step(r, w, f, seq)
    while acked < 2:
        t, fr = r.recv()
        if t == ACK:
            acked = struct.unpack("<q", fr[0][8:16])[0]
    r.close()
    d.kill()


def test_a_hole_punched_in_the_pool_reads_as_zeros(daemon, rng):
    """No memfd seal forbids fallocate(PUNCH_HOLE) without forbidding the producer's own writes
    (F_SEAL_WRITE and F_SEAL_FUTURE_WRITE forbid both, and the producer writes its slots), so a
    producer may punch holes in its pool: the daemon then reads zeros there (docs/protocol.md,
    "What the daemon reads, and when"). Predict mode shows what it read: the step whose slot was
    punched is predicted exactly as a BATCH of zeros, the run goes on and ends well."""
    f, b, k = rng.randint(2, 8), rng.randint(1, 8), 3
    d = daemon(mode="predict", features=f, classes=k, batch_size=b, credit=2)
    r = Raw(d.listen)
    _, w = r.hello([{"name": "x", "dtype": "float32", "shape": [f]}], name="holes", shm=True)
    shm = w["shm"]
    fd = os.open(shm["path"], os.O_RDWR)
    m = mmap.mmap(fd, shm["size"])
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    step = shm["step_bytes"][0]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]

    def predicted(seq):
        while True:
            t, frames = r.recv()
            if t == 8 and struct.unpack("<q", frames[0][8:16])[0] == seq:  # PREDICTION
                return np.frombuffer(frames[2], np.float32).reshape(b, k)

    def write(slot):
        x = nrng.standard_normal((b, f)).astype(np.float32)
        m[shm["offsets"][0] + slot * step:shm["offsets"][0] + (slot + 1) * step] = x.tobytes()

    write(0)
    r.send(batch_shm(0, b, 0))
    real = predicted(0)
    write(1)
    at = shm["offsets"][0] + step
    assert libc.fallocate(fd, 0x01 | 0x02, at, step) == 0, ctypes.get_errno()  # KEEP_SIZE|PUNCH
    assert m[at:at + step] == bytes(step)  # the producer's own view reads zeros too
    r.send(batch_shm(1, b, 1))
    punched = predicted(1)
    r.send(hdr(BATCH) + struct.pack("<qqII", 2, b, 0, 1), bytes(b * f * 4))
    zeros = predicted(2)
    assert np.array_equal(punched, zeros), (punched, zeros)
    assert not np.array_equal(real, zeros), "a batch of random rows predicted as zeros"
    r.send(hdr(END))
    t, _ = r.recv()
    while t != 9:  # BYE
        t, _ = r.recv()
    assert d.wait() == 0, d.log()
    m.close()
    os.close(fd)
    r.close()
