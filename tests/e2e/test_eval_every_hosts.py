"""Evaluation during training on several hosts (docs/design.md "Evaluation during training",
docs/multihost.md): infeedd under mpirun, 2 hosts, each host's eval producer sending its own
share of the eval set (of different lengths, one possibly empty: the shorter host's eval steps
are padding that counts nowhere). Every eval summary, at the requested steps and at the end of
the run, is the same on every host and equals a separate one-host --mode eval run over the union
of the two shares on the checkpoint of that step (1e-6); keep-best keeps the same best on every
host, as a 2-host checkpoint; early stopping ends every host at the same step; a host that
cannot evaluate its share makes every host skip; a stop ends a host's wait for its eval set on
every host. Skipped when mpirun is missing or infeedd was built without MPI."""

from __future__ import annotations

import json
import threading

import pytest

import ckpt
import infeed
from conftest import control_request as control
from helpers import mpi_skip_reason, seeded_batch, wait_log
from test_eval_every import eval_steps
from mpi_job import Job, same_values

_REASON = mpi_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))

H = 2
CALLS = ["confidence=mean,histogram:bins=7,range=0:1", "class=confusion,class_accuracy",
         "loss=mean"]


class Setup:
    """A random 2-host run's shapes: the input mode, replicas, the global batch and the rows of
    a producer's batch (its WELCOME's batch_size), and the batches a step takes."""

    def __init__(self, rng, input_mode=None):
        self.mode = input_mode or rng.choice(["per-host", "per-host-v2", "broadcast", "per-core"])
        self.R = rng.randint(1, 2)
        self.batch = H * self.R * rng.randint(1, 3)  # the global batch
        host = self.batch // H
        self.per_batch = host if self.mode == "per-host" else host // self.R
        self.per_step = self.R if self.mode in ("per-host-v2", "per-core") else 1
        # rows a replica-step counts (broadcast: every replica's batch, counted once)
        self.shard = host // self.R
        self.features, self.classes = rng.randint(2, 6), rng.randint(2, 4)
        print(f"{self.mode}: R {self.R} global batch {self.batch} D {self.features} "
              f"K {self.classes}")

    def flags(self, **kw) -> dict:
        f = dict(program="softmax", features=self.features, classes=self.classes,
                 batch_size=self.batch, replicas=self.R, input_mode=self.mode, summary_every=0,
                 host_call=CALLS, seed=5)
        f.update(kw)
        return f


def train_name(h: int, replica) -> str:
    return f"train-{h}" if replica is None else f"train-{h}-{replica}"


def feed_hosts(job: Job, s: Setup, steps: int, seed: int, eval_sets: list) -> list:
    """Every host: its eval producer sends its eval set and END (no replica, whatever the input
    mode), then its train producers (per-core: one a replica) send `steps` steps of batches."""
    errors = []

    def run(h):
        try:
            ev = infeed.Producer(job.listen(h), name=f"eval-{h}", timeout=30, role="eval")
            ev.hello()  # an empty share is a HELLO and an END
            for b in eval_sets[h]:
                ev.send(b)
            ev.end()
            ev.close()
            n = steps * (s.R if s.mode == "per-host-v2" else 1)
            reps = list(range(s.R)) if s.mode == "per-core" else [None]
            ps = [infeed.Producer(job.listen(h), name=train_name(h, r), timeout=30, replica=r)
                  for r in reps]
            try:
                for i in range(n):
                    for k, p in enumerate(ps):
                        p.send(seeded_batch(seed + 1000 * h + i * len(ps) + k, s.per_batch,
                                            s.features, s.classes))
            except infeed.RunEnded:
                pass
            for p in ps:
                p.end()
                p.close()
        except Exception as e:  # pragma: no cover - reported by the caller
            print(f"host {h}: {e!r}")
            errors.append(f"host {h}: {e!r}")

    ts = [threading.Thread(target=run, args=(h,), daemon=True) for h in range(H)]
    for t in ts:
        t.start()
    return ts, errors


def make_eval_sets(rng, s: Setup, seed: int) -> list:
    """Each host's share: a multiple of the batches a step takes, of different lengths, one
    share possibly empty (never both)."""
    n = [s.per_step * rng.randint(0, 3) for _ in range(H)]
    if n[0] == n[1]:
        n[rng.randrange(H)] += s.per_step
    print(f"eval batches per host: {n}")
    return [[seeded_batch(seed + 100 * h + i, s.per_batch, s.features, s.classes)
             for i in range(n[h])] for h in range(H)]


def reference_eval(tmp, s: Setup, checkpoint, eval_sets) -> dict:
    """One host, one replica, --mode eval over the union of the shares, each replica-step's rows
    a batch of their own (host 0's share, then host 1's): the same rows in the same groups as
    the 2-host eval's replica-steps, so the per-group losses are the same bits."""
    shards = []
    for share in eval_sets:
        for b in share:
            for r0 in range(0, s.per_batch, s.shard):
                shards.append({k: v[r0:r0 + s.shard] for k, v in b.items()})
    job = Job(tmp, 1, **s.flags(mode="eval", batch_size=s.shard, replicas=1,
                                input_mode="per-host", steps=len(shards),
                                checkpoint=str(checkpoint)))
    p = infeed.Producer(job.listen(0), name="ref", timeout=30)
    for b in shards:
        p.send(b)
    p.end()
    p.close()
    assert job.wait() == 0, job.log()
    (ev,) = [e for e in job.summaries(0) if e["event"] == "eval"]
    return ev


def evals(job: Job, h: int) -> list:
    return [e for e in job.summaries(h) if e["event"] == "eval"]


def test_evals_over_hosts_equal_one_host_evals_of_the_union(tmp_path, rng):
    s = Setup(rng)
    every, ipl = rng.randint(2, 3), rng.randint(1, 3)
    steps = rng.randint(4, 8)
    seed = rng.randrange(1 << 20)
    eval_sets = make_eval_sets(rng, s, seed + 50000)
    folder = tmp_path / "ck"
    job = Job(tmp_path / "run", H, **s.flags(steps=steps, iterations_per_loop=ipl,
                                             eval_every=every, learning_rate=0.3,
                                             checkpoint_dir=str(folder), checkpoint_every=every,
                                             keep_checkpoints=1000))
    ts, errors = feed_hosts(job, s, steps, seed, eval_sets)
    assert job.wait(120) == 0, job.log()
    for t in ts:
        t.join(10)
    assert not errors, errors
    want_steps = eval_steps(steps, ipl, every)
    got = [evals(job, h) for h in range(H)]
    for h in range(H):
        assert [e["global_step"] for e in got[h]] == want_steps, (h, got[h], job.log())
        assert all(e["host"] == h and e["during_train"] is True for e in got[h]), got[h]
        end = job.summaries(h)[-1]
        assert end["event"] == "end" and end["reason"] == "last_step", end
        assert end["steps"] == steps, end  # no eval batch was trained on
    longest = max(len(x) for x in eval_sets) // s.per_step
    rows = sum(len(x) for x in eval_sets) * s.per_batch  # every row once, whatever the mode
    for i, step in enumerate(want_steps):
        e0, e1 = got[0][i], got[1][i]
        # the same bits on every host
        for k in ("loss", "accuracy", "examples", "steps", "host_calls", "global_step"):
            assert e0[k] == e1[k], (k, e0, e1)
        assert e0["steps"] == longest and e0["examples"] == rows, (e0, eval_sets)
        path = folder / f"ckpt-{step:012d}.ifdckpt"
        assert path.exists(), sorted(folder.iterdir())
        ref = reference_eval(tmp_path / f"ref-{step}", s, path, eval_sets)
        assert ref["global_step"] == step and ref["examples"] == e0["examples"], (ref, e0)
        assert e0["loss"] == pytest.approx(ref["loss"], rel=1e-6), (e0, ref)
        assert e0["accuracy"] == pytest.approx(ref["accuracy"], rel=1e-6), (e0, ref)
        same_values(e0["host_calls"], ref["host_calls"])


def test_keep_best_and_early_stopping_agree_on_every_host(tmp_path, rng):
    """A learning rate so large the eval loss wanders: every host keeps the same best (the
    checkpoint of a shared folder is rank 0's, of a {rank} folder each host's, with both hosts'
    producer positions), and early stopping ends every host after the same eval."""
    s = Setup(rng, input_mode=rng.choice(["per-host", "per-host-v2"]))
    every, patience = rng.randint(1, 2), rng.randint(1, 2)
    seed = rng.randrange(1 << 20)
    eval_sets = make_eval_sets(rng, s, seed + 70000)
    per_rank = rng.choice([True, False])
    folder = f"{tmp_path}/ck-{{rank}}" if per_rank else f"{tmp_path}/ck"
    lr = rng.choice([1e-30, 4.0])
    job = Job(tmp_path / "run", H, **s.flags(last_step=40, iterations_per_loop=1,
                                             eval_every=every, learning_rate=lr,
                                             checkpoint_dir=folder, keep_best="loss",
                                             early_stopping=f"loss:{patience}"))
    ts, errors = feed_hosts(job, s, 45, seed, eval_sets)
    assert job.wait(120) == 0, job.log()
    for t in ts:
        t.join(10)
    assert not errors, errors
    got = [evals(job, h) for h in range(H)]
    assert [[e["loss"] for e in g] for g in got[1:]] == [[e["loss"] for e in got[0]]], got
    ends = [job.summaries(h)[-1] for h in range(H)]
    assert ends[0]["reason"] == ends[1]["reason"], ends
    assert ends[0]["global_step"] == ends[1]["global_step"], ends
    if lr < 1:  # the same parameters at every eval: no improvement after the first
        assert len(got[0]) == patience + 1, got[0]
    if ends[0]["reason"] == "early_stopping":
        assert ends[0]["global_step"] == got[0][-1]["global_step"], (ends, got[0])
    losses = [e["loss"] for e in got[0]]
    best = min(range(len(losses)), key=lambda i: (losses[i], i))
    for h in range(H):
        d = tmp_path / (f"ck-{h}" if per_rank else "ck")
        if h > 0 and not per_rank:
            continue  # a shared folder: rank 0 writes
        side = json.loads((d / "best" / "best.json").read_text())
        assert side["global_step"] == got[0][best]["global_step"], (side, losses)
        assert side["value"] == pytest.approx(losses[best], rel=1e-12), (side, losses)
        b = ckpt.read(d / "best" / "best.ifdckpt")
        assert b["global_step"] == got[0][best]["global_step"] and b["hosts"] == H, b
        assert [sorted(t) for t in b["host_producers"]] == [[train_name(k, None)]
                                                             for k in range(H)], b
    if not per_rank:
        assert not (tmp_path / "ck-1").exists()


def test_a_host_that_cannot_evaluate_makes_every_host_skip(tmp_path, rng):
    """per-host-v2 takes one batch a replica a step: a host whose share is not a multiple of the
    replicas cannot evaluate it, and every host skips every eval (the others' logs name it),
    training going on to the last step on both."""
    s = Setup(rng, input_mode="per-host-v2")
    s.R = 2
    s.batch = H * s.R * rng.randint(1, 2)
    s.per_batch = s.shard = s.batch // H // s.R
    s.per_step = s.R
    bad = rng.randrange(H)
    n = [2 * rng.randint(0, 2) for _ in range(H)]
    n[bad] = 2 * rng.randint(0, 2) + 1
    seed = rng.randrange(1 << 20)
    eval_sets = [[seeded_batch(seed + 100 * h + i, s.per_batch, s.features, s.classes)
                  for i in range(n[h])] for h in range(H)]
    steps, every = rng.randint(3, 6), rng.randint(1, 2)
    job = Job(tmp_path / "run", H, **s.flags(steps=steps, iterations_per_loop=1,
                                             eval_every=every))
    ts, errors = feed_hosts(job, s, steps, seed, eval_sets)
    assert job.wait(120) == 0, job.log()
    for t in ts:
        t.join(10)
    assert not errors, errors
    log = job.log()
    for h in range(H):
        assert evals(job, h) == [], (h, job.summaries(h))
        end = job.summaries(h)[-1]
        assert end["reason"] == "last_step" and end["global_step"] == steps, end
    assert (f"eval at global step {every} skipped: the eval set holds {n[bad]} batches, and "
            "per-host-v2 input takes 2 a step") in log, log
    assert (f"eval at global step {every} skipped: host {bad} cannot evaluate its eval set") \
        in log, log


def test_a_stop_ends_a_hosts_wait_for_its_eval_set(tmp_path, rng):
    """Host `late`'s eval producer never comes: at the first due eval that host waits for its
    set and the other waits for it; a stop asked on either host reaches both (the stop relay),
    ends the wait, every host skips the eval and stops at the same step."""
    s = Setup(rng, input_mode="per-host")
    every = rng.randint(1, 3)
    late, asker = rng.randrange(H), rng.randrange(H)
    seed = rng.randrange(1 << 20)
    job = Job(tmp_path / "run", H, **s.flags(last_step=1000, iterations_per_loop=1,
                                             eval_every=every))
    stop = threading.Event()
    errors = []

    def run(h):
        try:
            if h != late:
                ev = infeed.Producer(job.listen(h), name=f"eval-{h}", timeout=30, role="eval")
                ev.send(seeded_batch(seed + h, s.per_batch, s.features, s.classes))
                ev.end()
                ev.close()
            with infeed.Producer(job.listen(h), name=train_name(h, None), timeout=30) as p:
                for i in range(1000):
                    if stop.is_set():
                        break
                    p.send(seeded_batch(seed + 1000 * h + i, s.per_batch, s.features,
                                        s.classes))
        except infeed.RunEnded:
            pass
        except Exception as e:  # pragma: no cover - reported below
            errors.append(f"host {h}: {e!r}")

    ts = [threading.Thread(target=run, args=(h,), daemon=True) for h in range(H)]
    for t in ts:
        t.start()
    wait_log(job, f"eval due at global step {every}: training waits for the eval set", 60)
    assert control(f"ipc://{job.tmp}/ctl-{asker}", {"cmd": "stop"}) == {"ok": True}
    rc = job.wait(60)
    stop.set()
    for t in ts:
        t.join(10)
    assert rc == 0, job.log()
    assert not errors, errors
    log = job.log()
    assert f"eval at global step {every} skipped: the run is stopping" in log, log
    for h in range(H):
        assert evals(job, h) == [], (h, job.summaries(h))
        end = job.summaries(h)[-1]
        assert end["reason"] == "stopped" and end["global_step"] == every, (h, end)
