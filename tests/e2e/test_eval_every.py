"""Evaluation during training (--eval-every, docs/design.md "Evaluation during training"): an eval
producer's batches are kept by the daemon and never trained on; every N steps, at the first loop
end at or past each multiple, the daemon evaluates the current parameters on them and publishes an
eval summary equal to a separate --mode eval run on the checkpoint of that step; an eval set over
--eval-memory is refused with a sentence and training goes on as without it; --keep-best keeps
the best eval's checkpoint; --early-stopping ends the run after PATIENCE evals without
improvement."""

import json
import threading

import numpy as np
import pytest

import ckpt
import infeed
from conftest import run_infeedd
from helpers import seeded_batch, stream_until_end, wait_log


def charged(rows: int, features: int) -> int:
    """What --eval-memory charges a batch of x float32 [rows, features] and y int32 [rows]: each
    tensor rounded up to 64 bytes, and 2048 bytes of bookkeeping (docs/config.md)."""
    def up(n):
        return (n + 63) // 64 * 64
    return up(4 * rows * features) + up(4 * rows) + 2048


def eval_batches(seed: int, n: int, rows: int, features: int, classes: int) -> list:
    return [seeded_batch(seed + i, rows, features, classes) for i in range(n)]


def send_eval_set(endpoint: str, batches: list, name: str = "evaluator",
                  role: str = "eval") -> infeed.Producer:
    """Sends the eval set and END (to an eval-mode daemon: role "train"); returns the producer
    (closed)."""
    p = infeed.Producer(endpoint, name=name, timeout=20, role=role)
    for b in batches:
        p.send(b)
    p.end()
    p.close()
    return p


def train_stream(endpoint: str, steps: int, seed: int, rows: int, features: int,
                 classes: int, per_core: int = 0) -> threading.Thread:
    """A thread streaming `steps` batches as 'trainer', then END; per_core R: `steps` batches a
    replica, from R producers 'trainer-r' (batch seed + i * R + r to replica r)."""
    def run():
        if not per_core:
            with infeed.Producer(endpoint, name="trainer", timeout=30) as p:
                for i in range(steps):
                    p.send(seeded_batch(seed + i, rows, features, classes))
            return
        ps = [infeed.Producer(endpoint, name=f"trainer-{r}", timeout=30, replica=r)
              for r in range(per_core)]
        for i in range(steps):
            for r, p in enumerate(ps):
                p.send(seeded_batch(seed + i * per_core + r, rows, features, classes))
        for p in ps:
            p.end()
            p.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def eval_steps(steps: int, ipl: int, every: int) -> list:
    """The global steps an eval runs at: the first loop end at or past each multiple of every
    (loops of ipl steps, the last one shortened to end at steps), and the last step (the eval at
    the end of the run) when no eval ran there."""
    out, due, b = [], every, 0
    while b < steps:
        b = min(b + ipl, steps)
        if b >= due:
            out.append(b)
            due = (b // every + 1) * every
    if not out or out[-1] != steps:
        out.append(steps)
    return out


def evals_of(d) -> list:
    return [s for s in d.summaries() if s["event"] == "eval"]


def common(program, replicas, rows, features, classes, **kw) -> dict:
    f = dict(program=program, replicas=replicas, batch_size=rows, features=features,
             classes=classes, summary_every=0, seed=3)
    if program == "mlp":
        f["hidden"] = 7
    f.update(kw)
    return f


@pytest.mark.parametrize("input_mode", ["per-host", "per-host-v2", "broadcast", "per-core"])
def test_eval_summaries_equal_eval_runs_on_checkpoints(daemon, tmp_path, rng, input_mode):
    """Every eval (at the multiples, and at the end of the run) equals a separate --mode eval run
    on the checkpoint of its step. per-core: the eval producer names no replica, the eval session
    runs per-host-v2 (one eval batch a replica a step, in arrival order), and so does the
    reference run."""
    program = rng.choice(["softmax", "mlp"])
    replicas = rng.randint(1, 3)
    rows = replicas * rng.randint(1, 6)  # the global batch
    # rows a batch has (WELCOME's batch_size), and eval batches a step takes
    per_batch = rows if input_mode == "per-host" else rows // replicas
    per_step = replicas if input_mode in ("per-host-v2", "per-core") else 1
    per_core = replicas if input_mode == "per-core" else 0
    features, classes = rng.randint(2, 8), rng.randint(2, 5)
    every, ipl, steps = rng.randint(2, 5), rng.randint(1, 4), rng.randint(8, 16)
    neval = per_step * rng.randint(1, 4)
    seed = rng.randrange(1 << 20)
    folder = tmp_path / "ck"
    base = common(program, replicas, rows, features, classes, input_mode=input_mode)
    d = daemon(**base, steps=steps, iterations_per_loop=ipl, eval_every=every,
               learning_rate=0.3, checkpoint_dir=str(folder), checkpoint_every=every,
               keep_checkpoints=1000)
    # The trainer first: the first eval is due before the eval set is there, and training waits
    # for it (the rule of docs/design.md), then the eval producer sends it.
    train_batches = steps * (replicas if input_mode == "per-host-v2" else 1)
    t = train_stream(d.listen, train_batches, seed, per_batch, features, classes, per_core)
    wait_log(d, "training waits for the eval set")
    ev_batches = eval_batches(seed + 10000, neval, per_batch, features, classes)
    p = send_eval_set(d.listen, ev_batches)
    assert p.welcome["role"] == "eval", p.welcome
    t.join(60)
    assert d.wait(60) == 0, d.log()
    end = d.end_summary()
    assert end["status"] == "ok" and end["reason"] == "last_step", end
    assert end["global_step"] == steps, end
    evals = evals_of(d)
    want = eval_steps(steps, ipl, every)
    assert [e["global_step"] for e in evals] == want, (evals, want)
    assert all(e["during_train"] is True for e in evals), evals
    # No eval batch was trained on: the train run took exactly its own batches.
    assert end["steps"] == steps, end
    for e in evals:
        assert e["steps"] == neval // per_step, e
        path = folder / f"ckpt-{e['global_step']:012d}.ifdckpt"
        assert path.exists(), sorted(folder.iterdir())
        ref_base = dict(base, input_mode="per-host-v2") if per_core else base
        ref = daemon(**ref_base, mode="eval", steps=neval // per_step, checkpoint=str(path))
        send_eval_set(ref.listen, ev_batches, role="train")
        assert ref.wait() == 0, ref.log()
        (r,) = evals_of(ref)
        assert "during_train" not in r, r
        assert r["global_step"] == e["global_step"], (r, e)
        assert e["examples"] == r["examples"] and e["steps"] == r["steps"], (e, r)
        assert e["loss"] == pytest.approx(r["loss"], rel=1e-6), (e, r)
        assert e["accuracy"] == pytest.approx(r["accuracy"], rel=1e-6), (e, r)


def test_automatic_loop_lengths_put_evals_on_the_multiples(daemon, rng):
    """Loops the daemon sizes itself (--iterations-per-loop auto) end at each multiple of N: the
    evals run at exactly N, 2N, ..."""
    rows, every, seed = rng.randint(1, 4), rng.randint(2, 7), rng.randrange(1 << 20)
    steps = every * rng.randint(2, 4) + rng.randint(0, every - 1)
    d = daemon(**common("softmax", 1, rows, 3, 2), steps=steps, iterations_per_loop="auto",
               eval_every=every)
    send_eval_set(d.listen, eval_batches(seed, rng.randint(1, 3), rows, 3, 2))
    train_stream(d.listen, steps, seed + 1, rows, 3, 2).join(60)
    assert d.wait(60) == 0, d.log()
    got = [e["global_step"] for e in evals_of(d)]
    want = list(range(every, steps + 1, every))
    if steps % every:  # and one at the end of the run
        want.append(steps)
    assert got == want, (got, every, steps)


def test_per_host_v2_eval_set_of_a_partial_step_is_skipped(daemon, rng):
    """per-host-v2 takes one batch a replica a step: an eval set that is not a multiple of the
    replicas is skipped with a warning, and training goes on."""
    replicas, seed = rng.randint(2, 3), rng.randrange(1 << 20)
    n = replicas * rng.randint(0, 2) + rng.randint(1, replicas - 1)
    d = daemon(**common("softmax", replicas, 2 * replicas, 3, 2, input_mode="per-host-v2"),
               steps=4, iterations_per_loop=2, eval_every=2)
    send_eval_set(d.listen, eval_batches(seed, n, 2, 3, 2))
    train_stream(d.listen, 4 * replicas, seed, 2, 3, 2).join(60)
    assert d.wait(60) == 0, d.log()
    assert d.end_summary()["reason"] == "last_step", d.end_summary()
    assert evals_of(d) == [], d.summaries()
    assert (f"eval at global step 2 skipped: the eval set holds {n} batches, and per-host-v2 "
            f"input takes {replicas} a step (one a replica): expected a multiple of "
            f"{replicas}") in d.log(), d.log()


def test_an_eval_producer_that_times_out_leaves_the_set_incomplete(daemon, rng):
    """An eval producer silent with credit for producer_timeout, before its END: the eval set is
    incomplete, every eval is skipped naming it, and training goes on."""
    rows, seed = rng.randint(1, 4), rng.randrange(1 << 20)
    d = daemon(**common("softmax", 1, rows, 3, 2), steps=6, iterations_per_loop=2, eval_every=2,
               producer_timeout=0.5)
    p = infeed.Producer(d.listen, name="slow-ev", timeout=20, role="eval")
    p.send(seeded_batch(seed, rows, 3, 2))
    p.wait()
    wait_log(d, "producer 'slow-ev' timed out")
    train_stream(d.listen, 6, seed, rows, 3, 2).join(60)
    assert d.wait(60) == 0, d.log()
    p.close()
    assert d.end_summary()["reason"] == "last_step", d.end_summary()
    assert evals_of(d) == [], d.summaries()
    for step in (2, 4, 6):
        assert (f"eval at global step {step} skipped: eval producer 'slow-ev' timed out "
                "(producer_timeout) before its END: the eval set is incomplete") in d.log(), d.log()


def test_a_stop_ends_the_wait_for_the_eval_set(daemon, rng):
    """No eval producer ever comes: training waits at the first due eval, and a stop request
    ends the wait (the eval skipped) and the run."""
    rows, every, seed = rng.randint(1, 6), rng.randint(1, 5), rng.randrange(1 << 20)
    d = daemon(**common("softmax", 1, rows, 3, 2), last_step=1000, iterations_per_loop=1,
               eval_every=every)
    t = threading.Thread(target=stream_until_end, daemon=True,
                         args=(d.listen, lambda i: seeded_batch(seed + i, rows, 3, 2)),
                         kwargs=dict(max_batches=1000, name="trainer"))
    t.start()
    wait_log(d, f"eval due at global step {every}: training waits for the eval set (no eval "
                "producer has connected yet)")
    assert d.control({"cmd": "stop"})["ok"], d.log()
    assert d.wait(30) == 0, d.log()
    t.join(30)
    end = d.end_summary()
    assert end["status"] == "ok" and end["reason"] == "stopped", end
    assert end["global_step"] == every, end
    assert f"eval at global step {every} skipped: the run is stopping" in d.log(), d.log()
    assert evals_of(d) == []


def test_eval_set_over_the_bound_is_refused_and_training_goes_on(daemon, tmp_path, rng):
    replicas = rng.randint(1, 2)
    rows = replicas * rng.randint(1, 4)
    features, classes = rng.randint(2, 6), rng.randint(2, 4)
    steps, seed = rng.randint(6, 12), rng.randrange(1 << 20)
    batch_bytes = charged(rows, features)
    fit = rng.randint(1, 3)
    limit = fit * batch_bytes + rng.randint(0, batch_bytes - 1)
    base = common("softmax", replicas, rows, features, classes, steps=steps,
                  iterations_per_loop=2, learning_rate=0.2)
    ref = daemon(**base, checkpoint_dir=str(tmp_path / "ref"))
    train_stream(ref.listen, steps, seed, rows, features, classes).join(60)
    assert ref.wait() == 0, ref.log()

    d = daemon(**base, eval_every=2, eval_memory=limit, checkpoint_dir=str(tmp_path / "run"))
    p = infeed.Producer(d.listen, name="evaluator", timeout=20, role="eval")
    batches = eval_batches(seed + 500, fit + 1, rows, features, classes)
    for b in batches[:fit]:
        p.send(b)
    p.wait()  # every batch that fits is acknowledged
    with pytest.raises(infeed.InfeedError) as e:
        p.send(batches[fit])
        p.wait()
    p.close()
    msg = e.value.message
    assert e.value.code == "ERANGE", e.value
    assert "--eval-memory" in msg and f"({limit} bytes)" in msg, msg
    assert f"holds {fit * batch_bytes} bytes" in msg and f"takes {batch_bytes} bytes" in msg, msg
    st = d.control({"cmd": "status"})["eval_set"]
    assert st["batches"] == fit and st["bytes"] == fit * batch_bytes, st
    assert st["max_bytes"] == limit and st["producers"] == 1 and not st["complete"], st
    assert "--eval-memory" in st["incomplete"] and "was refused" in st["incomplete"], st
    train_stream(d.listen, steps, seed, rows, features, classes).join(60)
    assert d.wait(60) == 0, d.log()
    end = d.end_summary()
    assert end["status"] == "ok" and end["reason"] == "last_step", end
    assert evals_of(d) == [] and "eval at global step 2 skipped" in d.log(), d.log()
    got = ckpt.read(ckpt.files(tmp_path / "run")[-1])
    want = ckpt.read(ckpt.files(tmp_path / "ref")[-1])
    assert got["global_step"] == want["global_step"] == steps
    np.testing.assert_array_equal(got["params"], want["params"])


def best_index(values, minimize) -> int:
    """The index of the first best value (an eval is better only when strictly so)."""
    best = 0
    for i, v in enumerate(values):
        if (v < values[best]) if minimize else (v > values[best]):
            best = i
    return best


@pytest.mark.parametrize("metric", ["loss", "accuracy"])
def test_keep_best_keeps_the_checkpoint_of_the_best_eval(daemon, tmp_path, rng, metric):
    replicas = rng.randint(1, 2)
    rows = replicas * rng.randint(2, 6)
    features, classes = rng.randint(2, 6), rng.randint(2, 4)
    every, steps, seed = rng.randint(1, 3), rng.randint(10, 16), rng.randrange(1 << 20)
    folder = tmp_path / "ck"
    # a large learning rate: the eval metric goes up and down
    d = daemon(**common("softmax", replicas, rows, features, classes), steps=steps,
               iterations_per_loop=1, eval_every=every, learning_rate=rng.choice([2.0, 5.0]),
               checkpoint_dir=str(folder), checkpoint_every=every, keep_checkpoints=1000,
               keep_best=metric)
    neval = rng.randint(1, 4)
    send_eval_set(d.listen, eval_batches(seed + 99, neval, rows, features, classes))
    st = d.control({"cmd": "status"})["eval_set"]
    assert st == {"batches": neval, "bytes": neval * charged(rows, features),
                  "max_bytes": 1 << 30, "producers": 1, "ended": 1, "complete": True,
                  "incomplete": None}, st
    train_stream(d.listen, steps, seed, rows, features, classes).join(60)
    assert d.wait(60) == 0, d.log()
    evals = evals_of(d)
    assert [e["global_step"] for e in evals] == eval_steps(steps, 1, every), evals
    values = [e[metric] for e in evals]
    i = best_index(values, minimize=metric == "loss")
    side = json.loads((folder / "best" / "best.json").read_text())
    assert side["metric"] == metric and side["global_step"] == evals[i]["global_step"], \
        (side, values)
    assert side["value"] == pytest.approx(values[i], rel=1e-12), (side, values)
    assert side["checkpoint"] == "best.ifdckpt", side
    best = ckpt.read(folder / "best" / "best.ifdckpt")
    same = ckpt.read(folder / f"ckpt-{evals[i]['global_step']:012d}.ifdckpt")
    assert best["global_step"] == evals[i]["global_step"]
    np.testing.assert_array_equal(best["params"], same["params"])
    # the folder's own checkpoints are untouched by it: the latest is the run's last step
    assert int(ckpt.files(folder)[-1].stem[5:]) == steps


def stop_index(values, minimize, patience):
    """The index of the eval after which early stopping ends the run, or None."""
    best, bad = None, 0
    for i, v in enumerate(values):
        if best is None or ((v < best) if minimize else (v > best)):
            best, bad = v, 0
        else:
            bad += 1
            if bad >= patience:
                return i
    return None


@pytest.mark.parametrize("metric", ["loss", "accuracy"])
def test_early_stopping_ends_after_patience_evals_without_improvement(daemon, tmp_path, rng,
                                                                       metric):
    replicas = rng.randint(1, 2)
    rows = replicas * rng.randint(2, 5)
    features, classes = rng.randint(2, 6), rng.randint(2, 4)
    every, patience = rng.randint(1, 3), rng.randint(1, 3)
    seed = rng.randrange(1 << 20)
    # a learning rate of 1e-30: no parameter moves (the same bits every eval); a large one: the
    # metric wanders
    lr = rng.choice([1e-30, 4.0])
    d = daemon(**common("softmax", replicas, rows, features, classes), last_step=600,
               iterations_per_loop=1, eval_every=every, learning_rate=lr,
               early_stopping=f"{metric}:{patience}")
    send_eval_set(d.listen, eval_batches(seed + 7, rng.randint(1, 3), rows, features, classes))
    stream_until_end(d.listen, lambda i: seeded_batch(seed + i, rows, features, classes),
                     max_batches=700, name="trainer")
    assert d.wait(60) == 0, d.log()
    evals = evals_of(d)
    values = [e[metric] for e in evals]
    i = stop_index(values, metric == "loss", patience)
    end = d.end_summary()
    if lr < 1:
        assert len(evals) == patience + 1, values
    if i is None:  # a large learning rate that kept improving the metric to the last step
        assert end["reason"] == "last_step" and len(evals) == 600 // every, (end, values)
        return
    assert i == len(evals) - 1, (values, patience)
    assert end["status"] == "ok" and end["reason"] == "early_stopping", end
    assert end["global_step"] == evals[-1]["global_step"], (end, evals[-1])
    assert metric in end["message"] and f"in {patience} evals" in end["message"], end


def test_eval_every_config_errors(tmp_path):
    base = ["--features", "3", "--classes", "2", "--steps", "5"]
    cases = [
        (["--mode", "eval", "--eval-every", "2", "--checkpoint", str(tmp_path / "x")],
         "--eval-every: evaluates during training: expected 0 in eval mode, got 2"),
        (["--keep-best", "loss"], "--keep-best: keeps the best eval's checkpoint: expected "
                                  "--eval-every N with it, got none"),
        (["--eval-every", "2", "--keep-best", "loss"], "expected --checkpoint-dir with it"),
        (["--eval-every", "2", "--keep-best", "lo ss", "--checkpoint-dir", str(tmp_path)],
         "got 'lo ss'"),
        (["--early-stopping", "loss:2"], "--early-stopping: stops on evals: expected "
                                         "--eval-every N with it, got none"),
        (["--eval-every", "2", "--early-stopping", "loss"], "expected METRIC:PATIENCE"),
        (["--eval-every", "2", "--early-stopping", "loss:0"], "got 'loss:0'"),
        (["--eval-every", "2", "--eval-memory", "0"], "--eval-memory: expected 1 or more bytes"),
    ]
    for flags, text in cases:
        r = run_infeedd(*base, *flags)
        assert r.returncode == 2 and text in r.stderr, (flags, r.stderr)


def test_eval_role_needs_eval_every(daemon):
    d = daemon(features=3, classes=2, batch_size=2, steps=1)
    assert d.control({"cmd": "status"})["eval_set"] is None
    with pytest.raises(infeed.InfeedError) as e:
        infeed.Producer(d.listen, name="ev", timeout=20, role="eval").hello()
    assert e.value.code == "EINVAL" and "--eval-every N" in e.value.message, e.value
    with pytest.raises(ValueError, match="role"):
        infeed.Producer(d.listen, role="test")
    d.kill()


def test_help_names_the_eval_flags():
    out = run_infeedd("--help").stdout
    for flag in ("--eval-every N", "--eval-memory BYTES", "--keep-best METRIC",
                 "--early-stopping METRIC:PATIENCE"):
        assert flag in out, flag


def test_a_run_ending_off_a_multiple_ends_with_an_eval(daemon, tmp_path, rng):
    """The last step is not a multiple of N: after the evals at the multiples, one more at the
    end of the run, of the final parameters (as Estimator's train_and_evaluate ends), equal to a
    --mode eval run on the end checkpoint."""
    every = rng.randint(2, 5)
    steps = every * rng.randint(1, 3) + rng.randint(1, every - 1)
    rows, features, classes = rng.randint(1, 5), rng.randint(2, 6), rng.randint(2, 4)
    seed, neval = rng.randrange(1 << 20), rng.randint(1, 3)
    base = common("softmax", 1, rows, features, classes)
    folder = tmp_path / "ck"
    d = daemon(**base, steps=steps, iterations_per_loop=1, eval_every=every, learning_rate=0.3,
               checkpoint_dir=str(folder))
    ev = eval_batches(seed + 3000, neval, rows, features, classes)
    send_eval_set(d.listen, ev)
    train_stream(d.listen, steps, seed, rows, features, classes).join(60)
    assert d.wait(60) == 0, d.log()
    evals = evals_of(d)
    assert [e["global_step"] for e in evals] == list(range(every, steps, every)) + [steps], evals
    assert f"eval at the end of the run, global step {steps}" in d.log(), d.log()
    ref = daemon(**base, mode="eval", steps=neval,
                 checkpoint=str(folder / f"ckpt-{steps:012d}.ifdckpt"))
    send_eval_set(ref.listen, ev, role="train")
    assert ref.wait() == 0, ref.log()
    (r,) = evals_of(ref)
    assert evals[-1]["examples"] == r["examples"], (evals[-1], r)
    assert evals[-1]["loss"] == pytest.approx(r["loss"], rel=1e-6), (evals[-1], r)
    assert evals[-1]["accuracy"] == pytest.approx(r["accuracy"], rel=1e-6), (evals[-1], r)
