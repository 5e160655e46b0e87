"""Every bad input gets its ERROR (code, seq, credit and a sentence naming the field, what was
expected and what arrived); the daemon keeps serving and the next good batch is accepted."""

import re
import struct

import numpy as np
import pytest

from infeed import protocol as P
from rawpeer import RawPeer, batch_frames, hello, xy_schema, xy_tensors

D, K, B, CREDIT = 3, 5, 4, 4
SCHEMA = xy_schema(D)


def good(rng, rows=B):
    return xy_tensors(rng, rows, D, K)


def check(err, code, *substrings, seq=None, credit=0, codes=None):
    assert err["code"] in (codes or (code,)), err
    assert err["seq"] == seq, err
    assert err["credit"] == credit, err
    msg = err["message"]
    assert isinstance(msg, str) and msg, err
    for s in substrings:
        if isinstance(s, re.Pattern):
            assert s.search(msg), f"{s.pattern!r} not in {msg!r}"
        else:
            assert s.lower() in msg.lower(), f"{s!r} not in {msg!r}"


def word(w):
    return re.compile(rf"(?<![\w.]){re.escape(str(w))}(?![\w.])")


@pytest.fixture
def d(daemon):
    return daemon(replicas=2, batch_size=B, features=D, classes=K, steps=1000000,
                  iterations_per_loop=10, summary_every=0, credit=CREDIT)


def test_before_hello(d, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    p = RawPeer(d.listen)
    p.send([b"abc"])
    check(p.error(), "EPROTO", "header")
    p.send([b"GARBAGE!garbage"])
    check(p.error(), "EPROTO", "magic")
    p.send([struct.pack("<4sHH", b"IFDP", 2, P.HELLO), P.pack_json({"schema": SCHEMA})])
    check(p.error(), "EPROTO", "protocol version: expected 1, got 2")
    p.send([P.pack_header(42)])
    check(p.error(), "EPROTO", "type", word(42))
    p.send(batch_frames(0, good(nrng)))
    e = p.error()
    assert e["code"] == "EPROTO" and "hello" in e["message"].lower(), e
    assert e["seq"] in (0, None), e
    p.send([P.pack_header(P.HELLO)])  # no JSON frame
    check(p.error(), "EPROTO", "frame")
    p.send([P.pack_header(P.HELLO), b"{not json"])
    check(p.error(), "EPROTO", "json")
    # a sentence that quotes a long non-ASCII name is cut to its maximum length, possibly inside
    # a UTF-8 character: still a JSON ERROR with a message
    for pad in range(4):
        bad = [dict(SCHEMA[0], name="x" * pad + "\u00e9" * 600)] + SCHEMA[1:]
        p.send([P.pack_header(P.HELLO), P.pack_json({"schema": bad})])
        e = p.error()
        assert e["code"] == "ESHAPE" and e.get("message"), e
    # HELLO keys
    p.send(hello(SCHEMA, colour="red"))
    check(p.error(), "EINVAL", "colour")
    p.send([P.pack_header(P.HELLO), P.pack_json({"name": 5, "schema": SCHEMA})])
    check(p.error(), "EINVAL", "name")
    p.send(hello(SCHEMA, first_seq=-3))
    e = p.error()
    check(e, "EINVAL", "first_seq")
    assert "-3" in e["message"] or "negative" in e["message"], e
    p.send(hello(SCHEMA, replica=0))
    check(p.error(), "EINVAL", "replica")
    p.send(hello(SCHEMA, name="x" * 64))
    check(p.error(), "EINVAL", "name", word(63))
    p.send([P.pack_header(P.HELLO), P.pack_json({"name": "n", "schema": "x"})])
    check(p.error(), "EINVAL", "schema", "array")
    # the schema against the program's inputs
    p.send(hello([P.schema_entry("features", "float32", [D]), SCHEMA[1]]))
    check(p.error(), "ESHAPE", "schema", "'features'", "'x'")
    p.send(hello(SCHEMA[:1]))
    check(p.error(), "ESHAPE", "schema", word(2), word(1))
    p.send(hello(SCHEMA + [P.schema_entry("z", "float32", [1])]))
    check(p.error(), "ESHAPE", "schema", word(2), word(3))
    p.send(hello([SCHEMA[0], P.schema_entry("y", "float32", [])]))
    check(p.error(), "EDTYPE", "schema", "'y'", "expected dtype int32, got float32")
    p.send(hello([P.schema_entry("x", "float16", [D]), SCHEMA[1]]))
    check(p.error(), "EDTYPE", "'x'", "float16")
    p.send(hello([P.schema_entry("x", "float32", [D + 1]), SCHEMA[1]]))
    check(p.error(), "ESHAPE", "'x'", word(D), word(D + 1))
    p.send(hello([P.schema_entry("x", "float32", [D, 2]), SCHEMA[1]]))
    check(p.error(), "ESHAPE", "'x'")
    p.send(hello([SCHEMA[0], P.schema_entry("y", "int32", [1])]))
    check(p.error(), "ESHAPE", "'y'")
    # after all that, a good HELLO is welcomed and a good batch accepted
    p.send(hello(SCHEMA, name="after-errors", first_seq=5))
    w = p.welcome()
    assert w["protocol"] == 1 and w["name"] == "after-errors" and w["next_seq"] == 5, w
    assert w["credit"] == CREDIT and w["batch_size"] == B and w["replicas"] == 2, w
    assert w["mode"] == "train" and w["input_mode"] == "per-host" and w["program"] == "softmax"
    assert w["schema"] == SCHEMA, w
    p.send(batch_frames(5, good(nrng)))
    p.ack(5)
    p.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    assert p.byes[0]["reason"] == "input_ended" and p.byes[0]["global_step"] == 1, p.byes
    assert p.byes[0]["acked_seq"] == 5
    assert d.wait() == 0, d.log()
    end = d.end_summary()
    assert end["reason"] == "input_ended" and end["global_step"] == 1, end
    p.close()


@pytest.mark.parametrize("how", ["no key", "null"])
def test_hello_without_a_schema_takes_the_programs(daemon, rng, how):
    """A HELLO with no schema (no key, or null) is welcomed with the program's, which its batches
    then follow; WELCOME says expect_producers."""
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    want = rng.randint(0, 3)
    d = daemon(replicas=1, batch_size=B, features=D, classes=K, steps=1, summary_every=0,
               expect_producers=want)
    p = RawPeer(d.listen)
    p.send([P.pack_header(P.HELLO),
            P.pack_json({"name": "n"} if how == "no key" else {"name": "n", "schema": None})])
    w = p.welcome()
    assert w["schema"] == SCHEMA and w["expect_producers"] == want, w
    p.send(batch_frames(0, good(nrng)))
    p.ack(0)
    p.until(lambda: p.byes, "BYE")
    assert p.byes[0]["status"] == "ok" and p.byes[0]["global_step"] == 1, p.byes
    assert d.wait() == 0, d.log()
    p.close()


def test_bad_batches(d, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    p = RawPeer(d.listen)
    keeper = RawPeer(d.listen)  # a second producer: the input goes on after p's END
    keeper.send(hello(SCHEMA, name="keeper"))
    keeper.welcome()
    p.send(hello(SCHEMA, name="loader-0"))
    p.welcome()
    seq = 0
    accepted = 0

    def ok(tensors=None):
        nonlocal seq, accepted
        p.send(batch_frames(seq, tensors or good(nrng)))
        p.ack(seq)
        seq += 1
        accepted += 1

    def bad(frames_fn, code, *subs, codes=None):
        frames = frames_fn(seq)
        p.send(frames)
        check(p.error(), code, *subs, seq=seq, credit=1, codes=codes)
        ok()  # the next good batch is accepted

    ok()
    x, y = good(nrng)
    nb = B * D * 4
    bad(lambda s: batch_frames(s, [x.tobytes()[:-4], y]), "ESHAPE", "'x'", word(nb - 4), word(nb))
    bad(lambda s: batch_frames(s, [x, y.tobytes() + b"\0" * 4]), "ESHAPE", "'y'", word(B * 4 + 4),
        word(B * 4))
    frame_codes = ("ESHAPE", "EPROTO")  # the doc allows reading a wrong frame count as either
    bad(lambda s: batch_frames(s, [x], ntensors=2)[:2], "ESHAPE", word(2), word(1),
        codes=frame_codes)
    bad(lambda s: batch_frames(s, [x], ntensors=1), "ESHAPE", word(2), word(1), codes=frame_codes)
    bad(lambda s: batch_frames(s, [x, y, y], ntensors=3), "ESHAPE", word(2), word(3),
        codes=frame_codes)
    bad(lambda s: batch_frames(s, [x, y, y], ntensors=2), "ESHAPE", codes=frame_codes)
    rows = B * 2
    bad(lambda s: batch_frames(s, good(nrng, rows)), "ESHAPE", "rows", word(rows), word(B))
    bad(lambda s: batch_frames(s, [x[:B - 1], y[:B - 1]]), "ESHAPE", "rows", word(B - 1), word(B))
    bad(lambda s: batch_frames(s, [x, y], flags=P.FLAG_STOPPING), "EINVAL", "flag")
    bad(lambda s: batch_frames(s, [x, y], flags=1 << 7), "EINVAL", "flag")
    row = int(nrng.integers(0, B))
    yb = y.copy()
    yb[row] = K
    bad(lambda s: batch_frames(s, [x, yb]), "ERANGE", word(K), word(row))
    yb[row] = -1
    bad(lambda s: batch_frames(s, [x, yb]), "ERANGE", word(-1))
    # non-batch garbage on a welcomed connection: seq null, credit 0, the welcome still counts
    p.send([b"\x00" * 3])
    check(p.error(), "EPROTO", "header")
    ok()
    p.send([P.pack_header(17)])
    check(p.error(), "EPROTO", word(17))
    ok()
    p.send(hello([SCHEMA[0], P.schema_entry("y", "int64", [])]))
    check(p.error(), "EDTYPE", "'y'", "int64")
    ok()
    # a duplicate of a consumed batch is ACKed again, without an error
    n_acks = p.acks.count(0)
    p.send(batch_frames(0, good(nrng)))
    p.until(lambda: p.acks.count(0) > n_acks or p.errors or p.credits, "the duplicate's answer")
    assert not p.errors, p.errors
    # END, then a batch is ECLOSED until HELLO again
    p.send(P.end_frames())
    p.send(batch_frames(seq, good(nrng)))
    check(p.error(), "ECLOSED", seq=seq, credit=1)
    p.send(hello(SCHEMA, name="loader-0"))
    w = p.welcome()
    assert w["next_seq"] == seq, w
    ok()
    # the other producer saw nothing of it
    keeper.quiet(0.1)
    p.send(P.end_frames())
    keeper.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    keeper.until(lambda: keeper.byes, "BYE")
    assert p.byes[0]["acked_seq"] == seq - 1 and keeper.byes[0]["acked_seq"] == -1
    assert d.wait() == 0, d.log()
    end = d.end_summary()
    assert (end["status"], end["reason"], end["global_step"]) == ("ok", "input_ended", accepted)
    p.close()
    keeper.close()


def test_end_with_extra_frames_and_negative_seq(daemon, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    dm = daemon(replicas=1, batch_size=B, features=D, classes=K, steps=1000000,
                iterations_per_loop=5, summary_every=0, credit=4)
    p = RawPeer(dm.listen)
    keeper = RawPeer(dm.listen)
    keeper.send(hello(SCHEMA, name="keeper"))
    keeper.welcome()
    p.send(hello(SCHEMA, name="loader"))
    p.welcome()
    extra = int(nrng.integers(1, 4))
    p.send(P.end_frames() + [b"x"] * extra)
    e = p.error()
    assert e["code"] == "EPROTO" and e["seq"] is None, e
    assert f"END: expected 1 frame (header), got {1 + extra}" in e["message"], e
    # the stream did not end: a batch is still accepted
    p.send(batch_frames(0, good(nrng)))
    p.ack(0)
    neg = -int(nrng.integers(1, 1 << 40))
    p.send(batch_frames(neg, good(nrng)))
    e = p.error()
    assert e["code"] == "EINVAL" and e["seq"] == neg and e["credit"] == 1, e
    assert str(neg) in e["message"], e
    p.send(P.end_frames())
    keeper.send(P.end_frames())
    p.until(lambda: p.byes, "BYE")
    assert dm.wait() == 0, dm.log()
    p.close()
    keeper.close()


def test_no_credit_and_reconnect(daemon, rng):
    """A batch sent without credit is EPROTO and dropped. Whether the daemon consumed (and so
    freed credit for) some of the batches before the extra ones arrive is timing, so this sends
    credit + 4 at once and checks the accounting either way: every batch gets exactly one
    answer, rejections are EPROTO naming the credit, ACKs come in order."""
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = daemon(replicas=1, batch_size=2, features=D, classes=K, steps=1000, credit=2,
               iterations_per_loop=50, summary_every=0)
    p = RawPeer(d.listen)
    p.send(hello(SCHEMA, name="greedy"))
    p.welcome()
    for s in range(6):
        p.send(batch_frames(s, good(nrng, 2)))
    p.until(lambda: len(p.acks) + len(p.errors) >= 6, "an answer for every batch")
    p.drain(0.2)
    answered = sorted(p.acks + [e["seq"] for e in p.errors])
    assert answered == list(range(6)), (p.acks, p.errors)
    for e in p.errors:
        check(e, "EPROTO", "credit", seq=e["seq"], credit=1)
    assert p.acks == sorted(p.acks)
    p.close()
