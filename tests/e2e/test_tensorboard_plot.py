"""python -m infeed.tensorboard (--from a summaries file, --subscribe to a live daemon) read back
with TensorBoard's EventAccumulator, and python -m infeed.plot: the PNG and the series it drew."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import infeed
from conftest import free_ports
from helpers import wait_connected
from infeed.runlog import SCALARS, host_call_scalars, read_summaries

pytest.importorskip("tensorboardX")
EventAccumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator").EventAccumulator

FEATURES, CLASSES, BATCH = 6, 4, 16


def module(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


def train_run(daemon, rng, steps=None, **flags):
    steps = steps or rng.randint(20, 60)
    every = rng.randint(2, 7)
    d = daemon(program="softmax", features=FEATURES, classes=CLASSES, batch_size=BATCH,
               iterations_per_loop=rng.randint(1, 5), steps=steps, summary_every=every, **flags)
    return d, steps


def feed(d, rng):
    nprng = np.random.default_rng(rng.randint(0, 2**31))
    with infeed.Producer(d.listen, name="p", timeout=20) as p:
        try:
            for _ in range(10000):
                y = nprng.integers(0, CLASSES, BATCH, dtype=np.int32)
                x = (np.eye(CLASSES, FEATURES, dtype=np.float32)[y] +
                     0.3 * nprng.standard_normal((BATCH, FEATURES))).astype(np.float32)
                p.send(x=x, y=y)
        except infeed.RunEnded:
            pass
    assert d.wait() == 0, d.log()


def read_back(logdir):
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def expected(summaries):
    want = {}
    for s in summaries:
        if s["event"] in ("train", "eval", "predict"):
            for key in SCALARS:
                if key in s:
                    want.setdefault(f"{s['event']}/{key}", []).append(
                        (s["global_step"], float(np.float32(s[key]))))
            for tag, step, v in host_call_scalars(s):
                want.setdefault(tag, []).append((step, float(np.float32(v))))
    return want


def assert_same(got, want):
    assert set(got) == set(want), (sorted(got), sorted(want))
    for tag in want:
        assert [step for step, _ in got[tag]] == [step for step, _ in want[tag]], tag
        np.testing.assert_allclose([v for _, v in got[tag]], [v for _, v in want[tag]],
                                   rtol=1e-6, err_msg=tag)


def test_from_file_reads_back(daemon, rng, tmp_path):
    d, steps = train_run(daemon, rng)
    feed(d, rng)
    summaries = d.summaries()
    assert sum(s["event"] == "train" for s in summaries) >= 2
    r = module("infeed.tensorboard", "--from", str(d.summaries_path), "--logdir",
               str(tmp_path / "tb"))
    assert r.returncode == 0, r.stderr
    got = read_back(tmp_path / "tb")
    assert_same(got, expected(summaries))
    assert got["train/loss"][-1][0] == steps
    ea = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0})
    ea.Reload()
    hists = sum(len(ea.Histograms(t)) for t in ea.Tags()["histograms"])
    # a classifier's default host calls: the confidence histogram of every train summary
    assert hists == sum(s["event"] == "train" for s in summaries), ea.Tags()
    assert f"{sum(len(v) for v in got.values()) + hists} values (scalars and histograms) " \
        "written" in r.stdout, r.stdout


def test_subscribe_follows_a_live_run(daemon, rng, tmp_path):
    d, steps = train_run(daemon, rng)
    proc = subprocess.Popen([sys.executable, "-m", "infeed.tensorboard", "--subscribe",
                             d.publish, "--logdir", str(tmp_path / "tb")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ.copy())
    # the subscriber (another process: its start takes a while) is connected before the first
    # summary: the daemon's PUB drops what it sends before that
    wait_connected(d.publish)
    feed(d, rng)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # it ended by itself with the end summary
    assert_same(read_back(tmp_path / "tb"), expected(d.summaries()))


def test_subscribe_without_a_daemon(tmp_path):
    (port,) = free_ports(1)
    r = module("infeed.tensorboard", "--subscribe", f"tcp://127.0.0.1:{port}", "--logdir",
               str(tmp_path / "tb"), "--connect-timeout", "0.5")
    assert r.returncode == 1, r.stderr
    assert "no daemon answered at" in r.stderr and "Traceback" not in r.stderr, r.stderr


def synthetic(rng, n):
    """n train summaries at random steps with random values, an eval one and the end."""
    steps = sorted(rng.sample(range(1, 10 * n), n))
    out = []
    for st in steps:
        out.append({"event": "train", "mode": "train", "global_step": st, "steps": 1,
                    "loss": rng.uniform(0, 3), "accuracy": rng.uniform(0, 1), "examples": 10,
                    "examples_per_sec": rng.uniform(1, 1e6), "steps_per_sec": rng.uniform(1, 1e4),
                    "infeed_wait_fraction": rng.uniform(0, 1), "outfeed_wait_fraction": 0.0,
                    "time": 1.7e9 + st})
    out.append({"event": "end", "mode": "train", "global_step": steps[-1], "status": "ok",
                "reason": "last_step", "steps": steps[-1], "time": 1.7e9 + steps[-1]})
    out.append({"event": "eval", "mode": "eval", "global_step": steps[-1], "steps": 3,
                "loss": 0.5, "accuracy": 0.9, "examples": 30, "examples_per_sec": 5.0,
                "steps_per_sec": 1.0, "infeed_wait_fraction": 0.1, "outfeed_wait_fraction": 0.0,
                "time": 1.8e9})
    return out


def random_histogram(rng):
    """A host call's histogram value (docs/summaries.md): counts over increasing limits, some
    of them in runs of empty buckets."""
    n = rng.randint(3, 12)
    limits = sorted(rng.sample(range(-50, 50), n))
    counts = [rng.choice([0, 0, rng.randint(1, 30)]) for _ in range(n)]
    counts[rng.randrange(n)] = rng.randint(1, 30)
    values = [rng.uniform(limits[0] - 1, limits[-1]) for _ in range(5)]
    return {"min": min(values), "max": max(values), "num": float(sum(counts)),
            "sum": float(sum(values)), "sum_squares": float(sum(v * v for v in values)),
            "bucket_limit": [float(x) for x in limits], "bucket": [float(c) for c in counts]}


def test_host_call_histograms_and_numbers(rng, tmp_path):
    """Host calls' histograms read back by TensorBoard's EventAccumulator (counts exact, runs of
    empty buckets merged as TensorFlow's writer does), and their numbers as scalars."""
    summaries = synthetic(rng, rng.randint(2, 6))
    hists = {}
    for s in summaries:
        if s["event"] in ("train", "eval"):
            h = random_histogram(rng)
            hists[(s["event"], s["global_step"])] = h
            s["host_calls"] = {"confidence": {"histogram": h, "mean": rng.uniform(0, 1),
                                              "quantiles": [0.1, 0.5, 0.9]},
                               "class": {"class_accuracy": [0.5, None, 1.0]}}
    path = tmp_path / "run.jsonl"
    write_jsonl(path, summaries)
    r = module("infeed.tensorboard", "--from", str(path), "--logdir", str(tmp_path / "tb"))
    assert r.returncode == 0, r.stderr
    ea = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0})
    ea.Reload()
    assert set(ea.Tags()["histograms"]) == {"train/confidence/histogram",
                                           "eval/confidence/histogram"}
    for tag in ea.Tags()["histograms"]:
        event = tag.split("/")[0]
        assert len(ea.Histograms(tag)) == sum(s["event"] == event for s in summaries), tag
        for e in ea.Histograms(tag):
            h = hists[(event, e.step)]
            v = e.histogram_value
            assert v.num == h["num"] and v.min == h["min"] and v.max == h["max"]
            assert sum(v.bucket) == sum(h["bucket"])
            # every non-empty bucket kept with its limit, empty runs merged into one
            kept = [(lim, c) for lim, c in zip(v.bucket_limit, v.bucket) if c]
            assert kept == [(lim, c) for lim, c in zip(h["bucket_limit"], h["bucket"]) if c]
            assert all(not (a == 0 and b == 0) for a, b in zip(v.bucket, v.bucket[1:]))
    got = read_back(tmp_path / "tb")
    assert_same(got, expected(summaries))
    assert "train/confidence/quantiles/1" in got and "train/class/class_accuracy/2" in got
    assert "train/class/class_accuracy/1" not in got  # null: a class without rows


def test_plot_any_scalar(rng, tmp_path):
    """--list names every scalar, host calls' too; --scalar draws the chosen ones; a tag the
    summaries lack is named with the ones they have."""
    summaries = synthetic(rng, rng.randint(3, 8))
    for s in summaries:
        if s["event"] == "train":
            s["host_calls"] = {"confidence": {"mean": rng.uniform(0, 1)}}
    path = tmp_path / "run.jsonl"
    write_jsonl(path, summaries)
    r = module("infeed.plot", str(path), "--list")
    assert r.returncode == 0, r.stderr
    listed = dict(line.split("\t") for line in r.stdout.splitlines())
    n_train = sum(s["event"] == "train" for s in summaries)
    assert listed["train/confidence/mean"] == str(n_train) and listed["eval/loss"] == "1"
    out = tmp_path / "c.png"
    r = module("infeed.plot", str(path), "-o", str(out), "--scalar", "train/confidence/mean",
               "--scalar", "train/loss")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"2 scalars ({n_train} points in the first)" in r.stdout
    from infeed.plot import plot_scalars
    drawn = plot_scalars(summaries, ["train/confidence/mean"], str(out))
    assert drawn["train/confidence/mean"][1] == [s["host_calls"]["confidence"]["mean"]
                                                 for s in summaries if s["event"] == "train"]
    r = module("infeed.plot", str(path), "-o", str(out), "--scalar", "train/nope")
    assert r.returncode == 1 and "no scalar train/nope in these summaries; they have:" in \
        r.stderr and "train/confidence/mean" in r.stderr, r.stderr


def write_jsonl(path, summaries):
    path.write_text("".join(json.dumps(s) + "\n" for s in summaries))


def test_plot_png_and_series(rng, tmp_path):
    from infeed.plot import plot

    n = rng.randint(2, 40)
    summaries = synthetic(rng, n)
    run = tmp_path / "run.jsonl"
    write_jsonl(run, summaries)
    png = tmp_path / "run.png"
    r = module("infeed.plot", str(run), "-o", str(png))
    assert r.returncode == 0, r.stderr
    assert f"{n} train summaries drawn into {png}" in r.stdout, r.stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 400 and height > 300, (width, height)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0.01  # not a blank image
    drawn = plot(read_summaries(str(run)), str(tmp_path / "again.png"))
    train = [s for s in summaries if s["event"] == "train"]
    assert set(drawn) == {"loss", "accuracy", "examples_per_sec", "infeed_wait_fraction"}
    for key, (steps, values) in drawn.items():
        assert steps == [s["global_step"] for s in train], key
        assert values == [s[key] for s in train], key


def test_plot_and_convert_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "train", "global_step": 1, "loss": 1.0}\n\n[1, 2]\n')
    for args in (["infeed.plot", str(bad), "-o", str(tmp_path / "x.png")],
                 ["infeed.tensorboard", "--from", str(bad), "--logdir", str(tmp_path / "tb")]):
        r = module(*args)
        assert r.returncode == 1 and "line 3" in r.stderr and "bad.jsonl" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    only_end = tmp_path / "end.jsonl"
    write_jsonl(only_end, [{"event": "end", "mode": "train", "global_step": 0, "status": "error",
                            "reason": "error", "steps": 0, "time": 1.0}])
    r = module("infeed.plot", str(only_end), "-o", str(tmp_path / "y.png"))
    assert r.returncode == 1 and "no train summaries to plot" in r.stderr, r.stderr
    assert not (tmp_path / "y.png").exists()
    r = module("infeed.plot", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "z.png"))
    assert r.returncode == 1 and "missing.jsonl" in r.stderr and "Traceback" not in r.stderr
