"""Built-in host calls over outfeed tensors (docs/config.md, "Host calls"): `host_calls` in the
config file and `--host-call` reduce the program's and the runtime's tensors, concatenated over
replicas, into each train summary's `host_calls` (over its window) and the eval summary's (over the
run), equal to what NumPy computes from the same batches; bad host calls end the daemon with a
sentence naming the key."""

import json

import numpy as np
import pytest

import ckpt
import infeed


def softmax_ref(x, w, b):
    z = x.astype(np.float64) @ w + b
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return p.argmax(axis=1), p.max(axis=1)


@pytest.mark.parametrize("replicas,input_mode", [(1, "per-host"), (2, "per-host"),
                                                 (4, "per-host"), (2, "broadcast"),
                                                 (4, "per-host-v2")])
def test_train_windows(daemon, tmp_path, rng, replicas, input_mode):
    features, classes = rng.randint(1, 6), rng.randint(2, 5)
    per = rng.randint(1, 6)
    batches_per_step = replicas if input_mode == "per-host-v2" else 1
    rows = per * replicas if input_mode == "per-host" else per
    every, windows = rng.randint(1, 4), rng.randint(1, 3)
    steps = every * windows
    cfg = tmp_path / "calls.json"
    cfg.write_text(json.dumps({"host_calls": {
        "label": ["sum", "last", "min", "max"], "confidence": ["min", "max"],
        "count": "sum", "learning_rate": "last", "grad_norm": "min"}}))
    d = daemon(config=str(cfg), program="softmax", replicas=replicas, input_mode=input_mode,
               batch_size=per * replicas, features=features, classes=classes, steps=steps,
               summary_every=every, iterations_per_loop=rng.randint(1, 4), learning_rate=0.25)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    ys = []
    with infeed.Producer(d.listen, name="p", timeout=20) as p:
        for _ in range(steps * batches_per_step):
            y = nrng.integers(0, classes, rows, dtype=np.int32)
            p.send(x=nrng.standard_normal((rows, features)).astype(np.float32), y=y)
            ys.append(y)
    assert d.wait() == 0, d.log()
    train = [s for s in d.summaries() if s["event"] == "train"]
    assert len(train) == windows, train
    for k, s in enumerate(train):
        step_ys = ys[k * every * batches_per_step:(k + 1) * every * batches_per_step]
        y = np.concatenate(step_ys)
        hc = s["host_calls"]
        assert set(hc) == {"label", "confidence", "count", "learning_rate", "grad_norm"}, hc
        assert hc["label"]["sum"] == int(y.sum()), (hc, y)
        assert hc["label"]["last"] == int(y[-1]) and hc["label"]["min"] == int(y.min()), hc
        assert hc["label"]["max"] == int(y.max()), hc
        assert 1.0 / classes - 1e-6 <= hc["confidence"]["min"] <= hc["confidence"]["max"] <= 1, hc
        assert hc["count"]["sum"] == len(y), hc
        assert hc["learning_rate"]["last"] == pytest.approx(0.25), hc
        assert hc["grad_norm"]["min"] > 0, hc


def test_eval_over_the_run(daemon, tmp_path, rng):
    """Eval: class and confidence over every step of the run, once, against NumPy on the
    checkpoint's parameters; the flag's form."""
    replicas, features, classes = rng.randint(1, 4), rng.randint(2, 6), rng.randint(2, 5)
    folder = tmp_path / "ck"
    d = daemon(program="softmax", replicas=replicas, batch_size=4 * replicas, features=features,
               classes=classes, steps=3, checkpoint_dir=str(folder), learning_rate=0.5)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    with infeed.Producer(d.listen, name="t", timeout=20) as p:
        for _ in range(3):
            p.send(x=nrng.standard_normal((4 * replicas, features)).astype(np.float32),
                   y=nrng.integers(0, classes, 4 * replicas, dtype=np.int32))
    assert d.wait() == 0, d.log()
    header = ckpt.read(ckpt.files(folder)[-1])
    prm = {s["name"]: np.asarray(header["params"][s["offset"]:s["offset"] + s["count"]],
                                 np.float64).reshape(s["shape"]) for s in header["param_specs"]}
    per, steps = rng.randint(1, 6), rng.randint(1, 8)
    batch = per * replicas
    d = daemon(mode="eval", program="softmax", replicas=replicas, batch_size=batch,
               features=features, classes=classes, steps=steps, checkpoint_dir=str(folder),
               host_call="confidence=mean,sum,min,max")
    xs = []
    with infeed.Producer(d.listen, name="e", timeout=20) as p:
        for _ in range(steps):
            x = nrng.standard_normal((batch, features)).astype(np.float32)
            p.send(x=x, y=nrng.integers(0, classes, batch, dtype=np.int32))
            xs.append(x)
    assert d.wait() == 0, d.log()
    _, conf = softmax_ref(np.concatenate(xs), prm["W"], prm["b"])
    ev = [s for s in d.summaries() if s["event"] == "eval"]
    assert len(ev) == 1, d.summaries()
    c = ev[0]["host_calls"]["confidence"]
    assert c["mean"] == pytest.approx(conf.mean(), rel=1e-5), (c, conf)
    assert c["sum"] == pytest.approx(conf.sum(), rel=1e-5), (c, conf)
    assert c["min"] == pytest.approx(conf.min(), rel=1e-5), (c, conf)
    assert c["max"] == pytest.approx(conf.max(), rel=1e-5), (c, conf)


@pytest.mark.parametrize("flags,words", [
    (dict(host_call="nope=mean"),
     ["--host-call: tensor 'nope' of host call 'mean' is not an outfeed tensor of program "
      "'softmax' in this mode; its tensors are class, confidence, label, loss, correct, count, "
      "grad_norm, param_norm, learning_rate"]),
    (dict(host_call="confidence"), ["flag --host-call: expected NAME=SPEC[,SPEC...]"]),
    (dict(host_call="grad_norm=mean", mode="predict"), ["--host-call: expected none in predict"]),
    (dict(host_call="grad_norm=mean", mode="eval"), ["tensor 'grad_norm' of host call 'mean'"]),
    (dict(host_call="confidence=histogram,histogram:bins=4,range=0:1"),
     ["--host-call: host calls 'histogram' and 'histogram:bins=4,range=0:1' of tensor "
      "'confidence' would both be its summary's 'histogram': expected one of them"]),
])
def test_bad_host_calls(daemon, flags, words):
    d = daemon(program="softmax", features=3, classes=2, steps=1, wait_ready=False, **flags)
    assert d.wait() == 2, d.log()
    for w in words:
        assert w in d.log(), (w, d.log())
