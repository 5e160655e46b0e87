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
    """The documented behaviour of a diverging model: a NaN loss ends the run with ENUMERIC."""
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    d = int(nrng.integers(1, 20))
    dm = daemon(replicas=1, batch_size=B, features=d, classes=K, steps=100,
                iterations_per_loop=1, summary_every=1, check_finite="off")
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
