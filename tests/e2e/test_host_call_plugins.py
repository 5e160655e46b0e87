"""Host call plugins (include/infeed/host_call.h, --host-call-lib): examples/host_call's
calibration ($INFEED_CALIBRATION_PLUGIN) runs over every step's class, confidence and label and
writes its values into each train summary's host_calls, agreeing with the summary's own counts;
a program that lacks a tensor it takes, a missing file and a plugin of another ABI end infeedd
with exit 2 and a sentence."""

import os

import numpy as np
import pytest

import infeed
from conftest import run_infeedd
from helpers import stream_until_end

CAL = os.environ.get("INFEED_CALIBRATION_PLUGIN")
pytestmark = pytest.mark.skipif(not CAL, reason="the test plugins are not built "
                                                "(set INFEED_CALIBRATION_PLUGIN)")


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_calibration_runs_every_window(daemon, rng, replicas):
    features, classes = rng.randint(2, 6), rng.randint(2, 5)
    batch, steps, every = replicas * rng.randint(1, 6), rng.randint(4, 30), rng.randint(1, 5)
    d = daemon(host_call_lib=CAL, program="softmax", features=features, classes=classes,
               replicas=replicas, batch_size=batch, steps=steps, summary_every=every,
               iterations_per_loop=rng.randint(1, 5))
    nrng = np.random.default_rng(rng.randrange(1 << 30))

    def make(i):
        y = nrng.integers(0, classes, batch, dtype=np.int32)
        x = (np.eye(classes, features, dtype=np.float32)[y] +
             0.5 * nrng.standard_normal((batch, features))).astype(np.float32)
        return {"x": x, "y": y}

    stream_until_end(d.listen, make)
    assert d.wait() == 0, d.log()
    train = [s for s in d.summaries() if s["event"] == "train"]
    assert train and sum(s["steps"] for s in train) == steps
    for s in train:
        cal = s["host_calls"]["calibration"]
        # every row of the window, right or wrong as the summary's accuracy counts them
        assert cal["right"] + cal["wrong"] == s["examples"], s
        assert cal["right"] / s["examples"] == pytest.approx(s["accuracy"], abs=1e-9), s
        for key, n in (("confidence_right", cal["right"]), ("confidence_wrong", cal["wrong"])):
            if n:
                assert 1.0 / classes - 1e-6 <= cal[key] <= 1.0, s
            else:
                assert cal[key] is None, s


def test_a_program_without_the_tensors_is_refused():
    r = run_infeedd("--host-call-lib", CAL, "--program", "linear", "--features", "2",
                    "--classes", "1", "--steps", "1")
    assert r.returncode == 2, r.stderr
    assert "host call 'calibration' takes tensor 'class', which program 'linear' does not " \
           "outfeed" in r.stderr, r.stderr


@pytest.mark.parametrize("path,words", [
    ("/no/such/file.so", "flag --host-call-lib: host call library '/no/such/file.so': cannot "
                         "load it: "),
    ("", "flag --host-call-lib: expected a file name, got ''")])
def test_unusable_libraries_exit_2(path, words):
    r = run_infeedd("--host-call-lib", path, "--program", "softmax", "--features", "2",
                    "--classes", "2", "--steps", "1")
    assert r.returncode == 2 and words in r.stderr, r.stderr


def test_help_names_host_call_lib():
    r = run_infeedd("--help")
    assert "--host-call-lib PATH.so" in r.stdout and "include/infeed/host_call.h" in r.stdout
