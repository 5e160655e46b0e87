"""./demo.sh (the README's first command): the model flags reach its train, eval and predict
daemons, and it stops at once when the training daemon exits early."""

import json
import re
import subprocess
import time

import pytest

from conftest import ROOT


def run_demo(tmp_path, *args, timeout=240):
    from conftest import infeedd_path

    exe = infeedd_path()
    if exe is None:
        pytest.skip("infeedd is not built (set INFEEDD)")
    import os

    env = dict(os.environ, INFEEDD=exe, DEMO_OUT=str(tmp_path))
    t0 = time.monotonic()
    r = subprocess.run([str(ROOT / "demo.sh"), *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    return r, time.monotonic() - t0


def test_demo_trains_evaluates_and_predicts_an_mlp(tmp_path):
    """The model flags given to the demo reach the eval and predict daemons too (they load the
    training run's mlp checkpoint)."""
    r, _ = run_demo(tmp_path, "--program", "mlp", "--hidden", "32", "--steps", "200")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert re.search(r"eval: global step 200, loss [0-9.]+, held-out accuracy", out), out
    assert "predict: 5 batches, 297 predictions" in out, out
    png = tmp_path / "demo-run.png"
    assert f"== plot: loss, accuracy, examples/s and infeed wait against the step: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ends = [json.loads(line) for line in (tmp_path / "demo-summaries.jsonl").open()
            if '"end"' in line]
    assert [(e["mode"], e["status"]) for e in ends] == [("train", "ok"), ("eval", "ok"),
                                                        ("predict", "ok")], ends


def test_demo_stops_at_once_when_the_daemon_exits_early(tmp_path):
    r, took = run_demo(tmp_path, "--watchdog", "-1")  # the training daemon refuses its flags
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "--watchdog" in out and "infeedd exited with status 2 before the producer" in out, out
    assert "no daemon answered" not in out, out  # it did not wait for the producer to give up
    assert took < 9, f"the demo took {took:.1f} s to notice"
