"""Several hosts (docs/multihost.md): infeedd under mpirun on this machine, ipc endpoints only.

2 hosts x 1 replica and 2 x 2 against 1 x 2 and 1 x 4 on the same global batches (each host's
producer sends its rows of every global batch): the same per-step losses and parameters, the
same bits on every host; the input ending on one host ends all at the same step; SIGTERM to one
rank stops all at the same loop boundary, and a stop sent to one host while another's loop waits
for input ends every host at the same step; SIGKILL of one rank ends the job, naming it; one
checkpoint holds both hosts' producer positions, a killed 2-host run resumes from it on 2 hosts
with the losses of an uninterrupted one, and resuming on 1 or 3 hosts is refused; hosts that
differ in a shared setting are refused. Eval, predict and tensor messages over several hosts:
test_multihost_eval.py. Skipped when mpirun is missing or infeedd was built without MPI."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ckpt
from conftest import control_request as control
from helpers import mpi_skip_reason
from mpi_job import Job, feed, last_params, train_losses, write_softmax_checkpoint


_REASON = mpi_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


@pytest.mark.parametrize("hosts,replicas", [(2, 1), (2, 2)])
def test_same_losses_and_params_as_one_host(tmp_path, rng, hosts, replicas):
    R1 = hosts * replicas
    features, classes = rng.randint(1, 8), rng.randint(2, 5)
    batch = R1 * rng.randint(1, 4)
    steps, ipl = rng.randint(5, 25), rng.randint(1, 7)
    opt = rng.choice(["sgd", "momentum", "adam"])
    print(f"{hosts} x {replicas} vs 1 x {R1}: batch {batch} steps {steps} ipl {ipl} D {features} "
          f"K {classes} {opt}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((batch, features)).astype(np.float32),
                nrng.integers(0, classes, batch, dtype=np.int32)) for _ in range(steps + 5)]
    common = dict(program="softmax", features=features, classes=classes, batch_size=batch,
                  steps=steps, iterations_per_loop=ipl, summary_every=1, optimizer=opt,
                  learning_rate=0.1)
    runs = {}
    for H, R in [(hosts, replicas), (1, R1)]:
        d = tmp_path / f"{H}x{R}"
        job = Job(d, H, replicas=R, checkpoint_dir=f"{d}/ck-{{rank}}", **common)
        ts, errors = feed(job, batches)
        rc = job.wait()
        for t in ts:
            t.join(10)
        assert rc == 0, job.log()
        assert not errors, errors
        runs[(H, R)] = job

    many, one = runs[(hosts, replicas)], runs[(1, R1)]
    want = train_losses(one)
    assert len(want) == steps
    for h in range(hosts):
        got = train_losses(many, h)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        summ = many.summaries(h)
        assert all(s["host"] == h for s in summ), summ[-1]
        end = summ[-1]
        assert end["event"] == "end" and end["status"] == "ok" and end["global_step"] == steps
        train = [s for s in summ if s["event"] == "train"]
        assert sum(s["examples"] for s in train) == steps * batch  # the global batch's rows
    # the same bits on every host, and (summed in the same order) as on one host
    ref = last_params(one.tmp / "ck-0")
    for h in range(hosts):
        c = last_params(many.tmp / f"ck-{h}")
        assert c["global_step"] == steps
        assert np.array_equal(c["params"], ref["params"]), (h, c["params"], ref["params"])
        assert np.array_equal(c["slots"], ref["slots"])


def test_automatic_loop_lengths_agree_over_hosts(tmp_path, rng):
    """--iterations-per-loop auto or a duration on 2 hosts: each host measures its own loops, the
    hosts run the least length any proposes, so every summary step says the same length on both
    hosts; the losses are one host's, checkpoints fall on exact multiples, the run ends at its
    last step."""
    form = rng.choice(["auto", f"{rng.randint(1, 20)}ms"])
    features, classes, batch = rng.randint(1, 6), rng.randint(2, 4), 2 * rng.randint(1, 3)
    steps, every = rng.randint(20, 400), rng.randint(2, 40)
    print(f"{form}: {steps} steps, a checkpoint every {every}, batch {batch}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((batch, features)).astype(np.float32),
                nrng.integers(0, classes, batch, dtype=np.int32)) for _ in range(steps)]
    common = dict(program="softmax", features=features, classes=classes, batch_size=batch,
                  steps=steps, iterations_per_loop=form, summary_every=1, checkpoint_every=every,
                  keep_checkpoints=100000)
    runs = {}
    for H in (2, 1):
        d = tmp_path / f"h{H}"
        job = Job(d, H, checkpoint_dir=f"{d}/ck", **common)
        ts, errors = feed(job, batches)
        assert job.wait() == 0, job.log()
        for t in ts:
            t.join(10)
        assert not errors, errors
        runs[H] = job
    lengths = [{s["global_step"]: s["iterations_per_loop"] for s in runs[2].summaries(h)
                if s["event"] == "train"} for h in range(2)]
    assert sorted(lengths[0]) == list(range(1, steps + 1)), sorted(lengths[0])
    assert lengths[0] == lengths[1], "the hosts ran loops of other lengths"
    np.testing.assert_allclose(train_losses(runs[2], 1), train_losses(runs[1]), rtol=1e-5)
    for h in range(2):
        assert runs[2].summaries(h)[-1]["global_step"] == steps
    got = [int(p.stem[5:]) for p in ckpt.files(tmp_path / "h2" / "ck")]
    assert got == list(range(every, steps + 1, every)) + ([steps] if steps % every else []), got


def test_input_ending_on_one_host_ends_all_at_the_same_step(tmp_path, rng):
    ended_at = rng.randint(2, 12)
    batch = 4
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((batch, 3)).astype(np.float32),
                nrng.integers(0, 2, batch, dtype=np.int32)) for _ in range(200)]
    # loops of up to 60 steps: the other host's infeed thread is then blocked on a full ring
    # (16 shards deep) when the input ends, and must be released
    job = Job(tmp_path, 2, program="softmax", features=3, classes=2, batch_size=batch,
              steps=1000, iterations_per_loop=rng.choice([rng.randint(1, 6), rng.randint(20, 60)]),
              expect_producers=1)
    ts, errors = feed(job, batches, host_batches=[200, ended_at])
    rc = job.wait()
    for t in ts:
        t.join(10)
    assert rc == 0, job.log()
    for h in range(2):
        end = job.summaries(h)[-1]
        assert end["event"] == "end" and end["status"] == "ok", end
        assert end["reason"] == "input_ended", end
        assert end["global_step"] == ended_at, (h, end, job.log())


def wait_training(job: Job, timeout: float = 60) -> None:
    """Until every host answers status on its control socket with a step done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(control(f"ipc://{job.tmp}/ctl-{h}", {"cmd": "status"}, 1.0)["global_step"] > 0
                   for h in range(job.hosts)):
                return
        except TimeoutError:  # not answering yet (conftest.control_request)
            pass
        time.sleep(0.05)
    pytest.fail(f"the hosts did not start training within {timeout} s:\n{job.log()}")


def test_sigterm_to_one_rank_stops_all_at_one_loop_boundary(tmp_path, rng):
    ipl = rng.randint(2, 6)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((4, 3)).astype(np.float32),
                nrng.integers(0, 2, 4, dtype=np.int32)) for _ in range(100000)]
    job = Job(tmp_path, 2, program="softmax", features=3, classes=2, batch_size=4,
              steps=10 ** 9, iterations_per_loop=ipl)
    ts, errors = feed(job, batches)
    pids = job.rank_pids()
    target = rng.choice([0, 1])
    wait_training(job)  # (the handlers are in place once the control socket answers)
    os.kill(pids[target], signal.SIGTERM)
    rc = job.wait(30)
    assert rc == 0, job.log()
    ends = [job.summaries(h)[-1] for h in range(2)]
    for e in ends:
        assert e["event"] == "end" and e["reason"] == "stopped", e
        assert f"stop requested on host {target}" in e["message"], e
        assert e["global_step"] % ipl == 0, e
    assert ends[0]["global_step"] == ends[1]["global_step"] > 0, ends


@pytest.mark.parametrize("how", ["sigterm", "control"])
def test_stop_on_one_host_while_another_has_no_input(tmp_path, rng, how):
    """A stop sent to one host (SIGTERM, or the control socket's stop) while another host's
    producer is connected and sends nothing: that host's replica waits for a batch inside a
    loop, and the asking host's waits for it in the step's collective, so neither reaches the
    loop boundary where stops agree. The stop reaches every host all the same (the stop relay,
    docs/multihost.md); each closes its input after the daemon's grace, and every host ends at
    the same step, exit 0, its end summary naming the host that asked."""
    asker = rng.choice([0, 1])
    idle = 1 - asker
    given = rng.randint(0, 5)  # batches the idle host's producer sends before it goes quiet
    ipl = rng.randint(given + 1, given + 8)  # the stall is inside a loop, not at its boundary
    print(f"stop sent to host {asker} by {how}; host {idle} got {given} batches; ipl {ipl}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((4, 3)).astype(np.float32),
                nrng.integers(0, 2, 4, dtype=np.int32)) for _ in range(400)]
    job = Job(tmp_path, 2, program="softmax", features=3, classes=2, batch_size=4,
              steps=10 ** 9, iterations_per_loop=ipl, checkpoint_dir=f"{tmp_path}/ck")
    hold = threading.Event()
    n = [400, 400]
    n[idle] = given
    ts, errors = feed(job, batches, host_batches=n, hold=hold)
    pids = job.rank_pids()
    ctl = [f"ipc://{job.tmp}/ctl-{h}" for h in range(2)]
    # the event: both hosts have run the idle host's batches and its infeed waits for more
    deadline = time.monotonic() + 30
    st = None
    while time.monotonic() < deadline:
        try:
            st = [control(c, {"cmd": "status"}, 1.0) for c in ctl]
        except TimeoutError:  # not answering yet (conftest.control_request)
            st = None
        if st and st[idle]["infeed_waiting"] and all(s["global_step"] == given for s in st):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the hosts never stalled at step {given}: {st}\n{job.log()}")
    if how == "sigterm":
        os.kill(pids[asker], signal.SIGTERM)
    else:
        assert control(ctl[asker], {"cmd": "stop"}) == {"ok": True}
    try:
        rc = job.wait(30)
    finally:
        hold.set()
    for t in ts:
        t.join(10)
    assert rc == 0, job.log()
    for h in range(2):
        end = job.summaries(h)[-1]
        assert end["event"] == "end" and end["status"] == "ok", (h, end)
        assert end["reason"] == "stopped", (h, end)
        assert end["global_step"] == given, (h, end, job.log())
        assert f"stop requested on host {asker}" in end["message"], (h, end)
    # the asking host had taken batches for steps that never ran: no end checkpoint
    assert ckpt.files(tmp_path / "ck") == [], job.log()


def test_sigkill_of_one_rank_ends_the_job_naming_it(tmp_path, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((4, 3)).astype(np.float32),
                nrng.integers(0, 2, 4, dtype=np.int32)) for _ in range(100000)]
    job = Job(tmp_path, 2, program="softmax", features=3, classes=2, batch_size=4,
              steps=10 ** 9, iterations_per_loop=3)
    ts, errors = feed(job, batches, timeout=5)
    pids = job.rank_pids()
    victim = rng.choice([0, 1])
    wait_training(job)
    t0 = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    rc = job.wait(20)
    took = time.monotonic() - t0
    log = job.log()
    assert rc != 0, log
    assert took < 10, f"{took:.1f} s\n{log}"
    assert f"rank {victim}" in log, log
    assert "signal 9 (Killed)" in log, log  # mpirun names the cause (docs/multihost.md)
    other = Path(f"/proc/{pids[1 - victim]}/stat")

    def other_alive():
        try:
            return other.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    while other_alive() and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert not other_alive(), f"rank {1 - victim} still runs 10 s after rank {victim} was killed"


def test_global_batch_not_divisible_by_hosts_x_replicas(tmp_path):
    job = Job(tmp_path, 2, program="softmax", features=3, classes=2, batch_size=6, replicas=2,
              steps=5)
    rc = job.wait(30)
    assert rc != 0
    assert "--batch-size: 6 is not divisible by 2 hosts x 2 replicas" in job.log(), job.log()


SHARED = [  # settings every host must share, in the order the sentence names them, and values
    # other than the run's below
    ("program_config", "--program-config", '{"layers": 1, "heads": 1, "width": 4, "block": 4, '
     '"vocab": 11}'), ("steps", "--steps", 6), ("optimizer", "--optimizer", "sgd"),
    ("learning_rate", "--learning-rate", 0.25), ("summary_every", "--summary-every", 7),
    ("seed", "--seed", 99), ("checkpoint_every", "--checkpoint-every", 3)]


@pytest.mark.parametrize("hosts", [2, 3])
def test_hosts_that_differ_in_a_shared_setting_are_refused(tmp_path, rng, hosts):
    """One rank given other values of one or two settings every host must share (they decide the
    math or the collectives): every rank exits 2 before any socket opens, naming the flags and
    its own values; the same program_config in other spacing and key order is the same."""
    base = {"program": "charlm", "program_config": '{"vocab": 9, "block": 4, "width": 4, '
            '"heads": 1, "layers": 1}', "batch_size": 2 * hosts, "steps": 5,
            "learning_rate": 0.5, "seed": 1, "summary_every": 1, "optimizer": "adamw",
            "checkpoint_every": 0}
    odd = rng.randrange(hosts)
    picked = rng.sample(SHARED, rng.randint(1, 2))
    print(f"rank {odd} of {hosts} differs in {[p[0] for p in picked]}")
    job = Job(tmp_path, hosts, rank_flags={odd: {k: v for k, _, v in picked}}, **base)
    assert job.wait(60) == 2, job.log()
    log = job.log()
    for r in range(hosts):
        theirs = {k: (v if r == odd else base[k]) for k, _, v in picked}
        named = sorted(picked, key=SHARED.index)
        mine = ", ".join(f"{flag} {shown(k, theirs[k])}" for k, flag, _ in named)
        names = ", ".join(flag for _, flag, _ in named)
        sentence = (f"the hosts differ in {names}: every host of a run must give the same "
                    f"(docs/multihost.md); host {r} of {hosts} has {mine}. No host starts")
        assert sentence in log, (sentence, log)
    assert "waiting for producers" not in log and "MPI_ABORT" not in log, log

    # the same settings, program_config in another order and spacing: the run starts and ends
    same = Job(tmp_path / "same", hosts, rank_flags={odd: {"program_config": json.dumps(
        json.loads(base["program_config"]), indent=1, sort_keys=True)}}, **{**base, "steps": 2})
    wait_log_text(same, "waiting for producers", hosts)
    same.kill()


def shown(key: str, value) -> str:
    """A setting's value as infeedd's sentence shows it (program_config parsed, keys sorted)."""
    if key == "program_config":
        return json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))
    return str(value)


def wait_log_text(job: Job, text: str, times: int = 1, timeout: float = 30) -> None:
    """Until the job's log holds text that many times (each rank logs its own)."""
    deadline = time.monotonic() + timeout
    while job.log().count(text) < times:
        assert job.proc.poll() is None, job.log()
        assert time.monotonic() < deadline, f"no '{text}' within {timeout} s: {job.log()}"
        time.sleep(0.05)


def stream_hosts(job: Job, batches, n: int, resume_seqs: dict, timeout: float = 30,
                 hold: threading.Event | None = None):
    """feed() of global batches 0..n-1 on every host, recording WELCOME's next_seq."""
    return feed(job, batches, [n] * job.hosts, timeout, resume_seqs, hold)


def losses_by_step(job: Job, h: int = 0) -> dict[int, float]:
    return {s["global_step"]: s["loss"] for s in job.summaries(h) if s["event"] == "train"}


def test_one_checkpoint_for_every_host_and_resume_on_two(tmp_path, rng):
    """A 2-host run writes one checkpoint folder (no {rank}) holding both hosts' producer
    positions; killed, it resumes on 2 hosts, each host's producer replaying from its own
    next_seq, with the per-step losses and final parameters of an uninterrupted run."""
    H, R = 2, rng.randint(1, 2)
    features, classes = rng.randint(1, 6), rng.randint(2, 4)
    batch = H * R * rng.randint(1, 3)
    ipl = rng.randint(1, 4)
    every = ipl * rng.randint(1, 3)
    last = rng.randint(3 * every + 2, 3 * every + 20)
    killed_after = rng.randint(every, last - 1)  # batches the interrupted run gets
    ckpt_at = killed_after // every * every
    opt = rng.choice(["sgd", "momentum", "adam"])
    print(f"R {R} batch {batch} ipl {ipl} every {every} last {last} killed after "
          f"{killed_after} (checkpoint at {ckpt_at}) D {features} K {classes} {opt}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((batch, features)).astype(np.float32),
                nrng.integers(0, classes, batch, dtype=np.int32)) for _ in range(last)]
    common = dict(program="softmax", features=features, classes=classes, batch_size=batch,
                  replicas=R, last_step=last, iterations_per_loop=ipl, summary_every=1,
                  optimizer=opt, learning_rate=0.1, checkpoint_every=every)

    ref = Job(tmp_path / "ref", H, checkpoint_dir=f"{tmp_path}/ref-ck", **common)
    seqs: dict = {}
    ts, errors = stream_hosts(ref, batches, last, seqs)
    assert ref.wait() == 0, ref.log()
    for t in ts:
        t.join(10)
    assert not errors, errors
    want = losses_by_step(ref)
    assert sorted(want) == list(range(1, last + 1))
    final = last_params(tmp_path / "ref-ck")
    assert final["global_step"] == last and final["hosts"] == H, final
    assert final["host_producers"] == [{f"loader-{h}": last - 1} for h in range(H)], final
    assert final["producers"] == {}
    assert not (tmp_path / "ref-ck-1").exists()

    folder = tmp_path / "ck"
    d1 = Job(tmp_path / "run1", H, checkpoint_dir=str(folder), **common)
    seqs1: dict = {}
    hold = threading.Event()
    ts, errors = stream_hosts(d1, batches, killed_after, seqs1, hold=hold)
    deadline = time.monotonic() + 60
    want_file = folder / f"ckpt-{ckpt_at:012d}.ifdckpt"
    while (len(losses_by_step(d1)) < killed_after or not want_file.exists()) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert want_file.exists() and len(losses_by_step(d1)) == killed_after, d1.log()
    d1.kill()
    hold.set()
    for t in ts:
        t.join(10)
    c = ckpt.read(ckpt.files(folder)[-1])
    assert c["global_step"] == ckpt_at and c["hosts"] == H, c
    assert c["host_producers"] == [{f"loader-{h}": ckpt_at - 1} for h in range(H)], c

    d2 = Job(tmp_path / "run2", H, checkpoint_dir=str(folder), resume=True, **common)
    seqs2: dict = {}
    ts, errors = stream_hosts(d2, batches, last, seqs2)
    assert d2.wait() == 0, d2.log()
    for t in ts:
        t.join(10)
    assert not errors, errors
    assert seqs2 == {h: ckpt_at for h in range(H)}, (seqs2, d2.log())
    for h in range(H):
        got = losses_by_step(d2, h)
        assert sorted(got) == list(range(ckpt_at + 1, last + 1)), (h, sorted(got))
        np.testing.assert_allclose([got[k] for k in sorted(got)],
                                   [want[k] for k in sorted(got)], rtol=1e-5)
        end = d2.summaries(h)[-1]
        assert end["event"] == "end" and end["status"] == "ok" and end["global_step"] == last
    got = last_params(folder)
    assert got["global_step"] == last
    assert got["host_producers"] == final["host_producers"]
    np.testing.assert_array_equal(got["params"], final["params"])
    np.testing.assert_array_equal(got["slots"], final["slots"])


@pytest.mark.parametrize("hosts", [1, 3])
def test_resume_on_another_number_of_hosts_is_refused(tmp_path, rng, hosts):
    """A checkpoint with 2 hosts' positions (written as the daemon does, tests/e2e/ckpt.py)
    does not resume on 1 or 3: one sentence naming both numbers, exit status 2, every rank."""
    features, classes = rng.randint(1, 6), rng.randint(2, 4)
    step = rng.randint(1, 500)
    folder = tmp_path / "ck"
    write_softmax_checkpoint(folder, features, classes, step, np.zeros(features * classes + classes),
                             hosts=2)
    print(f"checkpoint at step {step}, D {features} K {classes}, resumed on {hosts}")
    job = Job(tmp_path / "run", hosts, program="softmax", features=features, classes=classes,
              batch_size=6, steps=5, checkpoint_dir=str(folder), resume=True)
    rc = job.wait(30)
    log = job.log()
    assert rc == 2, log
    sentence = (f"holds the producer positions of 2 hosts, this run has {hosts}: resume it on 2 "
                f"hosts")
    assert log.count(sentence) == hosts, log
    assert "Traceback" not in log and "MPI_ABORT" not in log, log
