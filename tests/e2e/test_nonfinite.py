"""Non-finite steps end to end (docs/summaries.md, "A diverging model"): a batch of large finite
values (3e38, accepted by --check-finite) skips its step instead of ending the run; the
summaries count it and name the batch; --max-skipped-steps in a row end the run with a
sentence naming the batches; a run with skipped steps killed with SIGKILL and resumed ends with
the bits of an uninterrupted one. Non-finite and out-of-range inputs are rejected at ingest (ERROR
ERANGE naming the element) and the run goes on; with --check-finite off a NaN reaches the model,
which diverges."""

import signal

import numpy as np

import ckpt
import infeed
from infeed import protocol as P
from rawpeer import RawPeer, batch_frames, hello, xy_schema, xy_tensors
from helpers import wait_until

FEATURES, CLASSES, BATCH = 64, 10, 32  # the job: softmax, 64 features, batch 32
K = 4  # classes and rows of the raw peers' batches
B = 4


def batch(seq: int, bad: set) -> dict:
    r = np.random.default_rng(5000 + seq)
    x = r.standard_normal((BATCH, FEATURES)).astype(np.float32)
    if seq in bad:
        x[:] = np.float32(3e38)
    return {"x": x, "y": r.integers(0, CLASSES, BATCH, dtype=np.int32)}


def flags(**kw) -> dict:
    f = dict(program="softmax", features=FEATURES, classes=CLASSES, batch_size=BATCH,
             replicas=2, iterations_per_loop=4, summary_every=4, learning_rate=0.05, seed=3)
    f.update(kw)
    return f


def stream(endpoint: str, n: int, bad: set, name: str = "loader-0") -> infeed.Producer:
    p = infeed.Producer(endpoint, name=name, timeout=20)
    for b in p.skip_consumed(batch(i, bad) for i in range(n)):
        p.send(b)
    p.end()
    p.close()
    return p


schema = xy_schema


def good(nrng, d, rows=B):
    return xy_tensors(nrng, rows, d, K)


def skipped_batches(d) -> list:
    return [(b["producer"], b["seq"], b["global_step"]) for s in d.summaries()
            for b in s.get("skipped_batches", []) if "seq" in b]


def test_a_batch_of_3e38_skips_its_step_and_the_run_goes_on(daemon, rng):
    n = rng.randint(30, 50)
    bad = set(rng.sample(range(n), rng.randint(1, 3)))
    d = daemon(**flags(steps=n, replicas=rng.choice([1, 2])))
    stream(d.listen, n, bad)
    assert d.wait() == 0, d.log()
    end = d.end_summary()
    assert end["status"] == "ok" and end["reason"] == "last_step", end
    assert end["global_step"] == n and end["skipped_steps"] == len(bad), end
    trains = [s for s in d.summaries() if s["event"] == "train"]
    assert sum(s["skipped_steps"] for s in trains) == len(bad)
    assert sorted(skipped_batches(d)) == sorted(("loader-0", i, i + 1) for i in bad), d.summaries()
    assert all(s["loss"] is None or np.isfinite(s["loss"]) for s in trains), trains
    # (a window of skipped steps only has no loss)
    losses = [s["loss"] for s in trains if s["loss"] is not None]
    assert losses and losses[-1] < losses[0] + 1, trains
    assert "skipped" in d.log() and "loader-0" in d.log()


def test_too_many_in_a_row_end_the_run_naming_the_batches(daemon, rng):
    k = rng.randint(2, 5)
    first = rng.randint(3, 10)
    bad = set(range(first, first + k))
    d = daemon(**flags(steps=1000, max_skipped_steps=k))
    p = infeed.Producer(d.listen, name="loader-0", timeout=20)
    try:
        for i in range(first + k + 20):
            p.send(batch(i, bad))
    except (infeed.RunEnded, infeed.InfeedError, TimeoutError):
        pass
    assert d.wait() == 1, d.log()
    end = d.end_summary()
    assert end["status"] == "error" and end["code"] == "IFD_ENUMERIC", end
    assert f"{k} steps in a row (global steps {first + 1} to {first + k})" in end["error"], end
    assert f"producer 'loader-0' batch {first} (step {first + 1})" in end["error"], end
    assert f"max_skipped_steps {k}" in end["error"], end
    p.close()


def test_sigkill_and_resume_with_skipped_steps_equals_uninterrupted(daemon, tmp_path, rng):
    last = 48
    bad = set(rng.sample(range(last), 4))
    ck = dict(optimizer="adam", checkpoint_every=8, summary_every=0)
    ref = daemon(**flags(last_step=last, checkpoint_dir=str(tmp_path / "ref"), **ck))
    stream(ref.listen, last, bad)
    assert ref.wait() == 0, ref.log()
    assert ref.end_summary()["skipped_steps"] == len(bad)
    want = ckpt.read(ckpt.files(tmp_path / "ref")[-1])
    assert want["global_step"] == last and want["opt_step"] == last - len(bad), want["opt_step"]

    folder = tmp_path / "run"
    d1 = daemon(**flags(last_step=last, checkpoint_dir=str(folder), **ck))
    p1 = infeed.Producer(d1.listen, name="loader-0", timeout=20)
    upto = rng.randint(17, 40)
    for i in range(upto):
        p1.send(batch(i, bad))
    wait_until(lambda: d1.control({"cmd": "status"})["global_step"] >= upto - upto % 4,
               f"global step {upto - upto % 4}", d1)
    d1.signal(signal.SIGKILL)
    assert d1.wait() == -signal.SIGKILL
    p1.close()
    d2 = daemon(**flags(last_step=last, checkpoint_dir=str(folder), resume=True, **ck))
    stream(d2.listen, last, bad)
    assert d2.wait() == 0, d2.log()
    got = ckpt.read(ckpt.files(folder)[-1])
    assert got["global_step"] == last and got["opt_step"] == want["opt_step"]
    np.testing.assert_array_equal(got["params"], want["params"])
    np.testing.assert_array_equal(got["slots"], want["slots"])


# ---- inputs checked at ingest (--check-finite, --max-abs-input) ------------------------------

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
