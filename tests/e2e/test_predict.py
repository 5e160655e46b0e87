"""Predict mode end to end: predictions back to the producer that sent each batch, in order,
padding removed, with several producers at once; the --predictions file; labels refused."""

import json
import threading

import numpy as np
import pytest

import infeed


def predict_daemon(daemon, tmp_path, replicas, batch, features, classes, program="softmax", **kw):
    return daemon(mode="predict", program=program, replicas=replicas, batch_size=batch,
                  features=features, classes=classes, steps=0,
                  predictions=str(tmp_path / "predictions.jsonl"), **kw)


def stream(endpoint, name, x, batch, out, errors):
    """Sends x in batches of `batch` rows (the last partial), then takes every prediction."""
    try:
        with infeed.Producer(endpoint, name=name, timeout=20) as p:
            for i in range(0, len(x), batch):
                p.send(x=x[i:i + batch])
            out[name] = list(p.predictions())
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def check_batches(got, x, batch, classifier=True):
    """got: [(seq, arrays)] for x sent in batches of `batch` rows from seq 0."""
    nb = (len(x) + batch - 1) // batch
    assert [s for s, _ in got] == list(range(nb)), [s for s, _ in got]
    rows = 0
    for seq, a in got:
        want = min(batch, len(x) - seq * batch)
        if classifier:
            p, c = a["probabilities"], a["classes"]
            assert p.shape[0] == want and c.shape == (want,), (seq, p.shape, c.shape)
            np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
            assert (c == p.argmax(axis=1)).all()
        else:
            assert a["outputs"].shape[0] == want
        rows += want
    assert rows == len(x)


def test_predict_1000_rows_batch_64_on_4_replicas(daemon, tmp_path, rng):
    features, classes = rng.randint(2, 9), rng.randint(2, 6)
    d = predict_daemon(daemon, tmp_path, 4, 64, features, classes,
                       iterations_per_loop=rng.randint(1, 20))
    x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(
        (1000, features)).astype(np.float32)
    out, errors = {}, []
    stream(d.listen, "only", x, 64, out, errors)
    assert not errors, errors
    assert d.wait() == 0, d.log()
    got = out["only"]
    check_batches(got, x, 64)
    # the file holds the same predictions, a row a line, in the same order
    lines = [json.loads(s) for s in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 1000
    flat = np.concatenate([a["probabilities"] for _, a in got])
    np.testing.assert_allclose(np.array([r["probabilities"] for r in lines]), flat, rtol=1e-6)
    assert [r["class"] if "class" in r else r["classes"] for r in lines] == \
        list(np.concatenate([a["classes"] for _, a in got]))
    assert lines[-1]["seq"] == 15 and lines[-1]["row"] == 1000 - 15 * 64 - 1
    end = d.end_summary()
    assert end["status"] == "ok" and end["reason"] == "input_ended", end
    assert end["steps"] == 16, end  # the stopping-signal batch is not a step
    assert "stopping signal" in end.get("message", ""), end


def test_several_producers_each_get_their_own(daemon, tmp_path, rng):
    replicas = rng.randint(1, 4)
    batch = replicas * rng.randint(1, 8)
    features, classes = rng.randint(1, 6), rng.randint(2, 5)
    n = rng.randint(2, 4)
    d = predict_daemon(daemon, tmp_path, replicas, batch, features, classes, expect_producers=n,
                       iterations_per_loop=rng.randint(1, 9))
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    xs = {f"p{i}": nrng.standard_normal((rng.randint(1, 12 * batch), features)).astype(np.float32)
          for i in range(n)}
    out, errors = {}, []
    ts = [threading.Thread(target=stream, args=(d.listen, name, x, batch, out, errors))
          for name, x in xs.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert d.wait() == 0, d.log()
    lines = [json.loads(s) for s in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    for name, x in xs.items():
        check_batches(out[name], x, batch)
        mine = [r for r in lines if r["producer"] == name]
        assert len(mine) == len(x), (name, len(mine), len(x))
        np.testing.assert_allclose(np.array([r["probabilities"] for r in mine]),
                                   np.concatenate([a["probabilities"] for _, a in out[name]]),
                                   rtol=1e-6)
    # identical rows give identical predictions whoever sent them: routing is by batch
    a, b = list(xs)[:2]
    rows = min(len(xs[a]), len(xs[b]))
    pa = np.concatenate([v["probabilities"] for _, v in out[a]])[:rows]
    pb = np.concatenate([v["probabilities"] for _, v in out[b]])[:rows]
    same = (xs[a][:rows] == xs[b][:rows]).all(axis=1)
    assert not same.any()  # random data: no shared rows
    assert not np.allclose(pa, pb)


def test_linear_outputs(daemon, tmp_path, rng):
    d = predict_daemon(daemon, tmp_path, 2, 8, 3, 2, program="linear")
    x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal((21, 3)).astype(np.float32)
    out, errors = {}, []
    stream(d.listen, "lin", x, 8, out, errors)
    assert not errors, errors
    assert d.wait() == 0, d.log()
    check_batches(out["lin"], x, 8, classifier=False)


def test_predict_takes_no_labels(daemon, tmp_path):
    d = predict_daemon(daemon, tmp_path, 1, 4, 3, 2)
    with pytest.raises(infeed.InfeedError) as e:
        infeed.Producer(d.listen, schema=[("x", "float32", [3]), ("y", "int32", [])], timeout=10)
    assert e.value.code == "ESHAPE" and "predict" in e.value.message, e.value
    with infeed.Producer(d.listen, name="ok", timeout=10) as p:
        with pytest.raises(infeed.InfeedError) as e:
            p.send(x=np.zeros((5, 3), np.float32))  # more rows than the batch size
            p.wait()
        assert "rows" in e.value.message and "1 to 4" in e.value.message, e.value
        p.send(x=np.zeros((3, 3), np.float32))
        got = list(p.predictions())
    assert [s for s, _ in got] == [1] and got[0][1]["classes"].shape == (3,)
    assert d.wait() == 0, d.log()
