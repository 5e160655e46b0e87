"""infeed.feed and the loader workers end to end: any iterable (and a PyTorch DataLoader or a
tf.data.Dataset when torch or tensorflow is installed) cut into the daemon's steps and messages,
the last partial batch dropped or padded, resume after a restart with several workers (every step
trained exactly once), the rule for workers that connect late, a run that failed never taken for
one that ended well, and Producer.transport after the with block."""

import functools
import itertools
import re
import threading
from pathlib import Path

import numpy as np
import pytest

import ckpt
import infeed
from fake_daemon import FakeDaemon
from helpers import FakeDataset, steps_data
from infeed import protocol as P


def schema(d):
    return [P.schema_entry("x", "float32", [d]), P.schema_entry("y", "int32", [])]


def chunks(x, y, sizes):
    """(x, y) cut into loader batches of the given sizes, y as int64 (as PyTorch makes labels)."""
    at = np.cumsum([0] + list(sizes))
    return [(x[a:b], y[a:b].astype(np.int64)) for a, b in zip(at[:-1], at[1:])]


def random_sizes(r, total, most):
    sizes = []
    while sum(sizes) < total:
        sizes.append(min(r.randint(1, most), total - sum(sizes)))
    return sizes


# -- against the fake daemon: what goes on the wire ---------------------------------------------

@pytest.mark.parametrize("last_batch", ["drop", "pad"])
@pytest.mark.parametrize("form", ["list", "generator", "tf.data"])
def test_any_batch_sizes_become_whole_steps_and_messages(rng, last_batch, form):
    bs, d, most = rng.randint(1, 8), rng.randint(1, 6), rng.randint(1, 4)
    k = rng.randint(1, most)
    rows = rng.randint(0, 12) * bs + rng.randint(1, bs + 3)
    x, y = steps_data(rng.randrange(1 << 30), 1, rows, d, 5)
    items = chunks(x, y, random_sizes(rng, rows, 3 * bs))
    data = {"list": items, "generator": (b for b in items), "tf.data": FakeDataset(items)}[form]
    print(f"batch {bs} rows {rows} steps a message {k} of {most}, loader {[len(b[0]) for b in items]}")
    given = rng.random() < 0.5  # schema= given: sent in the one HELLO; else the WELCOME's
    with FakeDaemon(schema=schema(d), batch_size=bs, max_steps=most, credit=most * 2) as fake:
        r = infeed.feed(fake.endpoint, data, name="f", steps_per_message=k, last_batch=last_batch,
                        timeout=10, **({"schema": schema(d)} if given else {}))
        got = fake.batches
        assert [h.get("schema") for h in fake.hellos] == [schema(d) if given else None]
    full, tail = divmod(rows, bs)
    want_x, want_y = x[:full * bs], y[:full * bs]
    if tail and last_batch == "pad":  # the last step's rows again, in order
        pad = full * bs + np.arange(bs - tail) % tail
        want_x = np.concatenate([x, x[pad]])
        want_y = np.concatenate([y, y[pad]])
    steps = len(want_x) // bs
    assert (r.sent, r.rows_dropped, r.rows_padded) == (
        steps, tail if last_batch == "drop" else 0,
        bs - tail if tail and last_batch == "pad" else 0), r
    assert r.messages == len(got) and r.bye["status"] == "ok" and not r.ended, r
    # messages of k steps, the last one possibly fewer; sequence numbers count the steps
    assert all(m[1] == k * bs for m in got[:-1]) and (not got or got[-1][1] % bs == 0), \
        [m[1] for m in got]
    assert [m[0] for m in got] == list(np.cumsum([0] + [m[1] // bs for m in got])[:-1])
    sent_x = b"".join(m[2][0] for m in got)
    sent_y = b"".join(m[2][1] for m in got)
    assert sent_x == want_x.astype("<f4").tobytes()
    assert sent_y == want_y.astype("<i4").tobytes()  # the int64 labels, converted


def test_loader_batches_of_one_message_are_sent_from_their_own_memory(rng, monkeypatch):
    bs, d = rng.randint(1, 8), rng.randint(1, 6)
    items = [steps_data(rng.randrange(1 << 30), 1, bs, d, 3) for _ in range(rng.randint(1, 6))]
    seen = []
    send = infeed.Producer.send

    def spy(self, batch=None, /, **kw):
        seen.append(batch)
        return send(self, batch, **kw)

    monkeypatch.setattr(infeed.Producer, "send", spy)
    with FakeDaemon(schema=schema(d), batch_size=bs) as fake:
        r = infeed.feed(fake.endpoint, items, shm=False, timeout=10)
    assert r.transport == "socket" and r.sent == len(items) == len(seen)
    for b, (x, y) in zip(seen, items):
        assert np.shares_memory(b["x"], x) and np.shares_memory(b["y"], y)


def test_bad_options_are_refused_before_anything_is_sent(rng):
    with FakeDaemon(schema=schema(2), max_steps=3) as fake:
        with pytest.raises(ValueError, match="last_batch: expected one of drop, pad, got 'keep'"):
            infeed.feed(fake.endpoint, [], last_batch="keep")
        with pytest.raises(ValueError, match=r"steps_per_message: expected 1 to 3 \(the daemon's "
                                             r"max_steps_per_message\), got 4"):
            infeed.feed(fake.endpoint, [], steps_per_message=4, timeout=10)
        with pytest.raises(TypeError, match="worker: expected an infeed.Worker, got int"):
            infeed.feed(fake.endpoint, [], worker=3)
        assert fake.batches == []


def test_a_failed_run_raises_run_failed_from_the_fake(rng):
    """The BYE of a run that failed: RunFailed from end() (the with block's exit), also when
    the loop swallowed RunEnded; not a RunEnded."""
    x, y = steps_data(rng.randrange(1 << 30), 1, 8, 4, 3)
    with FakeDaemon(last_step=rng.randint(1, 4), bye_status="error") as fake:
        with pytest.raises(infeed.RunFailed) as ei:
            with infeed.Producer(fake.endpoint, name="p", timeout=10) as p:
                try:
                    for _ in range(100):
                        p.send(x=x, y=y)
                except infeed.RunEnded:
                    pass
    e = ei.value
    assert not isinstance(e, infeed.RunEnded) and isinstance(e, infeed.InfeedError)
    assert (e.status, e.reason, e.error) == ("error", "error", "outfeed: replica 0's loss is nan")
    assert "the run ended with an error at global step" in str(e) and "'p'" in str(e)
    # nothing sent after the run ended: end() itself raises it, each time
    last = rng.randint(1, 4)
    with FakeDaemon(last_step=last, bye_status="error") as fake:
        p = infeed.Producer(fake.endpoint, name="q", timeout=10)
        for _ in range(last):
            p.send(x=x, y=y)
        for _ in range(2):
            with pytest.raises(infeed.RunFailed, match="loss is nan") as ei:
                p.end()
        assert ei.value.global_step == last and p.bye["status"] == "error"
        p.close()


# -- workers ------------------------------------------------------------------------------------

def test_worker_shares_are_disjoint_deterministic_and_named(rng):
    n, length, seed = rng.randint(1, 7), rng.randint(0, 200), rng.randrange(1 << 30)
    ws = infeed.workers(n, name="ld")
    assert [w.name for w in ws] == [f"ld-{i}-of-{n}" for i in range(n)]
    assert all(w.flag == f"--expect-producers {n}" for w in ws)
    for shuffle in (False, True):
        shares = [w.indices(length, shuffle=shuffle, seed=seed) for w in ws]
        assert sorted(i for s in shares for i in s) == list(range(length))  # disjoint, all
        assert shares == [w.indices(length, shuffle=shuffle, seed=seed) for w in ws]
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert [list(w.take(range(length))) for w in ws] == \
        [list(range(length))[i::n] for i in range(n)]
    for bad in [(n, n), (-1, n), (0, 0), (True, 2)]:
        with pytest.raises(ValueError, match="Worker: (index|count): expected"):
            infeed.Worker(*bad)


def test_workers_need_a_daemon_that_expects_them(daemon, rng):
    """Without --expect-producers N the first worker to finish could end the input before a late
    one connects: feed refuses to start, naming the flag, and sends nothing."""
    n = rng.randint(2, 4)
    d = daemon(replicas=1, batch_size=4, features=3, classes=2, steps=100, summary_every=0,
               expect_producers=rng.randint(0, n - 1))
    data = [steps_data(0, 1, 4, 3, 2)]
    for i in range(n):
        with pytest.raises(ValueError, match=rf"worker {i} of {n} .*start infeedd with "
                                             rf"--expect-producers {n}"):
            infeed.feed(d.listen, data, worker=infeed.Worker(i, n), timeout=10)
    assert d.control({"cmd": "status"})["batches_accepted"] == 0
    # one worker alone needs nothing
    r = infeed.feed(d.listen, data, worker=infeed.Worker(0, 1), timeout=10)
    assert r.sent == 1 and r.name == "loader-0-of-1"


def share(seed, rows, d, classes, loader, batch_max, gate, w):
    """Worker w's share, the same on every run: rows[w.index] rows in loader batches of random
    sizes (a DataLoader over the worker's indices when loader == "torch"). With a gate (a
    threading.Barrier) its first batch waits until every worker has been welcomed."""
    x, y = steps_data(seed, 1, w.count * max(rows), d, classes)
    idx = w.indices(len(x))[:rows[w.index]]
    if loader == "torch":
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        ds = TensorDataset(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)))
        items = DataLoader(ds, batch_size=batch_max, sampler=idx)
    else:
        import random

        items = chunks(x[idx], y[idx], random_sizes(random.Random(seed + w.index), len(idx),
                                                    batch_max))
    return items if gate is None else gated(items, gate)


def gated(items, gate):
    gate.wait(30)
    yield from items


@pytest.mark.parametrize("loader", ["iterable", "torch"])
@pytest.mark.parametrize("input_mode", ["per-core", "per-host"])
def test_resume_after_a_restart_with_several_workers(daemon, tmp_path, rng, input_mode, loader):
    """n workers, a daemon stopped at a random step and resumed from its checkpoint, the workers
    restarted from their beginnings: every step is trained exactly once. per-core (worker i feeds
    replica i, so the steps are deterministic): the end checkpoint has the bits of a run never
    stopped. per-host: each worker's position and the global step add up."""
    if loader == "torch":
        pytest.importorskip("torch")
    n, b, d, classes = rng.randint(2, 3), rng.randint(1, 4), rng.randint(1, 5), rng.randint(2, 4)
    most = rng.randint(1, 3)
    per_core = input_mode == "per-core"
    # per-core: as many steps for each replica (a step left with some replicas' batches only
    # is not trained, and then no checkpoint can be written at the end)
    steps = [rng.randint(5, 12)] * n if per_core else [rng.randint(5, 12) for _ in range(n)]
    rows = [s * b + rng.randint(0, b - 1) for s in steps]  # a tail to drop
    stop = rng.randint(2, min(steps) - 1)
    # skip_consumed=False (per-host): everything sent again, numbered from where the daemon
    # wants, so the steps it had consumed are trained twice
    skip = per_core or rng.random() < 0.7
    # per-host: the workers (threads) start sending once all are welcomed, else the first could
    # reach the stop step alone, and the daemon be gone before the others connect
    processes = per_core and rng.random() < 0.5
    gate = None if per_core else threading.Barrier(n)
    data = functools.partial(share, rng.randrange(1 << 30), rows, d, classes, loader,
                             rng.randint(1, 3 * b), gate)
    replicas = n if per_core else rng.choice([1, 2] if b % 2 == 0 else [1])
    every, loop = rng.randint(1, 4), rng.randint(1, 3)
    print(f"{n} workers {input_mode} batch {b} steps {steps} rows {rows} up to {most} a message, "
          f"stop at {stop}, skip_consumed {skip}, processes {processes}, {replicas} replicas, "
          f"checkpoints every {every}, loops of {loop}")

    def flags(folder, **kw):
        return dict(replicas=replicas, batch_size=b * n if per_core else b, features=d,
                    classes=classes, input_mode=input_mode, expect_producers=n,
                    optimizer="adam", learning_rate=0.05, seed=3, summary_every=0,
                    checkpoint_dir=str(folder), checkpoint_every=every, iterations_per_loop=loop,
                    max_steps_per_message=most, **kw)

    def run(dm, **kw):
        res = infeed.feed_workers(dm.listen, n, data, processes=processes, per_core=per_core,
                                  timeout=30, **kw)
        assert dm.wait() == 0, dm.log()
        return res

    total = min(steps) if per_core else sum(steps)  # per-core: a step takes one from each
    if per_core:
        ref = run(daemon(**flags(tmp_path / "ref", last_step=1000000)))
        assert [(r.sent, r.rows_dropped) for r in ref] == [(s, rw % b) for s, rw in
                                                            zip(steps, rows)], ref
        want = ckpt.read(ckpt.files(tmp_path / "ref")[-1])
        assert want["global_step"] == total, want

    folder = tmp_path / "run"
    first = run(daemon(**flags(folder, last_step=stop)))
    assert all(r.bye is None or r.bye["global_step"] == stop for r in first), first
    at_stop = ckpt.read(ckpt.files(folder)[-1])
    assert at_stop["global_step"] == stop, at_stop
    pos = {w.name: at_stop["producers"].get(w.name, -1) for w in infeed.workers(n)}
    assert sum(p + 1 for p in pos.values()) == (stop * n if per_core else stop), pos

    d2 = daemon(**flags(folder, last_step=1000000, resume=True))
    second = run(d2, skip_consumed=skip)
    got = ckpt.read(ckpt.files(folder)[-1])
    for w, r, s in zip(infeed.workers(n), second, steps):
        assert r.name == w.name
        assert r.skipped == (pos[w.name] + 1 if skip else 0), (w, r, pos)
        assert r.sent == s - r.skipped, (w, r)  # the rest, and nothing twice
    if not skip:
        assert got["global_step"] == stop + sum(steps), (got["global_step"], stop, steps)
        assert got["producers"] == {w.name: pos[w.name] + s for w, s in
                                    zip(infeed.workers(n), steps)}, (got["producers"], pos)
        return
    assert got["global_step"] == total, (got["global_step"], total)
    if per_core:
        assert got["producers"] == want["producers"], (got["producers"], want["producers"])
        assert np.array_equal(got["params"], want["params"]), "the resumed run differs"
    else:
        assert got["producers"] == {w.name: s - 1 for w, s in zip(infeed.workers(n), steps)}


# -- against the daemon ---------------------------------------------------------------------------

def test_a_failed_run_is_not_hidden_by_except_run_ended(daemon, rng):
    """The README's loop (except infeed.RunEnded: pass) around a run whose model diverges (a NaN
    input, check_finite off, one non-finite step ends it: --max-skipped-steps 1): the with block
    raises RunFailed with the daemon's sentence; a clean end raises nothing."""
    d, classes, bs = rng.randint(1, 8), rng.randint(2, 5), rng.randint(1, 8)
    x, y = steps_data(rng.randrange(1 << 30), 1, bs, d, classes)
    bad = x.copy()
    bad[rng.randrange(bs), rng.randrange(d)] = np.nan
    dm = daemon(replicas=1, batch_size=bs, features=d, classes=classes, steps=100,
                iterations_per_loop=1, summary_every=0, check_finite="off",
                max_skipped_steps=1)
    with pytest.raises(infeed.RunFailed) as ei:
        with infeed.Producer(dm.listen, name="loader", timeout=20) as p:
            try:
                for i in range(100000):
                    p.send(x=bad if i == 0 else x, y=y)
            except infeed.RunEnded:
                pass
    e = ei.value
    assert e.status == "error" and e.reason == "error" and "diverged" in e.error, e.bye
    assert e.global_step == dm.end_summary()["global_step"] and "diverged" in str(e)
    assert dm.wait() == 1, dm.log()

    # infeed.feed likewise
    dm = daemon(replicas=1, batch_size=bs, features=d, classes=classes, steps=100,
                iterations_per_loop=1, summary_every=0, check_finite="off",
                max_skipped_steps=1)
    with pytest.raises(infeed.RunFailed, match="diverged"):
        # endless data: only the daemon's end of the run stops the stream
        infeed.feed(dm.listen, itertools.chain([(bad, y)], itertools.repeat((x, y))), timeout=20)
    assert dm.wait() == 1, dm.log()

    # a clean end: RunEnded, whose BYE (when it came first) says ok
    steps = rng.randint(1, 20)
    dm = daemon(replicas=1, batch_size=bs, features=d, classes=classes, steps=steps,
                summary_every=0)
    with infeed.Producer(dm.listen, name="loader", timeout=20) as p:
        try:
            for _ in range(100000):
                p.send(x=x, y=y)
        except infeed.RunEnded as ended:
            assert ended.status in (None, "ok") and ended.error is None, ended.bye
    assert (p.bye["status"], p.bye["reason"], p.bye["global_step"]) == ("ok", "last_step", steps)
    r = infeed.feed(daemon(replicas=1, batch_size=bs, features=d, classes=classes, steps=steps,
                           summary_every=0).listen, itertools.repeat((x, y)), timeout=20)
    assert r.ended and r.bye["status"] == "ok" and r.sent >= steps, r


@pytest.mark.parametrize("pool", ["shm", "socket", "refused"])
def test_transport_still_says_what_was_used_after_the_with_block(daemon, rng, pool):
    d, bs = rng.randint(1, 6), rng.randint(1, 6)
    x, y = steps_data(rng.randrange(1 << 30), 1, bs, d, 3)
    dm = daemon(replicas=1, batch_size=bs, features=d, classes=3, steps=1, summary_every=0,
                shm="off" if pool == "refused" else "on")
    with infeed.Producer(dm.listen, timeout=20, shm=pool == "shm" or "auto"
                         if pool != "socket" else False) as p:
        p.send(x=x, y=y)
        during = (p.transport, p.shm_refused)
    assert (p.transport, p.shm_refused) == during
    assert p.transport == ("shm" if pool == "shm" else "socket"), during
    assert (p.shm_refused is not None) == (pool == "refused"), during


def test_predict_mode_sends_the_last_batch_partial(daemon, rng):
    bs, d, classes = rng.randint(2, 8), rng.randint(1, 6), rng.randint(2, 5)
    rows = rng.randint(1, 6) * bs + rng.randint(1, bs - 1)
    x, _ = steps_data(rng.randrange(1 << 30), 1, rows, d, classes)
    dm = daemon(mode="predict", replicas=1, batch_size=bs, features=d, classes=classes, steps=0)
    got = []
    r = infeed.feed(dm.listen, [x[a:a + 3] for a in range(0, rows, 3)], last_batch="drop",
                    on_prediction=lambda seq, out: got.append((seq, out)), timeout=20)
    assert dm.wait() == 0, dm.log()
    assert r.sent == -(-rows // bs) and r.rows_dropped == 0 and r.predictions == []
    assert [s for s, _ in got] == list(range(r.sent)), got
    assert sum(len(o["classes"]) for _, o in got) == rows


def loader_of(lib, x, y, batch):
    """A torch DataLoader or a tf.data.Dataset of (x, y as int64) in batches of `batch` rows."""
    if lib == "torch":
        torch = pytest.importorskip("torch")
        from torch.utils.data import DataLoader, TensorDataset

        return DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y).long()),
                          batch_size=batch, shuffle=False)
    tf = pytest.importorskip("tensorflow")
    return tf.data.Dataset.from_tensor_slices((x, y.astype(np.int64))).batch(batch)


@pytest.mark.parametrize("lib", ["torch", "tensorflow"])
def test_a_loader_trains_as_the_same_rows_from_numpy(daemon, tmp_path, rng, lib):
    """The same rows from a DataLoader or a tf.data.Dataset (float32 and int64 tensors, batches
    of one size) and from numpy arrays (int32 labels, batches of other sizes): the same end
    checkpoint."""
    bs, d, classes, most = rng.randint(1, 6), rng.randint(1, 6), rng.randint(2, 5), rng.randint(1, 3)
    rows = rng.randint(4, 20) * bs + rng.randint(0, bs - 1)
    x, y = steps_data(rng.randrange(1 << 30), 1, rows, d, classes)
    last = rng.choice(["drop", "pad"])
    loader = loader_of(lib, x, y, rng.randint(1, 3 * bs))
    out = {}
    for kind, data in [(lib, loader), ("numpy", chunks(x, y, random_sizes(rng, rows, 2 * bs)))]:
        dm = daemon(replicas=1, batch_size=bs, features=d, classes=classes, last_step=1000000,
                    summary_every=0, checkpoint_dir=str(tmp_path / kind), seed=5,
                    max_steps_per_message=most)
        out[kind] = infeed.feed(dm.listen, data, last_batch=last, timeout=20)
        assert dm.wait() == 0, dm.log()
    a, b = (ckpt.read(ckpt.files(tmp_path / k)[-1]) for k in (lib, "numpy"))
    assert a["global_step"] == b["global_step"] == out[lib].sent == out["numpy"].sent
    assert np.array_equal(a["params"], b["params"]), f"the {lib} loader's rows trained otherwise"
    assert (out[lib].rows_dropped, out[lib].rows_padded) == \
        (out["numpy"].rows_dropped, out["numpy"].rows_padded)


def test_a_dataloader_batch_is_sent_from_the_tensors_memory(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    bs, d = rng.randint(1, 6), rng.randint(1, 6)
    x, y = steps_data(rng.randrange(1 << 30), 1, bs * rng.randint(1, 5), d, 3)
    tensors = []

    class Spy:  # the loader's batches, kept to compare memory
        def __iter__(self):
            for t in DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                                batch_size=bs):
                tensors.append(t)
                yield t

    seen = []
    send = infeed.Producer.send
    monkeypatch.setattr(infeed.Producer, "send",
                        lambda self, batch=None, /, **kw: seen.append(batch) or
                        send(self, batch, **kw))
    with FakeDaemon(schema=schema(d), batch_size=bs) as fake:
        r = infeed.feed(fake.endpoint, Spy(), shm=False, timeout=10)
    assert r.sent == len(tensors) == len(seen)
    for b, (tx, ty) in zip(seen, tensors):
        assert np.shares_memory(b["x"], tx.numpy()) and np.shares_memory(b["y"], ty.numpy())


def readme_blocks(word):
    """The README's Python examples that use `word`."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if word in b]


def test_the_readme_feed_example_runs_as_written(daemon, rng, capsys):
    (code,) = readme_blocks("infeed.feed(\"tcp://127.0.0.1:5555\", loader, name=")
    steps = rng.randint(1, 10)
    d = daemon(replicas=2, features=64, classes=10, batch_size=64, steps=steps, summary_every=0)
    x, y = steps_data(rng.randrange(1 << 30), 1, 64 * (steps + 3), 64, 10)
    loader = chunks(x, y, random_sizes(rng, len(x), 100))
    exec(compile(code.replace("tcp://127.0.0.1:5555", d.listen), "README.md", "exec"),
         {"infeed": infeed, "loader": loader})
    assert d.wait() == 0, d.log()
    assert d.end_summary()["global_step"] == steps
    assert "steps sent; 0 consumed before" in capsys.readouterr().out


def test_the_readme_workers_example_runs_as_written(daemon, rng):
    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset

    (code,) = readme_blocks("infeed.Worker(index, 4)")
    d = daemon(replicas=1, features=64, classes=10, batch_size=64, last_step=1000000,
               summary_every=0, expect_producers=4)
    rows = 64 * rng.randint(4, 12) + rng.randint(0, 63)
    x, y = steps_data(rng.randrange(1 << 30), 1, rows, 64, 10)
    dataset = TensorDataset(torch.from_numpy(x), torch.from_numpy(y).long())
    errors = []

    def worker(index):
        try:
            exec(compile(code.replace("tcp://127.0.0.1:5555", d.listen), "README.md", "exec"),
                 {"infeed": infeed, "torch": torch, "dataset": dataset, "index": index})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert d.wait() == 0, d.log()
    # each worker's share in steps of 64 rows, its tail dropped
    want = sum(len(range(i, rows, 4)) // 64 for i in range(4))
    assert d.end_summary()["global_step"] == want, (d.end_summary(), want)
