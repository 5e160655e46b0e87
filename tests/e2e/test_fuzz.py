"""Fuzzing infeedd over the wire: several raw DEALER peers send a bounded stream of random and
mutated messages (random frames, headers with random type/version, HELLOs with mutated schemas
and JSON, BATCHes with hostile seq/rows/flags/ntensors, truncated and oversized frames, END at
random, valid batches with extreme sequence numbers, garbage on the control socket) while one
well-behaved producer streams good batches.

The daemon must stay alive and answer ``status`` throughout, every reply must decode (each ERROR
a JSON object with code, seq, credit and message), every good batch is acknowledged exactly once,
and the run ends well (exit 0, reason input_ended) once every welcomed producer sent END.

The run is random: the seed is printed, INFEED_TEST_SEED=N repeats it (INFEED_FUZZ_MESSAGES
changes the number of fuzz messages, default 8000).
"""

from __future__ import annotations

import json
import os
import struct
import time

import numpy as np
import zmq

from infeed import protocol as P
from rawpeer import RawPeer, batch_frames, hello, xy_schema, xy_tensors

D, K, B, CREDIT, REPLICAS = 3, 5, 4, 8, 2
SCHEMA = xy_schema(D)
GOOD_NAME = "good-producer"
N_FUZZ_PEERS = 6
N_GOOD = 500
# ZMQ_MAXMSGSIZE of the daemon: the largest tensor of a full batch plus 64 KiB
MAX_FRAME = B * D * 4 + 65536

I64_MAX, I64_MIN = (1 << 63) - 1, -(1 << 63)
INTERESTING_I64 = [0, 1, -1, 2, B - 1, B, B + 1, 255, 256, 65535, 65536, (1 << 31) - 1, 1 << 31,
                   -(1 << 31), (1 << 32) - 1, 1 << 32, (1 << 62), I64_MAX - 1, I64_MAX, I64_MIN,
                   I64_MIN + 1, (1 << 61) + B, -B]
INTERESTING_U32 = [0, 1, 2, 3, 4, 31, 32, 33, 255, 256, 65535, (1 << 31) - 1, 1 << 31,
                   (1 << 32) - 1]
NAMES = ["fz-a", "fz-b", "fz-c", "producer-1", "producer-2", "producer-3", "x" * 63,
         "\u00e9t\u00e9", "a b", "fz-\u2603"]


class Peer(RawPeer):
    """A RawPeer that checks every message the daemon sends and keeps the raw ACKs."""

    def __init__(self, endpoint: str, routing_id: bytes | None = None):
        super().__init__(endpoint)
        if routing_id is not None:  # before the connect: RawPeer connected already, so redo it
            self.sock.close(0)
            self.sock = zmq.Context.instance().socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.setsockopt(zmq.ROUTING_ID, routing_id)
            self.sock.connect(endpoint)
        self.raw_acks: list[tuple[int, int]] = []
        self.received = 0

    def _recv(self, timeout: float) -> bool:
        if not self.sock.poll(int(timeout * 1000)):
            return False
        frames = self.sock.recv_multipart()
        self.received += 1
        m = P.unpack_message(frames)  # raises on anything malformed
        if m.type == P.ERROR:
            check_error(m.body)
        elif m.type == P.ACK:
            assert m.credit >= 1, f"ACK with credit {m.credit}"
            self.raw_acks.append((m.seq, m.credit))
        elif m.type == P.CREDIT:
            assert m.credit >= 0, f"CREDIT {m.credit}"  # 0: the daemon's liveness probe
        elif m.type in (P.WELCOME, P.BYE):
            pass
        else:
            raise AssertionError(f"unexpected message type {m.type} from the daemon: {frames!r}")
        {P.ACK: lambda: self._on_ack(m), P.CREDIT: lambda: self.credits.append(m.credit),
         P.ERROR: lambda: self._on_error(m.body), P.WELCOME: lambda: self.welcomes.append(m.body),
         P.BYE: lambda: self.byes.append(m.body)}[m.type]()
        return True

    def poll_all(self) -> None:
        while self._recv(0):
            pass


def check_error(body) -> None:
    assert isinstance(body, dict), f"ERROR body is not an object: {body!r}"
    for k in ("code", "seq", "credit", "message"):
        assert k in body, f"ERROR without {k!r}: {body}"
    assert body["code"] in P.ERROR_CODES, f"ERROR code: {body}"
    assert body["seq"] is None or isinstance(body["seq"], int), f"ERROR seq: {body}"
    assert body["credit"] in (0, 1), f"ERROR credit: {body}"
    assert isinstance(body["message"], str) and len(body["message"]) > 10, f"ERROR msg: {body}"


def good_tensors(nrng, rows=B):
    return xy_tensors(nrng, rows, D, K)


class Fuzzer:
    def __init__(self, rng, nrng):
        self.rng = rng
        self.nrng = nrng

    def rbytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def i64(self) -> int:
        r = self.rng.random()
        if r < 0.7:
            return self.rng.choice(INTERESTING_I64)
        if r < 0.85:
            return self.rng.randint(0, 1000)
        return self.rng.randint(I64_MIN, I64_MAX)

    def u32(self) -> int:
        r = self.rng.random()
        if r < 0.8:
            return self.rng.choice(INTERESTING_U32)
        return self.rng.randint(0, (1 << 32) - 1)

    def mutate_bytes(self, b: bytes) -> bytes:
        b = bytearray(b)
        for _ in range(self.rng.randint(1, 4)):
            op = self.rng.randrange(5)
            if op == 0 and b:  # flip a byte
                i = self.rng.randrange(len(b))
                b[i] = self.rng.randrange(256)
            elif op == 1 and b:  # truncate
                del b[self.rng.randrange(len(b)):]
            elif op == 2:  # insert bytes
                i = self.rng.randrange(len(b) + 1)
                b[i:i] = self.rbytes(self.rng.randint(1, 8))
            elif op == 3:  # a NUL
                b.insert(self.rng.randrange(len(b) + 1), 0)
            elif op == 4 and b:  # duplicate a slice
                i = self.rng.randrange(len(b))
                b[i:i] = b[i:i + self.rng.randint(1, 16)]
        return bytes(b)

    # ---- the message kinds ---------------------------------------------------------------

    def random_frames(self):
        sizes = [0, 1, 4, 7, 8, 9, 31, 32, 33, self.rng.randint(0, 200)]
        return [self.rbytes(self.rng.choice(sizes)) for _ in range(self.rng.randint(1, 8))]

    def random_header(self):
        version = self.rng.choice([1, 1, 1, 0, 2, 0xFFFF, self.rng.randrange(1 << 16)])
        mtype = self.rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0xFFFF,
                                 self.rng.randrange(1 << 16)])
        hdr = struct.pack("<4sHH", P.MAGIC, version, mtype) + self.rbytes(
            self.rng.choice([0, 0, 8, 16, 24, self.rng.randint(0, 40)]))
        return [hdr] + self.random_frames()[: self.rng.randint(0, 3)]

    def hello_obj(self):
        obj = {"schema": json.loads(json.dumps(SCHEMA))}
        if self.rng.random() < 0.8:
            obj["name"] = self.rng.choice(NAMES)
        if self.rng.random() < 0.4:
            obj["first_seq"] = self.rng.choice([0, 1, 100, I64_MAX - 1, I64_MAX, 1 << 62])
        return obj

    def mutate_json_value(self):
        return self.rng.choice([None, True, False, 0, -1, 1.5, I64_MAX, I64_MIN, "", "s" * 70,
                                [], {}, [1, 2], {"a": 1}, "float32", [[3]], [-1], [3, 3],
                                [1 << 40], "\u0000".join("ab")])

    def mutated_hello(self):
        obj = self.hello_obj()
        for _ in range(self.rng.randint(1, 3)):
            op = self.rng.randrange(9)
            if op == 0:
                obj.pop(self.rng.choice(list(obj) or ["schema"]), None)
            elif op == 1:
                obj[self.rng.choice(["colour", "replica", "first_seq", "name", "schema", ""])] = \
                    self.mutate_json_value()
            elif op == 2 and isinstance(obj.get("schema"), list) and obj["schema"]:
                t = self.rng.choice(obj["schema"])
                if isinstance(t, dict):
                    t[self.rng.choice(["name", "dtype", "shape", "extra"])] = \
                        self.mutate_json_value()
            elif op == 3 and isinstance(obj.get("schema"), list):
                obj["schema"].append(self.rng.choice(
                    [dict(SCHEMA[0]), 5, None, {"name": "z", "dtype": "uint8", "shape": []}]))
            elif op == 4 and isinstance(obj.get("schema"), list) and obj["schema"]:
                obj["schema"].pop(self.rng.randrange(len(obj["schema"])))
            elif op == 5 and isinstance(obj.get("schema"), list) and obj["schema"]:
                obj["schema"].reverse()
            elif op == 6 and isinstance(obj.get("schema"), list) and obj["schema"]:
                t = obj["schema"][0]
                if isinstance(t, dict):
                    t["shape"] = [self.rng.choice([0, 1, 3, -3, I64_MAX, 1 << 40])
                                  for _ in range(self.rng.randint(0, 9))]
            elif op == 7:
                obj["name"] = self.rng.choice(["", "y" * 64, "z" * 200, "\n", 5, None])
            elif op == 8:
                obj["first_seq"] = self.rng.choice([-1, I64_MIN, 1.0, "0", None, I64_MAX])
        text = P.pack_json(obj)
        r = self.rng.random()
        if r < 0.15:
            text = self.mutate_bytes(text)
        elif r < 0.2:
            text = self.rng.choice([b"", b"[]", b"null", b"5", b'"s"', b"{", b"{}" * 3,
                                    b'{"schema":1,"schema":2}', b"\xff\xfe",
                                    b'{"name":"a\\u0000b"}', b"[" * 5000 + b"]" * 5000])
        elif r < 0.23:  # around the 64 KiB limit (still below ZMQ_MAXMSGSIZE)
            pad = self.rng.choice([P.MAX_HELLO_JSON - len(text) - 12, P.MAX_HELLO_JSON])
            obj2 = dict(obj)
            obj2["pad"] = "p" * max(0, pad)
            text = P.pack_json(obj2)
        frames = [P.pack_header(P.HELLO), text]
        if self.rng.random() < 0.1:
            frames = frames[:1] if self.rng.random() < 0.5 else frames + [b"{}"]
        return frames

    def valid_hello(self):
        return hello(**{"schema": SCHEMA, **{k: v for k, v in self.hello_obj().items()
                                              if k != "schema"}})

    def hostile_batch(self):
        seq = self.i64() if self.rng.random() < 0.8 else self.rng.randint(0, 50)
        rows = B if self.rng.random() < 0.4 else self.i64()
        flags = 0 if self.rng.random() < 0.6 else self.u32()
        nframes = self.rng.choice([0, 1, 2, 2, 2, 3, 5, self.rng.randint(0, 12)])
        ntensors = nframes if self.rng.random() < 0.6 else self.u32()
        hdr = struct.pack("<4sHHqqII", P.MAGIC, 1, P.BATCH, seq, rows, flags, ntensors)
        r = self.rng.random()
        if r < 0.1:
            hdr = hdr[: self.rng.randint(8, 31)]
        elif r < 0.15:
            hdr += self.rbytes(self.rng.randint(1, 32))
        want = [B * D * 4, B * 4]
        frames = []
        for i in range(nframes):
            w = want[i] if i < 2 else 16
            size = self.rng.choice([w, w, w, 0, w - 1, w + 1, w // 2, 2 * w, 1,
                                    self.rng.randint(0, 4 * w + 1)])
            frames.append(self.rbytes(max(0, size)))
        return [hdr] + frames

    def good_batch(self, seq=None):
        """A valid batch with an interesting seq (or bad labels now and then)."""
        if seq is None:
            seq = self.rng.choice([0, 1, 2, 7, 1000, I64_MAX - 1, I64_MAX, -1, I64_MIN,
                                   self.rng.randint(0, 1 << 40)])
        t = good_tensors(self.nrng)
        if self.rng.random() < 0.15:
            t[1][self.rng.randrange(B)] = self.rng.choice([-1, K, 1 << 30, -(1 << 31)])
        return batch_frames(seq, t)

    def oversized(self):
        """One frame above ZMQ_MAXMSGSIZE: libzmq drops the connection (it comes back with a new
        routing id)."""
        return [P.pack_batch_header(0, B, 2), self.rbytes(MAX_FRAME + 1), self.rbytes(16)]

    def message(self):
        r = self.rng.random()
        for p, gen in ((0.12, self.random_frames), (0.22, self.random_header),
                       (0.40, self.mutated_hello), (0.47, self.valid_hello),
                       (0.72, self.hostile_batch), (0.85, self.good_batch),
                       (0.88, P.end_frames)):
            if r < p:
                return gen()
        # a valid header with the wrong number of frames for its type
        t = self.rng.choice([P.HELLO, P.END, P.BATCH])
        return [P.pack_header(t)] + self.random_frames()[: self.rng.randint(0, 4)]

    def control_request(self):
        return self.rng.choice([
            b"", b"\xff\x00", b"[]", b"null", b'{"cmd":5}', b'{"cmd":"nope"}', b'{"cmd":null}',
            b'{"cmd":"status","cmd":"stop"}'[:20], b'{"cmd":"' + b"s" * 5000 + b'"}',
            self.rbytes(self.rng.randint(0, 100)), b"[" * 3000])


SYNC = b"SYNC" + bytes(4)


def sync(peer: Peer, d, deadline_s: float = 10.0) -> None:
    """Waits until the daemon handled everything the peer sent (the answer to a probe comes after
    the answers to the earlier messages); probes again if a dropped connection lost it."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert d.proc.poll() is None, f"infeedd died: rc {d.proc.returncode}\n{d.log()}"
        n = len(peer.errors)
        peer.send([SYNC])
        t = time.monotonic() + 1.0
        while time.monotonic() < t:
            peer._recv(0.05)
            if any("53 59 4e 43" in e["message"] for e in peer.errors[n:]):
                return
    raise AssertionError(f"the daemon did not answer a sync probe:\n{d.log()}")


def test_fuzz(daemon, rng):
    n_fuzz = int(os.environ.get("INFEED_FUZZ_MESSAGES", 8000))
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    fz = Fuzzer(rng, nrng)
    d = daemon(replicas=REPLICAS, batch_size=B, features=D, classes=K, steps=10 ** 9,
               iterations_per_loop=rng.choice([1, 3, 10]), summary_every=0, credit=CREDIT,
               max_producers=64, log_level="warn")
    t0 = time.monotonic()

    good = Peer(d.listen)
    good.send(hello(SCHEMA, name=GOOD_NAME))
    w = good.welcome()
    assert w["credit"] == CREDIT and w["next_seq"] == 0, w

    peers = []
    for i in range(N_FUZZ_PEERS):
        rid = None
        if i % 3 == 1:  # a chosen routing id of up to 255 bytes (not starting with a zero byte)
            rid = bytes([rng.randint(1, 255)]) + rng.randbytes(rng.choice([0, 4, 254]))
        peers.append(Peer(d.listen, rid))

    next_good = 0
    control_sock = zmq.Context.instance().socket(zmq.REQ)
    control_sock.setsockopt(zmq.LINGER, 0)
    control_sock.connect(d.control_endpoint)
    status_checks = 0

    def check_alive(what: str) -> dict:
        nonlocal status_checks
        assert d.proc.poll() is None, f"infeedd died ({what}): rc {d.proc.returncode}\n{d.log()}"
        try:
            s = d.control({"cmd": "status"}, timeout=10)
        except TimeoutError:
            raise AssertionError(f"no status answer ({what}):\n{d.log()}") from None
        assert s.get("ok") is True, s
        status_checks += 1
        return s

    def pump_good():
        nonlocal next_good
        good.poll_all()
        while next_good < N_GOOD and len(good.pending) < CREDIT:
            good.send(batch_frames(next_good, good_tensors(nrng)))
            next_good += 1
        assert not good.errors, f"the good producer got ERRORs: {good.errors}"

    oversized = 0
    for k in range(n_fuzz):
        if k % 4 == 0:
            pump_good()
        peer = rng.choice(peers)
        if oversized < 3 and rng.random() < 0.001:
            # libzmq drops the connection and what was queued on it: sync first, so that only
            # this message is lost; the DEALER reconnects with a new routing id
            sync(peer, d)
            peer.send(fz.oversized())
            oversized += 1
        else:
            peer.send(fz.message())
        if k % 500 == 499:  # keep the backlog bounded: the daemon handled all that was sent
            for p in peers:
                sync(p, d)
        if k % 16 == 0:
            for p in peers:
                p.poll_all()
        if k % 250 == 0:
            check_alive(f"after {k} fuzz messages")
        if k % 97 == 0:  # garbage on the control socket: answered {"ok": false, "error": ...}
            control_sock.send(fz.control_request())
            assert control_sock.poll(10000), f"no answer on the control socket:\n{d.log()}"
            r = json.loads(control_sock.recv())
            assert r.get("ok") is False and isinstance(r.get("error"), str), r
    fuzz_s = time.monotonic() - t0
    print(f"{n_fuzz} fuzz messages ({oversized} oversized) in {fuzz_s:.1f} s; good batches sent "
          f"{next_good}")

    # Every fuzz peer ends its stream; sync makes sure the daemon handled all of it.
    for p in peers:
        p.send(P.end_frames())
        sync(p, d)
    s = check_alive("after the fuzz")
    replies = sum(p.received for p in peers)
    assert replies > n_fuzz // 2, f"only {replies} answers to {n_fuzz} fuzz messages"
    print(f"daemon: {s['batches_accepted']} batches accepted, {s['batches_rejected']} rejected, "
          f"{len(s['producers'])} producers known; fuzz peers got "
          f"{sum(len(p.errors) for p in peers)} ERRORs, {sum(len(p.welcomes) for p in peers)} "
          f"WELCOMEs, {sum(len(p.raw_acks) for p in peers)} ACKs, "
          f"{sum(len(p.credits) for p in peers)} CREDITs")
    # Producers whose connection went away (an oversized frame) or lost its slot's routing id
    # never said END: take them over by name and end them.
    ender = Peer(d.listen)
    for prod in s["producers"]:
        if prod["name"] != GOOD_NAME and not prod["ended"]:
            ender.send(hello(SCHEMA, name=prod["name"]))
            ender.send(P.end_frames())
    sync(ender, d)
    s = check_alive("after ending the fuzz producers")
    left = [p["name"] for p in s["producers"] if not p["ended"] and p["name"] != GOOD_NAME]
    assert not left, f"producers not ended: {s['producers']}"
    assert not s["input_closed"], f"the input closed before the good producer ended: {s}"

    # The good producer streams the rest, and every batch is acknowledged exactly once.
    deadline = time.monotonic() + 30
    while (next_good < N_GOOD or good.pending) and time.monotonic() < deadline:
        pump_good()
        good._recv(0.05)
    assert next_good == N_GOOD and not good.pending, \
        f"good batches not acknowledged: {good.pending} (sent {next_good})\n{d.log()}"
    assert sorted(good.acks) == list(range(N_GOOD)), f"ACKed {good.acks}"
    assert good.acks == list(range(N_GOOD)), "ACKs out of order"
    assert sum(c for _, c in good.raw_acks) == N_GOOD, good.raw_acks
    assert not good.credits and not good.errors, (good.credits, good.errors)
    good.quiet(0.2)

    good.send(P.end_frames())
    good.until(lambda: bool(good.byes), "BYE", timeout=30)
    bye = good.byes[-1]
    assert bye["status"] == "ok" and bye["acked_seq"] == N_GOOD - 1, bye
    rc = d.wait(30)
    assert rc == 0, f"infeedd exited {rc}:\n{d.log()}"
    end = d.end_summary()
    assert end.get("reason") == "input_ended", end
    log = d.log()
    assert "AddressSanitizer" not in log and "runtime error" not in log, log
    print(f"done in {time.monotonic() - t0:.1f} s, {status_checks} status checks, "
          f"fuzz peers received {sum(p.received for p in peers)} messages")
    for p in peers + [good, ender]:
        p.close()
    control_sock.close(0)


# ---- regressions found by the fuzzing ------------------------------------------------------


def small_daemon(daemon):
    return daemon(replicas=1, batch_size=B, features=D, classes=K, steps=10 ** 9,
                  iterations_per_loop=1, summary_every=0, credit=CREDIT)


def test_anonymous_name_does_not_take_over(daemon, rng):
    """A producer without a name gets one that no producer chose: it must not take over the
    stream of a producer that named itself producer-1."""
    d = small_daemon(daemon)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    a, b = Peer(d.listen), Peer(d.listen)
    a.send(hello(SCHEMA, name="producer-1"))
    assert a.welcome()["name"] == "producer-1"
    b.send(hello(SCHEMA))
    assert b.welcome()["name"] != "producer-1"
    a.send(batch_frames(0, good_tensors(nrng)))
    a.ack(0)
    b.send(batch_frames(0, good_tensors(nrng)))
    b.ack(0)
    assert d.control({"cmd": "status"})["ok"] is True
    a.close()
    b.close()


def test_last_sequence_number(daemon, rng):
    """seq 2^63-1 is accepted once; a HELLO after it says next_seq 2^63-1 (there is no next) and
    the same seq again is a duplicate; the daemon keeps running."""
    d = small_daemon(daemon)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    p = Peer(d.listen)
    p.send(hello(SCHEMA, name="last", first_seq=I64_MAX))
    assert p.welcome()["next_seq"] == I64_MAX
    p.send(batch_frames(I64_MAX, good_tensors(nrng)))
    p.ack(I64_MAX)
    p.send(hello(SCHEMA, name="last"))
    w = p.welcome()
    assert w["next_seq"] == I64_MAX and w["credit"] == CREDIT, w
    n = len(p.raw_acks)
    p.send(batch_frames(I64_MAX, good_tensors(nrng)))  # a duplicate of an acknowledged batch
    p.until(lambda: len(p.raw_acks) > n, "the duplicate's ACK")
    assert p.raw_acks[-1] == (I64_MAX, 1), p.raw_acks
    assert not p.errors, p.errors
    assert d.control({"cmd": "status"})["ok"] is True
    p.close()
