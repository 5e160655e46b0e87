"""The built-in transformer `charlm` (device/programs/charlm.c) through infeedd, against the
float64 numpy reference tests/util/charlm_ref.py: eval mode's loss and predict mode's
next-token distribution from a checkpoint, and a training step's gradient of every parameter
(the SGD update of a resumed run divided by the learning rate), on random model sizes; the
per-step loss with 1 and 4 replicas; and the small configuration of examples/charlm learning
more than the corpus's byte frequencies in a short run."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import infeed
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "util"))
sys.path.insert(0, str(ROOT / "examples" / "charlm"))
import charlm_ref  # noqa: E402
import corpus  # noqa: E402


def random_model(rng) -> dict:
    heads = rng.choice([1, 2, 4])
    return {"layers": rng.randint(1, 2), "heads": heads, "width": heads * rng.randint(2, 6),
            "block": rng.randint(3, 10), "vocab": rng.randint(5, 40)}


def model_flags(m: dict, **more) -> dict:
    return dict(program="charlm", program_config=json.dumps(m), **more)


def token_batches(seed: int, steps: int, batch: int, m: dict) -> list:
    """Random tokens; each target a function of its token (something to learn)."""
    r = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        t = r.integers(0, m["vocab"], (batch, m["block"]), dtype=np.int32)
        out.append({"tokens": t, "targets": ((3 * t + 1) % m["vocab"]).astype(np.int32)})
    return out


def send_all(d, batches, name="text") -> None:
    with infeed.Producer(d.listen, name=name, timeout=20) as p:
        for b in p.skip_consumed(batches):
            p.send(**b)


def test_charlm_matches_the_numpy_reference(daemon, tmp_path, rng):
    """Train one step (a checkpoint of trained parameters P1), then from P1: eval's loss and
    predict's distributions equal the reference's; a resumed run's SGD step gives P2, and
    (P1 - P2) / lr equals the reference's gradient of every parameter at P1."""
    m = random_model(rng)
    batch, lr = rng.randint(1, 4), 0.5
    ck = tmp_path / "ck"
    data = token_batches(rng.randrange(1 << 30), 2, batch, m)
    common = model_flags(m, batch_size=batch, checkpoint_dir=str(ck), iterations_per_loop=1,
                         optimizer="sgd", learning_rate=lr)
    d = daemon(steps=1, seed=rng.randrange(1 << 20), **common)
    send_all(d, data[:1])
    assert d.wait() == 0, d.log()
    p1 = infeed.checkpoint.load(ck).params
    assert [s[0] for s in charlm_ref.param_specs(m["layers"], m["width"], m["block"],
                                                 m["vocab"])] == list(p1), list(p1)
    want_loss, want_g = charlm_ref.loss_and_grads(p1, data[1]["tokens"], data[1]["targets"],
                                                  m["heads"])

    d = daemon(mode="eval", steps=1, **common)
    send_all(d, data[1:], name="scorer")
    assert d.wait() == 0, d.log()
    ev = [s for s in d.summaries() if s.get("event") == "eval"][-1]
    assert ev["loss"] == pytest.approx(want_loss, rel=1e-5), (ev, want_loss)

    d = daemon(mode="predict", **common)
    with infeed.Producer(d.listen, name="predictor", timeout=20) as p:
        bad = data[1]["tokens"].copy()
        row, pos = rng.randrange(batch), rng.randrange(m["block"])
        bad[row, pos] = m["vocab"]  # refused before any step indexes the tables with it
        p.send(tokens=bad)
        with pytest.raises(infeed.InfeedError) as ei:
            p.wait()
        assert ei.value.code == "ERANGE" and f"tensor 'tokens' row {row} element {pos}: " \
            f"{m['vocab']} is out of range" in str(ei.value), ei.value
        p.send(tokens=data[1]["tokens"])
        (_, out), = list(p.predictions())
        p.end()
    want_p = charlm_ref.predict(p1, data[1]["tokens"], m["heads"])
    np.testing.assert_allclose(out["outputs"], want_p, rtol=1e-4, atol=1e-6)

    d = daemon(steps=2, resume=True, **common)
    send_all(d, data)
    assert d.wait() == 0, d.log()
    p2 = infeed.checkpoint.load(ck).params
    for name, g in want_g.items():
        got = (p1[name].astype(np.float64) - p2[name]) / lr
        scale = max(np.abs(g).max(), 1e-3)
        assert np.abs(got - g).max() <= 2e-3 * scale, (name, np.abs(got - g).max(), scale)


def test_charlm_loss_with_1_and_4_replicas(daemon, rng):
    """The same batches on 1 and 4 replicas: every step's loss agrees within 1e-5 relative
    over 50 steps (AdamW, clipping and a cosine schedule). At least 4 features: a layer norm over
    2 maps every vector to about (-1, 1), so its input gradient is rounding noise, which Adam's
    normalisation turns into full-size steps that differ with the summation order."""
    m = random_model(rng)
    m["width"] = max(m["width"], 4)  # heads is 1, 2 or 4
    steps, batch = 50, 4 * rng.randint(1, 2)
    data = token_batches(rng.randrange(1 << 30), steps, batch, m)
    losses = []
    for replicas in (1, 4):
        d = daemon(steps=steps, replicas=replicas, batch_size=batch, summary_every=1,
                   iterations_per_loop=rng.randint(1, 5),
                   **model_flags(m, optimizer="adamw", learning_rate=0.01, weight_decay=0.1,
                                 clip_norm=1.0, lr_schedule="cosine", warmup_steps=5,
                                 decay_steps=steps))
        send_all(d, data)
        assert d.wait() == 0, d.log()
        losses.append([(s["global_step"], s["loss"]) for s in d.summaries()
                       if s.get("event") == "train"])
    assert len(losses[0]) == steps and [s for s, _ in losses[0]] == [s for s, _ in losses[1]]
    np.testing.assert_allclose([v for _, v in losses[1]], [v for _, v in losses[0]], rtol=1e-5)
    assert losses[0][-1][1] < losses[0][0][1], "it trained"


def test_small_charlm_learns_more_than_byte_frequencies(daemon):
    """examples/charlm's corpus (the project's own docs and sources) and a small model: after a
    short run the training loss is below the corpus's unigram entropy (a loose bound: a model
    that learned the byte frequencies alone stays at it)."""
    m = {"layers": 1, "heads": 2, "width": 32, "block": 32, "vocab": 256}
    text = corpus.load()
    h = corpus.unigram_entropy(text)
    d = daemon(steps=300, batch_size=16, summary_every=50, iterations_per_loop=25,
               **model_flags(m, optimizer="adamw", learning_rate=3e-3, weight_decay=0.01,
                             lr_schedule="cosine", warmup_steps=20, decay_steps=300))
    r = infeed.feed(d.listen, corpus.windows(text, m["block"], 16, 0), name="text")
    assert r.ended, r
    assert d.wait() == 0, d.log()
    last = [s for s in d.summaries() if s.get("event") == "train"][-1]
    assert last["loss"] < h - 0.2, (last["loss"], h)


def test_charlm_two_hosts_equal_one_host_with_two_replicas(tmp_path, rng):
    """2 hosts x 1 replica under mpirun and 1 host x 2 replicas: the same per-step losses and
    the same parameters bit for bit (docs/multihost.md)."""
    from helpers import mpi_skip_reason
    reason = mpi_skip_reason()
    if reason is not None:
        pytest.skip(str(reason))
    import threading

    from mpi_job import Job, last_params, train_losses
    m = random_model(rng)
    steps, batch = rng.randint(5, 15), 2 * rng.randint(1, 3)
    data = token_batches(rng.randrange(1 << 30), steps, batch, m)
    common = model_flags(m, batch_size=batch, steps=steps, iterations_per_loop=rng.randint(1, 4),
                         summary_every=1, optimizer="adamw", learning_rate=0.01,
                         weight_decay=0.1, clip_norm=0.5, lr_schedule="cosine", warmup_steps=2,
                         decay_steps=steps)
    runs = {}
    for hosts, replicas in [(2, 1), (1, 2)]:
        job = Job(tmp_path / f"{hosts}x{replicas}", hosts, replicas=replicas,
                  checkpoint_dir=f"{tmp_path}/{hosts}x{replicas}/ck-{{rank}}", **common)

        def run(h, job=job, hosts=hosts):
            r = batch // hosts
            with infeed.Producer(job.listen(h), name=f"text-{h}", timeout=30) as p:
                for b in data:
                    p.send(tokens=b["tokens"][h * r:(h + 1) * r],
                           targets=b["targets"][h * r:(h + 1) * r])
        ts = [threading.Thread(target=run, args=(h,)) for h in range(hosts)]
        for t in ts:
            t.start()
        rc = job.wait(120)
        for t in ts:
            t.join(10)
        assert rc == 0, job.log()
        runs[hosts] = job
    want = train_losses(runs[1])
    assert len(want) == steps
    ref = last_params(runs[1].tmp / "ck-0")
    for h in range(2):
        np.testing.assert_allclose(train_losses(runs[2], h), want, rtol=1e-5)
        assert np.array_equal(last_params(runs[2].tmp / f"ck-{h}")["params"], ref["params"]), h


def test_example_producer_and_sampler(daemon, tmp_path, rng):
    """examples/charlm: produce.py trains a small model until the daemon's --steps end the run;
    sample.py generates --length bytes from its checkpoint through predict mode, the same text
    for the same seed."""
    import subprocess

    m = {"layers": 1, "heads": 2, "width": 16, "block": rng.randint(8, 24), "vocab": 256}
    ck = tmp_path / "ck"
    d = daemon(steps=30, batch_size=4, checkpoint_dir=str(ck),
               **model_flags(m, optimizer="adamw", learning_rate=3e-3))
    ex = ROOT / "examples" / "charlm"
    r = subprocess.run([sys.executable, str(ex / "produce.py"), "--endpoint", d.listen,
                        "--block", str(m["block"]), "--corpus", str(ROOT / "README.md")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "the run ended first" in r.stdout and "unigram entropy" in r.stdout, r.stdout
    assert d.wait() == 0, d.log()
    texts = []
    for _ in range(2):
        d = daemon(mode="predict", batch_size=1, iterations_per_loop=1, checkpoint_dir=str(ck),
                   **model_flags(m))
        r = subprocess.run([sys.executable, str(ex / "sample.py"), "--endpoint", d.listen,
                            "--block", str(m["block"]), "--length", "25", "--prompt", "infeed",
                            "--seed", "7"], capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert d.wait() == 0, d.log()
        texts.append(r.stdout)
    assert texts[0] == texts[1] and texts[0].startswith(b"infeed"), texts
    assert len(texts[0]) == len("infeed") + 25 + 1 and texts[0].endswith(b"\n"), texts
