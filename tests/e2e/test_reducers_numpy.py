"""Every built-in host call (outfeed/reducers.c) equals numpy on the same tensors.

tests/util/reduce_cli ($REDUCE_CLI, built by CTest) runs one host call over a .npy file, the rows
added in a given number of steps, and prints its JSON value; each test here draws random shapes
and data, runs it, and compares with numpy: np.histogram (counts and edges exact), np.quantile
(exact), TensorBoard's default buckets by np.searchsorted, the confusion counts by np.add.at,
top-k ranks, and tf.metrics.auc's definition written in numpy (counts exact). The same rows
split into other steps give the same counts, and TensorBoard's EventAccumulator reads both kinds
of histogram written as HistogramProtos the way docs/summaries.md says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def cli_path():
    p = os.environ.get("REDUCE_CLI") or str(ROOT / "build" / "tests" / "reduce_cli")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


pytestmark = pytest.mark.skipif(cli_path() is None, reason="reduce_cli is not built")

SEEDS = list(range(6))


def reduce(tmp_path, spec, x, labels=None, steps=1, classes=0, ok=True):
    """The host call's value over x (and labels) added in `steps` steps."""
    xp = tmp_path / "x.npy"
    np.save(xp, np.ascontiguousarray(x))
    argv = [cli_path(), "--steps", str(steps), "--classes", str(classes), spec, str(xp)]
    if labels is not None:
        lp = tmp_path / "y.npy"
        np.save(lp, np.ascontiguousarray(labels, dtype=np.int32))
        argv.append(str(lp))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if not ok:
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        return r.stderr.strip()
    assert r.returncode == 0, (spec, r.stderr)
    return json.loads(r.stdout)


def random_values(rng, dtype, nonfinite=False):
    """[rows, ...] values of a random row shape (rank 0 to 2), rows from 0 to 2000."""
    rank = int(rng.integers(0, 3))
    shape = (int(rng.integers(0, 2000)),) + tuple(int(rng.integers(1, 5)) for _ in range(rank))
    if dtype == np.int32:
        span = int(rng.choice([3, 1000, 1 << 30]))
        return rng.integers(-span, span, size=shape, dtype=np.int64).astype(np.int32)
    x = (rng.standard_normal(shape) * float(rng.choice([1e-3, 1.0, 1e6]))).astype(np.float32)
    if nonfinite and x.size:
        flat = x.reshape(-1)
        for v in (np.nan, np.inf, -np.inf):
            flat[rng.integers(0, flat.size, size=3)] = v
    return x


def steps_for(rng):
    return int(rng.integers(1, 10))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_mean_sum_min_max_last(tmp_path, seed, dtype):
    rng = np.random.default_rng(seed)
    x = random_values(rng, dtype)
    steps = steps_for(rng)
    got = {k: reduce(tmp_path, k, x, steps=steps) for k in ("mean", "sum", "min", "max", "last")}
    flat = x.reshape(-1)
    if flat.size == 0:
        assert got == {"mean": None, "sum": 0, "min": None, "max": None, "last": None}
        return
    if dtype == np.int32:
        total = int(flat.astype(np.int64).sum())
        assert got["sum"] == total and isinstance(got["sum"], int)
        assert got["mean"] == total / flat.size
        for k, v in (("min", flat.min()), ("max", flat.max()), ("last", flat[-1])):
            assert got[k] == int(v) and isinstance(got[k], int), k
    else:
        total = float(np.sum(flat, dtype=np.float64))
        assert got["sum"] == pytest.approx(total, rel=1e-9, abs=1e-9)
        assert got["mean"] == pytest.approx(total / flat.size, rel=1e-9, abs=1e-12)
        assert got["min"] == float(flat.min())
        assert got["max"] == float(flat.max())
        assert got["last"] == float(flat[-1])


def test_non_finite_results_are_null(tmp_path):
    x = np.array([1.0, np.nan, 2.0], dtype=np.float32)
    for k in ("mean", "sum", "min", "max"):
        assert reduce(tmp_path, k, x) is None, k  # numpy gives nan
    assert reduce(tmp_path, "last", x) == 2.0
    assert reduce(tmp_path, "max", np.array([1.0, np.inf], dtype=np.float32)) is None


def tf_default_limits():
    """TensorFlow's default histogram limits (histogram.cc), built as it builds them."""
    pos = []
    v = 1.0e-12
    while v < 1.0e20:
        pos.append(v)
        v *= 1.1
    pos.append(sys.float_info.max)
    return np.array([-p for p in reversed(pos)] + [0.0] + pos)


def collapse(limits, counts):
    """Histogram::EncodeToProto: a run of empty buckets becomes one with the run's last limit."""
    out_l, out_c, i = [], [], 0
    while i < len(counts):
        end, c = limits[i], counts[i]
        i += 1
        if c == 0:
            while i < len(counts) and counts[i] == 0:
                end = limits[i]
                i += 1
        out_l.append(float(end))
        out_c.append(int(c))
    return (out_l, out_c) if out_l else ([sys.float_info.max], [0])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_histogram_default_buckets(tmp_path, seed, dtype):
    rng = np.random.default_rng(seed)
    x = random_values(rng, dtype, nonfinite=True)
    got = reduce(tmp_path, "histogram", x, steps=steps_for(rng))
    flat = x.reshape(-1).astype(np.float64)
    fin = flat[np.isfinite(flat)]
    limits = tf_default_limits()
    counts = np.bincount(np.searchsorted(limits, fin, side="right"), minlength=len(limits))
    want_l, want_c = collapse(limits, counts[: len(limits)])
    assert got["bucket_limit"] == want_l
    assert got["bucket"] == want_c
    assert got["num"] == fin.size
    assert got["nonfinite"] == flat.size - fin.size
    if fin.size:
        assert got["min"] == fin.min() and got["max"] == fin.max()
        assert got["sum"] == pytest.approx(fin.sum(), rel=1e-9, abs=1e-9)
        assert got["sum_squares"] == pytest.approx((fin * fin).sum(), rel=1e-9)
    else:
        assert got["min"] is None and got["max"] is None


def test_histogram_default_bucket_edges(tmp_path):
    """Every finite default limit and its float32 neighbours: each bucket's two edges."""
    limits = tf_default_limits()[1:-1].astype(np.float32)
    x = np.concatenate([limits, np.nextafter(limits, np.float32(-np.inf)),
                        np.nextafter(limits, np.float32(np.inf))])
    got = reduce(tmp_path, "histogram", x, steps=4)
    all_limits = tf_default_limits()
    counts = np.bincount(np.searchsorted(all_limits, x.astype(np.float64), side="right"),
                         minlength=len(all_limits))
    want_l, want_c = collapse(all_limits, counts[: len(all_limits)])
    assert got["bucket_limit"] == want_l and got["bucket"] == want_c


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_histogram_fixed_bins(tmp_path, seed, dtype):
    rng = np.random.default_rng(seed)
    x = random_values(rng, dtype, nonfinite=True)
    fin = x.reshape(-1)[np.isfinite(x.reshape(-1))]
    scale = float(np.abs(fin).max()) if fin.size else 1.0
    lo = float(rng.uniform(-scale, 0.2 * scale))
    hi = lo + float(rng.uniform(0.05, 1.5)) * max(scale, 1.0)
    bins = int(rng.integers(1, 300))
    edges = np.histogram(np.zeros(0, dtype=dtype), bins=bins, range=(lo, hi))[1]
    # values on every edge: the half-open bins and the closed last one
    x = np.concatenate([x.reshape(-1), edges.astype(dtype)])
    rng.shuffle(x)
    spec = f"histogram:bins={bins},range={lo!r}:{hi!r}"
    got = reduce(tmp_path, spec, x, steps=steps_for(rng))
    fin = x[np.isfinite(x)]
    counts, edges = np.histogram(fin, bins=bins, range=(lo, hi))
    assert got["bucket"] == [int(c) for c in counts]
    assert got["bucket_limit"] == [float(e) for e in edges[1:]]
    assert got["range"] == [float(edges[0]), float(edges[-1])]
    assert got["below"] == int((fin < edges[0]).sum())
    assert got["above"] == int((fin > edges[-1]).sum())
    assert got["below"] + got["above"] + sum(got["bucket"]) == got["num"] == fin.size
    assert got["nonfinite"] == x.size - fin.size


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_quantiles(tmp_path, seed, dtype):
    rng = np.random.default_rng(seed)
    x = random_values(rng, dtype, nonfinite=True)
    q = sorted(set(np.round(rng.uniform(0, 1, size=int(rng.integers(1, 8))), 4).tolist()))
    q += [0.0, 1.0, 0.5]
    spec = "quantiles:q=" + "/".join(repr(v) for v in q)
    got = reduce(tmp_path, spec, x, steps=steps_for(rng))
    flat = x.reshape(-1)
    fin = flat[np.isfinite(flat)]
    assert got["q"] == q
    assert got["count"] == fin.size and got["sampled"] is False
    if fin.size == 0:
        assert got["value"] == [None] * len(q)
    else:
        want = np.quantile(fin, np.array(q))
        assert got["value"] == [float(v) for v in want]
    # the default q
    got = reduce(tmp_path, "quantiles", x)
    assert got["q"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    if fin.size:
        assert got["value"] == [float(v) for v in np.quantile(fin, [0, 0.25, 0.5, 0.75, 1])]


def test_quantiles_sampled_past_max(tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(5000).astype(np.float32)
    got = reduce(tmp_path, "quantiles:max=1000", x, steps=3)
    assert got["sampled"] is True and got["count"] == 5000 and got["kept"] == 1000
    # a uniform sample of 1000: its quartiles are near the data's
    want = np.quantile(x, [0, 0.25, 0.5, 0.75, 1])
    assert got["value"][0] >= want[0] and got["value"][4] <= want[4]
    for a, b in zip(got["value"][1:4], want[1:4]):
        assert abs(a - b) < 0.2
    # the sample depends on the values' order only, not on the steps
    assert reduce(tmp_path, "quantiles:max=1000", x, steps=8) == got


def classify(rng, k, rows, accuracy):
    y = rng.integers(0, k, size=rows).astype(np.int32)
    p = np.where(rng.uniform(size=rows) < accuracy, y, rng.integers(0, k, size=rows))
    return p.astype(np.int32), y


@pytest.mark.parametrize("seed", SEEDS)
def test_confusion_class_accuracy_precision_recall(tmp_path, seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 12))
    rows = int(rng.integers(0, 3000))
    p, y = classify(rng, k, rows, float(rng.uniform()))
    if rng.integers(0, 2):
        p = p.reshape(rows, 1)
    steps = steps_for(rng)
    m = np.zeros((k, k), dtype=np.int64)
    np.add.at(m, (y, p.reshape(-1)), 1)
    got = reduce(tmp_path, "confusion", p, y, steps=steps, classes=k)
    assert got == m.tolist()
    assert reduce(tmp_path, f"confusion:classes={k}", p, y, steps=steps) == m.tolist()

    def ratios(n, d):
        return [float(a) / float(b) if b else None for a, b in zip(n, d)]

    diag, actual, predicted = np.diag(m), m.sum(axis=1), m.sum(axis=0)
    got = reduce(tmp_path, "class_accuracy", p, y, steps=steps, classes=k)
    assert got == {"accuracy": ratios(diag, actual), "correct": diag.tolist(),
                   "count": actual.tolist()}
    got = reduce(tmp_path, "precision_recall", p, y, steps=steps, classes=k)
    assert got == {"precision": ratios(diag, predicted), "recall": ratios(diag, actual),
                   "correct": diag.tolist(), "predicted": predicted.tolist(),
                   "count": actual.tolist()}


@pytest.mark.parametrize("seed", SEEDS)
def test_top_k(tmp_path, seed):
    rng = np.random.default_rng(seed)
    c = int(rng.integers(1, 20))
    k = int(rng.integers(1, c + 1))
    rows = int(rng.integers(0, 2000))
    # small integer scores: many ties
    s = rng.integers(0, 4, size=(rows, c)).astype(np.float32)
    y = rng.integers(0, c, size=rows).astype(np.int32)
    got = reduce(tmp_path, f"top_k:{k}", s, y, steps=steps_for(rng))
    mine = s[np.arange(rows), y]
    rank = (s > mine[:, None]).sum(axis=1)
    hits = int((rank < k).sum())
    assert got == {"accuracy": hits / rows if rows else None, "hits": hits, "count": rows}


def tf_auc(scores, labels, n):
    """tf.metrics.auc (ROC, trapezoidal) in numpy: thresholds as float32, counts, the sum."""
    thr = [(i + 1) * 1.0 / (n - 1) for i in range(n - 2)]
    thr = np.array([0.0 - 1e-7] + thr + [1.0 + 1e-7], dtype=np.float32)
    above = scores[None, :] > thr[:, None]
    pos = labels.astype(bool)
    tp = (above & pos[None, :]).sum(axis=1)
    fp = (above & ~pos[None, :]).sum(axis=1)
    fn, tn = pos.sum() - tp, (~pos).sum() - fp
    eps = 1.0e-6
    x = fp / (fp + tn + eps)
    y = (tp + eps) / (tp + fn + eps)
    auc = 0.0
    for i in range(n - 1):  # in threshold order, as the C code sums
        auc += (x[i] - x[i + 1]) * ((y[i] + y[i + 1]) / 2.0)
    return auc, tp.tolist(), fp.tolist()


@pytest.mark.parametrize("seed", SEEDS)
def test_auc(tmp_path, seed):
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(1, 3000))
    y = rng.integers(0, 2, size=rows).astype(np.int32)
    s = np.clip(rng.normal(0.35 + 0.3 * y, 0.25), 0, 1).astype(np.float32)
    s[rng.integers(0, rows, size=5)] = np.float32(0.5)  # some on a threshold
    n = int(rng.choice([200, 2, 3, 37]))
    spec = "auc" if n == 200 else f"auc:thresholds={n}"
    auc, tp, fp = tf_auc(s, y, n)
    got = reduce(tmp_path, spec, s, y, steps=steps_for(rng))
    assert got == {"auc": auc, "thresholds": n, "positives": int(y.sum()),
                   "negatives": int(rows - y.sum()), "tp": tp, "fp": fp}
    # two columns: column 1 is the score
    two = np.stack([1 - s, s], axis=1).astype(np.float32)
    assert reduce(tmp_path, spec, two, y, steps=steps_for(rng)) == got


@pytest.mark.parametrize("spec,labelled", [
    ("histogram", False), ("histogram:bins=17,range=-1:2", False), ("confusion:classes=5", True),
    ("class_accuracy:classes=5", True), ("auc", True), ("top_k:2", True), ("sum", False)])
def test_integer_counts_do_not_depend_on_the_steps_or_the_order(tmp_path, spec, labelled):
    rng = np.random.default_rng(11)
    rows = 1500
    if spec.startswith("top_k"):
        x = rng.integers(0, 3, size=(rows, 5)).astype(np.float32)
    elif spec == "auc":
        x = rng.uniform(size=rows).astype(np.float32)
    elif labelled:
        x = rng.integers(0, 5, size=rows).astype(np.int32)
    else:
        x = rng.standard_normal((rows, 3)).astype(np.float32)
    y = rng.integers(0, 2 if spec == "auc" else 5, size=rows).astype(np.int32)
    base = reduce(tmp_path, spec, x, y if labelled else None, steps=1)
    for steps in (2, 5, 13):
        perm = rng.permutation(rows)
        got = reduce(tmp_path, spec, x[perm], y[perm] if labelled else None, steps=steps)
        if spec.startswith("histogram"):
            for f in ("sum", "sum_squares"):
                assert got.pop(f) == pytest.approx(base[f], rel=1e-6)
            assert got == {k: v for k, v in base.items() if k not in ("sum", "sum_squares")}
        elif spec == "sum":
            assert got == pytest.approx(base, rel=1e-6)
        else:
            assert got == base


def test_errors_name_the_row_and_value(tmp_path):
    y = np.array([0, 1, 7, 2], dtype=np.int32)
    err = reduce(tmp_path, "confusion:classes=4", y % 4, y, ok=False)
    assert "row 2" in err and "label 7" in err and "'label'" in err and "[0, 4)" in err
    err = reduce(tmp_path, "auc", np.array([0.5, 1.5], dtype=np.float32),
                 np.array([0, 1], dtype=np.int32), ok=False)
    assert "row 1" in err and "1.5" in err and "[0, 1]" in err
    err = reduce(tmp_path, "histogram:bins=0,range=0:1", np.zeros(3, np.float32), ok=False)
    assert "bins=" in err and "'0'" in err and "host_calls" in err


def test_tensorboard_reads_the_histograms(tmp_path):
    """Both histogram values become TensorBoard HistogramProtos as docs/summaries.md says (the
    fixed bins with `below` in front and `above` at the end), and TensorBoard's own reader reads
    them back."""
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    rng = np.random.default_rng(3)
    x = rng.standard_normal(4000).astype(np.float32)
    default = reduce(tmp_path, "histogram", x, steps=3)
    fixed = reduce(tmp_path, "histogram:bins=20,range=-1.5:1.5", x, steps=3)
    fixed_limits = [fixed["range"][0]] + fixed["bucket_limit"] + [sys.float_info.max]
    fixed_counts = [fixed["below"]] + fixed["bucket"] + [fixed["above"]]
    logdir = tmp_path / "tb"
    w = EventFileWriter(str(logdir))
    for tag, h, limits, counts in (
            ("default", default, default["bucket_limit"], default["bucket"]),
            ("fixed", fixed, fixed_limits, fixed_counts)):
        proto = HistogramProto(min=h["min"], max=h["max"], num=h["num"], sum=h["sum"],
                               sum_squares=h["sum_squares"], bucket_limit=limits, bucket=counts)
        w.add_event(Event(step=7, wall_time=1.0,
                          summary=Summary(value=[Summary.Value(tag=tag, histo=proto)])))
    w.close()
    ea = ea_mod.EventAccumulator(str(logdir), size_guidance={ea_mod.HISTOGRAMS: 0})
    ea.Reload()
    for tag, h, limits, counts in (("default", default, default["bucket_limit"], default["bucket"]),
                                   ("fixed", fixed, fixed_limits, fixed_counts)):
        (ev,) = ea.Histograms(tag)
        v = ev.histogram_value
        assert ev.step == 7
        assert list(v.bucket_limit) == limits and list(v.bucket) == counts
        assert v.num == 4000 == sum(v.bucket) and v.min == float(x.min())
        assert v.max == float(x.max())
