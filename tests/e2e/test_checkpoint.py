"""Checkpoints end to end (docs/checkpoint.md): a run killed with SIGKILL and resumed, its
producer replaying from WELCOME's next_seq, ends with the state of a run that was never
interrupted; a checkpoint written by another program (tests/e2e/ckpt.py) starts a run; one that
cannot start the run is a one-line config error."""

import re
import signal

import numpy as np
import pytest

import ckpt
import infeed
from conftest import run_infeedd
from helpers import seeded_batch, wait_until

FEATURES, CLASSES, BATCH = 5, 3, 8


def batch(seq: int) -> dict:
    """The stream's batch with sequence number seq: the same bytes whenever it is made."""
    return seeded_batch(1000 + seq, BATCH, FEATURES, CLASSES)


def flags(folder, **kw) -> dict:
    f = dict(replicas=2, batch_size=BATCH, features=FEATURES, classes=CLASSES, program="softmax",
             optimizer="adam", learning_rate=0.05, iterations_per_loop=5, summary_every=0, seed=7,
             checkpoint_dir=str(folder), checkpoint_every=10)
    f.update(kw)
    return f


def stream(endpoint: str, last: int) -> infeed.Producer:
    """Streams batches 0..last-1 as 'loader-0', skipping those the daemon has consumed, then END
    and BYE."""
    p = infeed.Producer(endpoint, name="loader-0", timeout=20)
    for b in p.skip_consumed(batch(i) for i in range(last)):
        p.send(b)
    p.end()
    p.close()
    return p


def test_sigkill_and_resume_equals_uninterrupted(daemon, tmp_path):
    last = 60
    ref = daemon(**flags(tmp_path / "ref", last_step=last))
    p = stream(ref.listen, last)
    assert ref.wait() == 0, ref.log()
    assert p.resume_seq == 0 and p.bye["global_step"] == last
    want = ckpt.read(ckpt.files(tmp_path / "ref")[-1])
    assert want["global_step"] == last and want["opt_step"] == last
    assert want["producers"] == {"loader-0": last - 1}

    # The interrupted run: 33 batches, then the producer pauses. Checkpoints at 10, 20, 30; steps
    # 31 to 33 run in a loop that waits for its 34th batch when the daemon is killed, so they are
    # consumed (and acknowledged) but in no checkpoint.
    folder = tmp_path / "run"
    d1 = daemon(**flags(folder, last_step=last))
    p1 = infeed.Producer(d1.listen, name="loader-0", timeout=20)
    for i in range(33):
        p1.send(batch(i))
    wait_until(lambda: d1.control({"cmd": "status"})["global_step"] == 33, "global step 33", d1)
    d1.signal(signal.SIGKILL)
    assert d1.wait() == -signal.SIGKILL
    p1.close()
    files = ckpt.files(folder)
    assert [f.name for f in files] == [f"ckpt-{s:012d}.ifdckpt" for s in (10, 20, 30)], files
    assert ckpt.read(files[-1])["producers"] == {"loader-0": 29}
    assert not list(folder.glob(".ckpt-*")), "a temporary file outlived its write"

    # Resumed: the global step continues at 30, --last-step counts from 0, and the producer,
    # reconnecting under its name, is told to start again at 30 (not 33, what was acknowledged).
    d2 = daemon(**flags(folder, last_step=last, resume=True))
    p2 = stream(d2.listen, last)
    assert d2.wait() == 0, d2.log()
    assert p2.resume_seq == 30, p2.welcome
    assert p2.bye["status"] == "ok" and p2.bye["global_step"] == last, p2.bye
    end = d2.end_summary()
    assert end["global_step"] == last and end["steps"] == last - 30, end
    got = ckpt.read(ckpt.files(folder)[-1])
    assert got["global_step"] == last and got["opt_step"] == last
    assert got["producers"] == {"loader-0": last - 1}
    # the cpu backend is deterministic: the same bits
    np.testing.assert_array_equal(got["params"], want["params"])
    np.testing.assert_array_equal(got["slots"], want["slots"])
    assert len(ckpt.files(folder)) == 5  # 20 to 60 by 10: --keep-checkpoints' default


def softmax_header(step: int, producers: dict, optimizer: str = "adam") -> dict:
    nslots = {"sgd": 0, "momentum": 1, "adam": 2}[optimizer]
    return {"format": "infeed-checkpoint", "program": "softmax",
            "settings": {"features": FEATURES, "classes": CLASSES, "hidden": 0},
            "params": [{"name": "W", "shape": [FEATURES, CLASSES], "offset": 0,
                        "count": FEATURES * CLASSES},
                       {"name": "b", "shape": [CLASSES], "offset": FEATURES * CLASSES,
                        "count": CLASSES}],
            "nparam_floats": FEATURES * CLASSES + CLASSES,
            "optimizer": {"kind": optimizer, "slots": nslots, "learning_rate": 0.05,
                          "momentum": 0.9, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
            "global_step": step, "opt_step": step, "producers": producers}


def test_starts_from_a_file_another_program_wrote(daemon, tmp_path):
    n = FEATURES * CLASSES + CLASSES
    params = np.arange(n, dtype=np.float32) / n
    path = tmp_path / "start.ifdckpt"
    ckpt.write(path, softmax_header(40, {"loader-0": 39, "other": 7}), params,
               np.zeros((2, n), np.float32))
    # --steps counts from the checkpoint's step
    d = daemon(**flags(tmp_path / "out", steps=5, checkpoint=str(path), checkpoint_every=0))
    p = infeed.Producer(d.listen, name="loader-0", timeout=20)
    sent = [b for b in p.skip_consumed(batch(i) for i in range(45))]
    assert p.resume_seq == 40 and len(sent) == 5
    for b in sent:
        p.send(b)
    assert p.end()["global_step"] == 45
    p.close()
    assert d.wait() == 0, d.log()
    got = ckpt.read(ckpt.files(tmp_path / "out")[-1])
    assert got["global_step"] == 45 and got["opt_step"] == 45
    # a producer that did not come back keeps its position
    assert got["producers"] == {"loader-0": 44, "other": 7}
    assert not np.array_equal(got["params"], params)  # it trained


def one_line_error(*args) -> str:
    r = run_infeedd(*args)
    assert r.returncode == 2, f"{args}: exit {r.returncode}:\n{r.stdout}{r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infeedd: "), r.stderr
    return lines[0]


BASE = ["--features", str(FEATURES), "--classes", str(CLASSES), "--batch-size", str(BATCH),
        "--steps", "5", "--optimizer", "adam"]


@pytest.mark.parametrize("damage,words", [
    ("none", []),
    ("program", ["program", "'softmax'", "'linear'"]),
    ("features", ["settings.features", "has 5", "this run 6"]),
    ("optimizer", ["optimizer", "adam", "sgd"]),
    ("flip", ["checksum", "corrupt"]),
    ("truncate", ["truncated"]),
    ("magic", ["magic"]),
])
def test_a_checkpoint_that_cannot_start_the_run(tmp_path, damage, words):
    n = FEATURES * CLASSES + CLASSES
    folder = tmp_path / "ck"
    folder.mkdir()
    path = folder / "ckpt-000000000040.ifdckpt"
    ckpt.write(path, softmax_header(40, {"a": 1}), np.ones(n, np.float32),
               np.zeros((2, n), np.float32))
    args = list(BASE)
    data = bytearray(path.read_bytes())
    if damage == "none":  # what the other cases change: an empty folder, and a missing flag
        empty = tmp_path / "empty"
        empty.mkdir()
        line = one_line_error(*args, "--checkpoint-dir", str(empty), "--resume")
        assert "no checkpoint" in line and str(empty) in line, line
        # a fresh run, or one from an older file, in a folder that is ahead of it
        line = one_line_error(*args, "--checkpoint-dir", str(folder))
        assert "global step 40" in line and "--resume" in line, line
        older = tmp_path / "older.ifdckpt"
        ckpt.write(older, softmax_header(20, {}), np.ones(n, np.float32),
                   np.zeros((2, n), np.float32))
        line = one_line_error(*args, "--checkpoint-dir", str(folder), "--checkpoint", str(older))
        assert "ahead of this run's start at 20" in line, line
        line = one_line_error(*args, "--resume")
        assert "--checkpoint-dir" in line, line  # named as a flag: the user typed flags
        line = one_line_error(*args, "--checkpoint", str(tmp_path / "nothing.ifdckpt"))
        assert "nothing.ifdckpt" in line and "No such file" in line, line
        return
    if damage == "program":
        args = ["--program", "linear"] + args
    elif damage == "features":
        args[1] = "6"
    elif damage == "optimizer":
        args[-1] = "sgd"
    elif damage == "flip":
        data[-10] ^= 0x10
    elif damage == "truncate":
        data = data[:-7]
    elif damage == "magic":
        data[:4] = b"GIF8"
    path.write_bytes(bytes(data))
    line = one_line_error(*args, "--checkpoint-dir", str(folder), "--resume")
    for w in words:
        assert w in line, f"{w!r} not in: {line}"
    assert str(path) in line or "checkpoint" in line, line


def test_a_failed_run_says_where_the_last_checkpoint_is(daemon, tmp_path, rng):
    """A run that fails writes no end checkpoint and says where the last one is: that the folder
    holds none (it said "the last one is at step -1"), or the one it resumed from."""
    folder = tmp_path / "ck"

    def fail_after(d, good: int):  # good batches, then one holding NaN: the run ends (1 skip)
        # raised by a send, or by the end of the with block when every send came first
        with pytest.raises(infeed.RunFailed):
            with infeed.Producer(d.listen, name="loader-0", timeout=20) as p:
                for i in range(good):
                    p.send(batch(i))
                bad = batch(good)
                bad["x"][rng.randrange(BATCH), rng.randrange(FEATURES)] = np.nan
                p.send(bad)
                for i in range(100):
                    p.send(batch(good + 1 + i))
        assert d.wait() == 1, d.log()
        return d.log()

    def said(log: str) -> str:  # the warning's parenthesis
        m = re.search(r"checkpoint: none at the end: the run failed at global step \d+ \((.*)\)$",
                      log, re.M)
        assert m, log
        return m.group(1)

    off = dict(check_finite="off", max_skipped_steps=1, iterations_per_loop=1,
               checkpoint_every=1000, steps=100)
    log = fail_after(daemon(**flags(folder, **off)), rng.randint(0, 4))
    assert said(log) == f"{folder} holds no checkpoint" and "step -1" not in log, log
    last = rng.randint(1, 4)
    d = daemon(**flags(folder, steps=last, checkpoint_every=1000))
    stream(d.listen, last)
    assert d.wait() == 0, d.log()
    log = fail_after(daemon(**flags(folder, **off, resume=True)), 0)
    assert said(log) == f"the last checkpoint in {folder} is at step {last}", log
