"""Eval, predict and tensor messages over several hosts (docs/multihost.md): infeedd under
mpirun on this machine, ipc endpoints only. Eval over 2 and 4 hosts equals 1 host (metrics summed
in rank order: counts bit for bit, floats within 1e-6); eval's input ending on one host ends all
at the same step; predict over 2 hosts equals 1 host; tensor messages concatenate the hosts'
rows in rank order; cuda over 2 hosts equals 1 host with 2 GPUs (only with
IFD_TEST_CUDA_HOSTS=1). Skipped when mpirun is missing or infeedd was built without MPI."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import infeed
from conftest import control_request as control
from helpers import mpi_skip_reason
from mpi_job import Job, feed, same_values, train_losses, write_softmax_checkpoint


_REASON = mpi_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


def eval_summary(job: Job, h: int) -> dict:
    ev = [s for s in job.summaries(h) if s["event"] == "eval"]
    assert len(ev) == 1, (h, job.summaries(h), job.log())
    return ev[0]


@pytest.mark.parametrize("hosts,replicas", [(2, 1), (2, 2), (4, 1)])
def test_eval_over_hosts_equals_one_host(tmp_path, rng, hosts, replicas):
    """Eval of one checkpoint on the same global batches: H hosts x R and 1 host x HR give the
    same eval summary (loss, accuracy, examples, steps) on every host, and the same host calls
    over the labels and confidences, concatenated across hosts (the last label is the global
    batch's last row's): 2x1, 2x2 and 4x1 against 1x2 and 1x4; the eval metrics' integer counts
    (histograms, confusion) bit for bit, their float sums within 1e-6."""
    calls = ["label=sum,last,min,max,histogram", "confidence=mean,histogram:bins=7,range=0:1",
             "class=confusion,class_accuracy,precision_recall"]
    R1 = hosts * replicas
    features, classes = rng.randint(1, 8), rng.randint(2, 5)
    batch = R1 * rng.randint(1, 4)
    steps = rng.randint(1, 12)
    step = rng.randint(1, 1000)
    print(f"{hosts} x {replicas} vs 1 x {R1}: batch {batch} steps {steps} D {features} "
          f"K {classes} checkpoint step {step}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    folder = tmp_path / "ck"
    write_softmax_checkpoint(folder, features, classes, step,
                             nrng.standard_normal(features * classes + classes))
    batches = [(nrng.standard_normal((batch, features)).astype(np.float32),
                nrng.integers(0, classes, batch, dtype=np.int32)) for _ in range(steps)]
    runs = {}
    for H, R in [(hosts, replicas), (1, R1)]:
        job = Job(tmp_path / f"{H}x{R}", H, mode="eval", program="softmax", features=features,
                  classes=classes, batch_size=batch, replicas=R, steps=steps,
                  checkpoint_dir=str(folder), iterations_per_loop=rng.randint(1, 5),
                  host_call=calls)
        ts, errors = feed(job, batches)
        assert job.wait() == 0, job.log()
        for t in ts:
            t.join(10)
        assert not errors, errors
        runs[(H, R)] = job
    want = eval_summary(runs[(1, R1)], 0)
    assert want["steps"] == steps and want["examples"] == steps * batch, want
    for h in range(hosts):
        got = eval_summary(runs[(hosts, replicas)], h)
        assert got["host"] == h and got["global_step"] == step, got
        assert got["steps"] == want["steps"] and got["examples"] == want["examples"], (got, want)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), (got, want)
        assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6), (got, want)
        y = np.concatenate([b[1] for b in batches])
        label = dict(want["host_calls"]["label"])
        assert sum(label.pop("histogram")["bucket"]) == len(y), want
        assert label == {"sum": int(y.sum()), "last": int(y[-1]), "min": int(y.min()),
                         "max": int(y.max())}, want
        assert sum(want["host_calls"]["confidence"]["histogram"]["bucket"]) <= len(y)
        same_values(got["host_calls"], want["host_calls"])


def test_eval_input_ending_on_one_host_ends_all_at_the_same_step(tmp_path, rng):
    ended_at = rng.randint(1, 12)
    short = rng.choice([0, 1])
    batch = 2 * rng.randint(1, 4)
    features, classes = rng.randint(1, 6), rng.randint(2, 4)
    print(f"host {short}'s input ends after {ended_at} batches; batch {batch}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    folder = tmp_path / "ck"
    write_softmax_checkpoint(folder, features, classes, 5,
                             nrng.standard_normal(features * classes + classes))
    batches = [(nrng.standard_normal((batch, features)).astype(np.float32),
                nrng.integers(0, classes, batch, dtype=np.int32)) for _ in range(60)]
    job = Job(tmp_path / "run", 2, mode="eval", program="softmax", features=features,
              classes=classes, batch_size=batch, steps=50, checkpoint_dir=str(folder),
              expect_producers=1)
    n = [60, 60]
    n[short] = ended_at
    ts, errors = feed(job, batches, host_batches=n)
    assert job.wait() == 0, job.log()
    for t in ts:
        t.join(10)
    for h in range(2):
        ev = eval_summary(job, h)
        assert ev["steps"] == ended_at and ev["examples"] == ended_at * batch, (h, ev)
        end = job.summaries(h)[-1]
        assert end["event"] == "end" and end["reason"] == "input_ended", (h, end)


def test_predict_over_hosts_equals_one_host(tmp_path, rng):
    """Each host predicts its own producer's rows, padding its last batch and ending on its own
    stopping signal (the hosts' inputs differ in length): the predictions equal those of one
    host predicting the same streams."""
    H, R = 2, rng.randint(1, 2)
    features, classes = rng.randint(1, 8), rng.randint(2, 5)
    host_batch = R * rng.randint(1, 4)
    rows = [rng.randint(1, 40) for _ in range(H)]
    print(f"R {R} host batch {host_batch} rows {rows} D {features} K {classes}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    folder = tmp_path / "ck"
    write_softmax_checkpoint(folder, features, classes, 3,
                             nrng.standard_normal(features * classes + classes))
    xs = [nrng.standard_normal((n, features)).astype(np.float32) for n in rows]

    def run(job, endpoints):
        out, errors = {}, []

        def one(h):
            try:
                with infeed.Producer(endpoints[h], name=f"loader-{h}", timeout=30) as p:
                    for i in range(0, rows[h], host_batch):
                        p.send(x=xs[h][i:i + host_batch])
                    p.end(wait_bye=False)
                    out[h] = list(p.predictions())
            except Exception as e:  # pragma: no cover - reported below
                errors.append(f"loader-{h}: {e!r}")

        ts = [threading.Thread(target=one, args=(h,), daemon=True) for h in range(H)]
        for t in ts:
            t.start()
        assert job.wait() == 0, job.log()
        for t in ts:
            t.join(10)
        assert not errors, (errors, job.log())
        return out

    common = dict(mode="predict", program="softmax", features=features, classes=classes,
                  replicas=R, steps=0, checkpoint_dir=str(folder),
                  iterations_per_loop=rng.randint(1, 4))
    many = Job(tmp_path / "many", H, batch_size=H * host_batch, expect_producers=1, **common)
    got = run(many, [many.listen(h) for h in range(H)])
    one = Job(tmp_path / "one", 1, batch_size=host_batch, expect_producers=H, **common)
    want = run(one, [one.listen(0)] * H)
    for h in range(H):
        assert [s for s, _ in got[h]] == [s for s, _ in want[h]], (h, got[h], want[h])
        g = np.concatenate([a["probabilities"] for _, a in got[h]])
        w = np.concatenate([a["probabilities"] for _, a in want[h]])
        assert g.shape == (rows[h], classes), g.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
        assert np.array_equal(np.concatenate([a["classes"] for _, a in got[h]]),
                              np.concatenate([a["classes"] for _, a in want[h]]))
    for h in range(H):
        end = many.summaries(h)[-1]
        assert end["event"] == "end" and end["status"] == "ok", (h, end)


@pytest.mark.skipif(os.environ.get("IFD_TEST_CUDA_HOSTS") != "1",
                    reason="the cuda backend over hosts needs 2 GPUs: bench/gpu.sh runs it "
                           "(IFD_TEST_CUDA_HOSTS=1) where MPI and 2 GPUs are present")
def test_cuda_two_hosts_equal_one_host_with_two_gpus(tmp_path, rng):
    """2 ranks x 1 GPU (one NCCL communicator over both, rank 0's ncclUniqueId broadcast with
    MPI) against 1 rank x 2 GPUs on the same global batches: the same per-step losses."""
    features, classes = rng.randint(1, 8), rng.randint(2, 5)
    batch = 2 * rng.randint(1, 8)
    steps, ipl = rng.randint(5, 30), rng.randint(1, 7)
    opt = rng.choice(["sgd", "momentum", "adam"])
    print(f"cuda 2 x 1 vs 1 x 2: batch {batch} steps {steps} ipl {ipl} D {features} K {classes} "
          f"{opt}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((batch, features)).astype(np.float32),
                nrng.integers(0, classes, batch, dtype=np.int32)) for _ in range(steps + 5)]
    common = dict(backend="cuda", program="softmax", features=features, classes=classes,
                  batch_size=batch, steps=steps, iterations_per_loop=ipl, summary_every=1,
                  optimizer=opt, learning_rate=0.1)
    runs = {}
    for H, R in [(2, 1), (1, 2)]:
        job = Job(tmp_path / f"{H}x{R}", H, gpu_per_rank=H > 1, replicas=R, **common)
        ts, errors = feed(job, batches)
        rc = job.wait(120)
        for t in ts:
            t.join(10)
        assert rc == 0, job.log()
        assert not errors, errors
        runs[(H, R)] = job
    want = train_losses(runs[(1, 2)])
    assert len(want) == steps
    for h in range(2):
        np.testing.assert_allclose(train_losses(runs[(2, 1)], h), want, rtol=1e-5)


@pytest.mark.parametrize("replicas", [1, 2])
def test_tensor_messages_concatenate_hosts_in_rank_order(tmp_path, rng, replicas):
    """2 hosts: every host publishes each step's outfeed tensors concatenated over its replicas,
    then over the hosts in rank order (docs/summaries.md, "Tensor messages"), so a subscriber of
    either host gets the global batch's rows in order: the probe program ($INFEED_PROBE_PLUGIN)
    outfeeds its inputs."""
    probe = os.environ.get("INFEED_PROBE_PLUGIN")
    if not probe:
        pytest.skip("the probe plugin is not built (set INFEED_PROBE_PLUGIN)")
    hosts, classes = 2, rng.randint(2, 5)
    batch, steps = hosts * replicas * rng.randint(1, 3), rng.randint(3, 15)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((batch, 3)).astype(np.float32),
                nrng.integers(0, classes, batch, dtype=np.int32)) for _ in range(steps + 3)]
    job = Job(tmp_path, hosts, replicas=replicas, program_lib=probe, program="probe",
              features=3, classes=classes, batch_size=batch, steps=steps,
              iterations_per_loop=rng.randint(1, 5), learning_rate=0.01,
              publish=f"ipc://{tmp_path}/pub-{{rank}}")
    subs = [infeed.Subscriber(f"ipc://{tmp_path}/pub-{h}", timeout=60, connect_timeout=60,
                              tensors=["x3", "y1"]) for h in range(hosts)]
    try:
        for h in range(hosts):  # the event: each host has read both subscriptions
            deadline = time.monotonic() + 60
            while True:
                try:
                    st = control(f"ipc://{tmp_path}/ctl-{h}", {"cmd": "status"})
                    if st["tensor_messages"]["subscribed"] == 2:
                        break
                except (TimeoutError, OSError, KeyError):
                    pass
                assert time.monotonic() < deadline, job.log()
                time.sleep(0.05)
        ts, errors = feed(job, batches)
        got = [dict(s) for s in subs]
        rc = job.wait()
        for t in ts:
            t.join(10)
        assert rc == 0, job.log()
        assert not errors, errors
    finally:
        for s in subs:
            s.close()
    for h in range(hosts):
        assert sorted(got[h]) == list(range(1, steps + 1)), (h, sorted(got[h]))
        for step in range(1, steps + 1):
            x, y = batches[step - 1]
            np.testing.assert_array_equal(got[h][step]["x3"], x, err_msg=f"host {h} step {step}")
            np.testing.assert_array_equal(got[h][step]["y1"], y, err_msg=f"host {h} step {step}")
