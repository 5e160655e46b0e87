"""Eval mode end to end, and predict from a trained checkpoint: the daemon's eval summary and
predictions equal a NumPy reference computed from the checkpoint's parameters and the same data,
for R = 1..4 replicas."""

import numpy as np
import pytest

import ckpt
import infeed


def params_of(header):
    """{name: array} from a checkpoint read by ckpt.read."""
    out = {}
    for p in header["param_specs"]:
        v = header["params"][p["offset"]:p["offset"] + p["count"]]
        out[p["name"]] = v.reshape(p["shape"]).astype(np.float64)
    return out


def train_checkpoint(daemon, tmp_path, program, replicas, features, classes, seed):
    """A short train run that leaves its final checkpoint in tmp_path/ck; returns the folder."""
    folder = tmp_path / "ck"
    batch = 4 * replicas
    steps = 7
    d = daemon(program=program, replicas=replicas, batch_size=batch, features=features,
               classes=classes, steps=steps, iterations_per_loop=3, checkpoint_dir=str(folder),
               learning_rate=0.2)
    nrng = np.random.default_rng(seed)
    with infeed.Producer(d.listen, name="trainer", timeout=20) as p:
        for _ in range(steps):
            y = (nrng.integers(0, classes, batch, dtype=np.int32) if program == "softmax"
                 else nrng.standard_normal((batch, classes)).astype(np.float32))
            p.send(x=nrng.standard_normal((batch, features)).astype(np.float32), y=y)
    assert d.wait() == 0, d.log()
    return folder


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_eval_equals_numpy_reference(daemon, tmp_path, rng, replicas):
    program = rng.choice(["softmax", "linear"])
    features, classes = rng.randint(1, 9), rng.randint(2, 6)
    folder = train_checkpoint(daemon, tmp_path, program, replicas, features, classes,
                              rng.randrange(1 << 30))
    header = ckpt.read(ckpt.files(folder)[-1])
    w = params_of(header)
    per = rng.randint(1, 9)
    batch, steps = per * replicas, rng.randint(1, 12)
    d = daemon(mode="eval", program=program, replicas=replicas, batch_size=batch,
               features=features, classes=classes, steps=steps, checkpoint_dir=str(folder),
               iterations_per_loop=rng.randint(1, 5))
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    xs, ys = [], []
    with infeed.Producer(d.listen, name="evaluator", timeout=20) as p:
        for _ in range(steps):
            x = nrng.standard_normal((batch, features)).astype(np.float32)
            y = (nrng.integers(0, classes, batch, dtype=np.int32) if program == "softmax"
                 else nrng.standard_normal((batch, classes)).astype(np.float32))
            p.send(x=x, y=y)
            xs.append(x)
            ys.append(y)
    assert d.wait() == 0, d.log()
    x, y = np.concatenate(xs).astype(np.float64), np.concatenate(ys)
    logits = x @ w["W"] + w["b"]
    if program == "softmax":
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = -logp[np.arange(len(y)), y].mean()
        correct = int((logits.argmax(axis=1) == y).sum())
    else:
        loss = (0.5 * ((logits - y) ** 2).sum(axis=1)).mean()
    ev = [s for s in d.summaries() if s["event"] == "eval"]
    assert len(ev) == 1, d.summaries()
    ev = ev[0]
    assert ev["global_step"] == header["global_step"] == 7, (ev, header["global_step"])
    assert ev["examples"] == steps * batch and ev["steps"] == steps, ev
    assert ev["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-6), (ev["loss"], loss)
    if program == "softmax":
        # float32 and float64 logits may order a near tie differently: one example of slack
        assert abs(ev["accuracy"] * len(y) - correct) <= 1, (ev["accuracy"], correct, len(y))
    end = d.end_summary()
    assert end["status"] == "ok" and end["reason"] == "last_step" and end["steps"] == steps, end


def test_predict_from_checkpoint_equals_numpy(daemon, tmp_path, rng):
    replicas = 4
    features, classes = rng.randint(2, 9), rng.randint(2, 6)
    folder = train_checkpoint(daemon, tmp_path, "softmax", replicas, features, classes,
                              rng.randrange(1 << 30))
    w = params_of(ckpt.read(ckpt.files(folder)[-1]))
    d = daemon(mode="predict", replicas=replicas, batch_size=64, features=features,
               classes=classes, steps=0, checkpoint_dir=str(folder))
    x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(
        (1000, features)).astype(np.float32)
    with infeed.Producer(d.listen, name="p", timeout=20) as p:
        for i in range(0, 1000, 64):
            p.send(x=x[i:i + 64])
        got = list(p.predictions())
    assert d.wait() == 0, d.log()
    probs = np.concatenate([a["probabilities"] for _, a in got])
    assert probs.shape == (1000, classes)
    logits = x.astype(np.float64) @ w["W"] + w["b"]
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probs, z / z.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_eval_needs_a_checkpoint(daemon, tmp_path):
    from conftest import run_infeedd
    r = run_infeedd("--mode", "eval", "--steps", "3", "--features", "2", "--classes", "2")
    assert r.returncode == 2 and "checkpoint" in r.stderr and "eval" in r.stderr, r.stderr
    r = run_infeedd("--mode", "eval", "--steps", "3", "--features", "2", "--classes", "2",
                    "--checkpoint-dir", str(tmp_path / "empty"))
    assert r.returncode == 2 and "--checkpoint-dir" in r.stderr, r.stderr
