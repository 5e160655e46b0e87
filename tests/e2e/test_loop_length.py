"""Loop lengths chosen for the user (docs/config.md, iterations_per_loop; docs/design.md, "Loop
lengths"): `--iterations-per-loop auto` and a duration (`2s`, `1.5s`, `500ms`), from a flag or
the config file. The lengths vary with the machine, so only what must hold whatever they are is
asserted: the run ends exactly at its last step, checkpoints fall on exact multiples, summaries
come at the same steps and say the length of their loop, eval runs one loop; a bad value is a
one-line config error naming the key, what was expected and what was given."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ckpt
import infeed
from conftest import run_infeedd
from helpers import stream_until_end


def random_form(rng) -> str:
    return rng.choice(["auto", f"{rng.randint(1, 20)}ms", f"0.{rng.randint(1, 9)}s",
                       f"{rng.randint(1, 9)}.5ms"])


def data(seed: int, batch: int, features: int, classes: int):
    r = np.random.default_rng(seed)

    def make(i):
        return {"x": r.standard_normal((batch, features)).astype(np.float32),
                "y": r.integers(0, classes, batch, dtype=np.int32)}
    return make


@pytest.mark.parametrize("where", ["flag", "file"])
def test_train_with_automatic_lengths(daemon, tmp_path, rng, where):
    form = random_form(rng)
    steps, every, ck = rng.randint(1, 2500), rng.randint(1, 40), rng.randint(1, 300)
    features, classes, batch = rng.randint(1, 8), rng.randint(2, 5), rng.randint(1, 4)
    print(f"{form} from the {where}: {steps} steps, a summary every {every}, a checkpoint "
          f"every {ck}")
    flags = dict(program="softmax", features=features, classes=classes, batch_size=batch,
                 steps=steps, summary_every=every, checkpoint_dir=str(tmp_path / "ck"),
                 checkpoint_every=ck, keep_checkpoints=100000,
                 max_loop_seconds=rng.choice([0.05, 0.5, 2]))
    if where == "flag":
        flags["iterations_per_loop"] = form
    else:
        cfg = tmp_path / "infeedd.json"
        cfg.write_text(json.dumps({"iterations_per_loop": form}))
        flags["config"] = str(cfg)
    d = daemon(**flags)
    stream_until_end(d.listen, data(rng.randrange(1 << 30), batch, features, classes))
    assert d.wait() == 0, d.log()
    end = d.end_summary()
    assert end["status"] == "ok" and end["reason"] == "last_step", end
    assert end["global_step"] == steps, end
    train = [s for s in d.summaries() if s["event"] == "train"]
    want = list(range(every, steps + 1, every))
    if steps % every:
        want.append(steps)
    assert [s["global_step"] for s in train] == want, [s["global_step"] for s in train]
    assert sum(s["steps"] for s in train) == steps
    for s in train:  # a loop's length: the steps from the loop's start to this summary at least
        assert isinstance(s["iterations_per_loop"], int) and s["iterations_per_loop"] >= 1, s
    got = [int(p.stem[5:]) for p in ckpt.files(tmp_path / "ck")]
    multiples = list(range(ck, steps + 1, ck))
    assert got == multiples + ([steps] if steps % ck else []), (got, ck, steps)
    kind = "chosen as it runs" if form == "auto" else "loops of about"
    assert kind in d.log_path.read_text(), d.log()


def test_eval_runs_one_loop_whatever_the_form(daemon, tmp_path, rng):
    features, classes, batch = rng.randint(1, 8), rng.randint(2, 5), rng.randint(1, 4)
    common = dict(program="softmax", features=features, classes=classes, batch_size=batch)
    tr = daemon(steps=3, checkpoint_dir=str(tmp_path / "ck"), **common)
    stream_until_end(tr.listen, data(1, batch, features, classes))
    assert tr.wait() == 0, tr.log()
    steps = rng.randint(1, 400)
    ev = daemon(mode="eval", steps=steps, checkpoint_dir=str(tmp_path / "ck"),
                iterations_per_loop=random_form(rng), **common)
    stream_until_end(ev.listen, data(2, batch, features, classes))
    assert ev.wait() == 0, ev.log()
    (s,) = [s for s in ev.summaries() if s["event"] == "eval"]
    assert s["steps"] == steps and s["iterations_per_loop"] == steps, s
    assert f"one loop of {steps} steps" in ev.log(), ev.log()


@pytest.mark.parametrize("value", ["2x", "0s", "-1", "autox", "0", "0ms", "s", "1e3", "-2s",
                                   "90000s", " 2s", "2 s", "nans", "AUTO"])
def test_bad_values_name_the_key(value):
    r = run_infeedd("--features", "4", "--classes", "3", "--steps", "10",
                    f"--iterations-per-loop={value}")
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    line = out.strip().splitlines()[-1]
    assert line.startswith("infeedd: ") and "--iterations-per-loop" in line, line
    if value == "90000s":
        assert "expected a duration of at most 86400 s, got '90000s'" in line, line
    elif value.lstrip("-").isdigit():
        assert f"expected a positive integer (steps), auto, or a duration such as 2s or 500ms, " \
               f"got {value}" in line, line
    else:
        assert "expected a positive integer (steps), auto, or a duration" in line, line
        assert f"got '{value}'" in line, line


def test_bad_values_in_the_file_and_the_bound(tmp_path, rng):
    p = tmp_path / "infeedd.json"
    for value, got in [(1.5, "the number 1.5"), (True, "true"), ([100], "an array")]:
        p.write_text(json.dumps({"iterations_per_loop": value}))
        r = run_infeedd("--config", str(p), "--features", "4", "--classes", "3", "--steps", "1")
        line = (r.stdout + r.stderr).strip().splitlines()[-1]
        assert r.returncode == 2, line
        assert f"key 'iterations_per_loop': expected an integer or a string (auto, or a " \
               f"duration such as 2s or 500ms), got {got}" in line, line
    p.write_text(json.dumps({"iterations_per_loop": "3y"}))
    r = run_infeedd("--config", str(p), "--features", "4", "--classes", "3", "--steps", "1")
    assert r.returncode == 2 and "key 'iterations_per_loop'" in r.stderr and "got '3y'" in r.stderr
    bad = rng.choice(["0", "-1", "86401"])
    r = run_infeedd("--features", "4", "--classes", "3", "--steps", "1", "--max-loop-seconds", bad)
    assert r.returncode == 2, r.stderr
    assert f"--max-loop-seconds: expected seconds above 0, at most 86400, got {bad}" in r.stderr, \
        r.stderr
