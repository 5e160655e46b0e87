"""The examples against a real daemon: the Python digits trainer and the C producer."""

import re
import subprocess
import sys

import numpy as np
import pytest

import infeed
from conftest import ROOT, dead_tcp_endpoint
from helpers import c_producer, run_program, status_until

DIGITS = ROOT / "examples" / "digits" / "train_digits.py"


def test_digits_demo(daemon):
    pytest.importorskip("sklearn")
    d = daemon(replicas=2, program="softmax", features=64, classes=10, batch_size=64,
               iterations_per_loop=20, steps=600, summary_every=50)
    r = run_program([sys.executable, str(DIGITS), "--endpoint", d.listen, "--publish", d.publish,
             "--seed", "3"])
    assert r.returncode == 0, r.stderr
    assert d.wait() == 0, d.log()
    lines = r.stdout.splitlines()
    steps = [int(m.group(1)) for m in (re.match(r"step (\d+)  loss [0-9.]+  accuracy [0-9.]+  "
                                                r"\d+ ex/s", ln) for ln in lines) if m]
    assert steps and steps[-1] == 600, r.stdout
    acc = float(re.search(r"final training accuracy: ([0-9.]+)", r.stdout).group(1))
    assert acc > 0.9, r.stdout
    end = d.end_summary()
    assert (end["status"], end["reason"], end["global_step"]) == ("ok", "last_step", 600)


def last_train(d) -> dict:
    train = [s for s in d.summaries() if s["event"] == "train"]
    assert train, d.log()
    return train[-1]


def test_digits_mlp_beats_softmax(daemon):
    """Issue 4: mlp (one hidden layer) beats softmax on digits with the same steps, batch,
    learning rate, seeds and data order. Both runs are deterministic (the cpu all-reduce sums in
    a fixed order and the script shuffles from --seed), so the margin does not vary from run to
    run; it is wide (at step 300: loss 0.24 against 0.62, accuracy 0.95 against 0.92)."""
    pytest.importorskip("sklearn")
    common = dict(replicas=2, features=64, classes=10, batch_size=64, iterations_per_loop=20,
                  steps=300, summary_every=50, learning_rate=0.1, seed=7)
    final = {}
    for program, extra in (("softmax", {}), ("mlp", {"hidden": 64})):
        d = daemon(program=program, **common, **extra)
        argv = [sys.executable, str(DIGITS), "--endpoint", d.listen, "--publish", d.publish,
                "--seed", "3", "--program", program]
        if extra:
            argv += ["--hidden", "64"]
        r = run_program(argv)
        assert r.returncode == 0, r.stderr
        assert d.wait() == 0, d.log()
        assert (program + (" (hidden 64)" if extra else "")) in r.stdout, r.stdout
        end = d.end_summary()
        assert (end["status"], end["global_step"]) == ("ok", 300), end
        final[program] = last_train(d)
        assert final[program]["global_step"] == 300, final[program]
    m, s = final["mlp"], final["softmax"]
    print(f"step 300: mlp loss {m['loss']:.3f} accuracy {m['accuracy']:.3f}; "
          f"softmax loss {s['loss']:.3f} accuracy {s['accuracy']:.3f}")
    assert m["loss"] < 0.7 * s["loss"] and m["accuracy"] > s["accuracy"], (m, s)


def test_digits_refuses_another_model(daemon):
    pytest.importorskip("sklearn")
    d = daemon(replicas=1, program="softmax", features=64, classes=10, batch_size=8, steps=10)
    r = run_program([sys.executable, str(DIGITS), "--endpoint", d.listen, "--publish", d.publish,
             "--program", "mlp", "--hidden", "32"], timeout=30)
    assert r.returncode == 1, r.stdout
    assert "program 'softmax', expected 'mlp'" in r.stderr, r.stderr
    assert "hidden width None, expected 32" in r.stderr, r.stderr
    st = d.control({"cmd": "status"})
    assert st["batches_accepted"] == 0, st


def test_digits_epochs_end_the_input(daemon):
    pytest.importorskip("sklearn")
    d = daemon(replicas=2, program="softmax", features=64, classes=10, batch_size=64,
               iterations_per_loop=20, steps=100000, summary_every=10)
    r = run_program([sys.executable, str(DIGITS), "--endpoint", d.listen, "--publish", d.publish,
             "--epochs", "2"])
    assert r.returncode == 0, r.stderr
    assert d.wait() == 0, d.log()
    end = d.end_summary()
    assert (end["reason"], end["global_step"]) == ("input_ended", 2 * (1797 // 64)), end
    assert "2 epochs sent" in r.stdout


def test_digits_wrong_daemon_schema(daemon):
    pytest.importorskip("sklearn")
    d = daemon(replicas=1, program="softmax", features=10, classes=10, batch_size=8, steps=10)
    r = run_program([sys.executable, str(DIGITS), "--endpoint", d.listen, "--publish", d.publish],
            timeout=30)
    assert r.returncode == 1 and "ESHAPE" in r.stderr and "'x'" in r.stderr, r.stderr


def test_c_producer_until_last_step(daemon):
    exe = c_producer()
    d = daemon(replicas=2, program="softmax", features=16, classes=4, batch_size=32,
               iterations_per_loop=10, steps=150, summary_every=50)
    r = run_program([exe, "--endpoint", d.listen, "--features", "16", "--classes", "4", "--batches",
             "1000"])
    assert r.returncode == 0, r.stderr
    assert d.wait() == 0, d.log()
    summ = d.summaries()
    assert (summ[-1]["reason"], summ[-1]["global_step"]) == ("last_step", 150), summ[-1]
    train = [s for s in summ if s["event"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"], train  # a learnable task


def test_c_producer_no_daemon_says_the_readme_sentence():
    """With no daemon at the endpoint the C example ends (exit 1) with the sentence the README
    quotes for the C client, at its default timeouts (hello's equals the connect timeout, 10 s:
    it said "no WELCOME ... within 10000 ms"); the README names where the build puts it."""
    exe = c_producer()
    text = ROOT.joinpath("README.md").read_text()
    assert "`build/clients/c/infeed-producer-example`" in text
    assert exe.endswith("clients/c/infeed-producer-example"), exe
    m = re.search(r'IFD_ETIMEDOUT`\s+with the same sentence \("(.*?)"\)', text, re.S)
    assert m, "the README no longer quotes the C client's sentence"
    sentence = " ".join(m.group(1).split())
    endpoint = dead_tcp_endpoint()
    r = run_program([exe, "--endpoint", endpoint, "--features", "4", "--classes", "2"], timeout=60)
    assert r.returncode == 1, r.stderr
    assert sentence.replace("tcp://127.0.0.1:5555", endpoint) in r.stderr, (sentence, r.stderr)


def test_c_and_python_producers_together(daemon):
    exe = c_producer()
    d = daemon(replicas=2, program="softmax", features=16, classes=4, batch_size=32,
               iterations_per_loop=7, steps=100000, summary_every=0)
    rng = np.random.default_rng(0)
    # The input ends when every producer welcomed so far has sent END: both say HELLO first.
    with infeed.Producer(d.listen, name="py", schema=[("x", "float32", (16,)), ("y", "int32", ())],
                         timeout=20) as p:
        c = subprocess.Popen([exe, "--endpoint", d.listen, "--features", "16", "--classes", "4",
                              "--batches", "40", "--name", "c"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        status_until(d, lambda st: any(pr.get("name") == "c" for pr in st["producers"])
                     or c.poll() is not None, 20, "the C producer's HELLO")
        assert c.poll() is None, c.communicate()
        for _ in range(25):
            p.send(x=rng.uniform(-1, 1, (32, 16)).astype(np.float32),
                   y=rng.integers(0, 4, 32, dtype=np.int32))
        p.end(wait_bye=False)
        out, err = c.communicate(timeout=30)
        assert c.returncode == 0, err
        p.end()  # now the BYE
    assert p.bye["reason"] == "input_ended" and p.bye["global_step"] == 65, p.bye
    assert d.wait() == 0, d.log()
    assert d.end_summary()["global_step"] == 65


SCORE = ROOT / "examples" / "digits" / "score_digits.py"


def test_digits_holdout_eval_and_predict(daemon, tmp_path):
    """The demo's second half: train on all but the held-out rows with checkpoints, then score
    the last checkpoint on them in eval mode (its summary) and in predict mode (every row's class
    back, the last batch partial); both accuracies are about the same and well above chance."""
    pytest.importorskip("sklearn")
    ck, holdout = str(tmp_path / "ck"), 297
    model = dict(replicas=2, program="softmax", features=64, classes=10, batch_size=64)
    d = daemon(**model, iterations_per_loop=20, steps=300, learning_rate=0.5,
               checkpoint_dir=ck, checkpoint_every=100)
    r = run_program([sys.executable, str(DIGITS), "--endpoint", d.listen, "--publish", d.publish,
             "--holdout", str(holdout)])
    assert r.returncode == 0 and d.wait() == 0, (r.stderr, d.log())
    d = daemon(**model, mode="eval", steps=4, checkpoint_dir=ck)
    r = run_program([sys.executable, str(SCORE), "--mode", "eval", "--endpoint", d.listen,
             "--publish", d.publish, "--holdout", str(holdout)])
    assert r.returncode == 0 and d.wait() == 0, (r.stderr, d.log())
    m = re.search(r"eval: global step 300, loss [0-9.]+, held-out accuracy ([0-9.]+) over 256 rows",
                  r.stdout)
    assert m, r.stdout
    eval_acc = float(m.group(1))
    d = daemon(**model, mode="predict", steps=0, checkpoint_dir=ck)
    r = run_program([sys.executable, str(SCORE), "--mode", "predict", "--endpoint", d.listen,
             "--holdout", str(holdout)])
    assert r.returncode == 0 and d.wait() == 0, (r.stderr, d.log())
    m = re.search(r"predict: 5 batches, 297 predictions; held-out accuracy from the predicted "
                  r"classes: ([0-9.]+)", r.stdout)
    assert m, r.stdout
    pred_acc = float(m.group(1))
    assert eval_acc > 0.85 and pred_acc > 0.85, (eval_acc, pred_acc)
    # the same model on 256 of the same 297 rows: the accuracies cannot be far apart
    assert abs(eval_acc * 256 - pred_acc * 297) <= 41 + 1, (eval_acc, pred_acc)
