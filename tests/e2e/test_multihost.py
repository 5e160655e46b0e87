"""Several hosts (docs/multihost.md): infeedd under mpirun on this machine, ipc endpoints only.

2 hosts x 1 replica and 2 x 2 against 1 x 2 and 1 x 4 on the same global batches (each host's
producer sends its rows of every global batch): the same per-step losses and parameters, the
same bits on every host; the input ending on one host ends all at the same step; SIGTERM to one
rank stops all at the same loop boundary, and a stop sent to one host while another's loop waits
for input ends every host at the same step; SIGKILL of one rank ends the job, naming it; one
checkpoint holds both hosts' producer positions, a killed 2-host run resumes from it on 2 hosts
with the losses of an uninterrupted one, and resuming on 1 or 3 hosts is refused; eval and
predict over 2 hosts equal 1 host, and eval's input ending on one host ends all at the same
step. Skipped when mpirun is missing or infeedd was built without MPI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ckpt
import infeed
from conftest import control_request as control
from conftest import infeedd_path
from helpers import MPI_ENV, mpi_skip_reason


_REASON = mpi_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


class Job:
    """infeedd on H hosts (H = 1: a plain infeedd), ipc endpoints under tmp."""

    def __init__(self, tmp: Path, hosts: int, gpu_per_rank: bool = False,
                 rank_flags: dict | None = None, **flags):
        """rank_flags: {rank: {flag: value}}, flags that rank alone gets on top of flags (an
        MPMD mpirun line, one program a rank)."""
        self.tmp, self.hosts = tmp, hosts
        tmp.mkdir(parents=True, exist_ok=True)
        f = {"listen": f"ipc://{tmp}/in-{{rank}}", "control": f"ipc://{tmp}/ctl-{{rank}}",
             "publish": "", "summaries": f"{tmp}/summaries-{{rank}}.jsonl",
             "log_level": "info"}
        f.update(flags)
        argv = self._argv(f, gpu_per_rank)
        if hosts > 1 and rank_flags:
            ranks = [["-np", "1"] + self._argv({**f, **rank_flags.get(r, {})}, gpu_per_rank)
                     for r in range(hosts)]
            argv = ["mpirun", "--allow-run-as-root", "--oversubscribe"] + [
                a for r, one in enumerate(ranks) for a in ([":"] if r else []) + one]
        elif hosts > 1:
            argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(hosts)] + argv
        else:
            argv = [a.replace("{rank}", "0") for a in argv]
        self.log_path = tmp / "job.log"
        self._log = open(self.log_path, "wb")
        print("starting:", " ".join(argv))
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=MPI_ENV, start_new_session=True)

    @staticmethod
    def _argv(f: dict, gpu_per_rank: bool) -> list:
        argv = [infeedd_path()]
        for k, v in f.items():
            if v is None or v is False:
                continue
            for one in v if isinstance(v, list) else [v]:  # a list: the flag repeated
                argv.append("--" + k.replace("_", "-"))
                if one is not True:
                    argv.append(str(one))
        if gpu_per_rank:  # each rank sees its own GPU: the one of its local rank
            argv = ["sh", "-c", 'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec "$0" "$@"'
                    ] + argv
        return argv

    def listen(self, h: int) -> str:
        return f"ipc://{self.tmp}/in-{h}"

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-8000:]

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job still runs after {timeout} s:\n{self.log()}")

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def summaries(self, h: int) -> list[dict]:
        p = self.tmp / f"summaries-{h}.jsonl"
        if not p.exists():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

    def rank_pids(self) -> dict[int, int]:
        """The infeedd process of each rank (mpirun's children on this machine)."""
        out = {}
        deadline = time.monotonic() + 15
        while len(out) < self.hosts and time.monotonic() < deadline:
            for pid in Path("/proc").iterdir():
                if not pid.name.isdigit():
                    continue
                try:
                    env = (pid / "environ").read_bytes().split(b"\0")
                    stat = (pid / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) != self.proc.pid:
                    continue
                for e in env:
                    if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                        out[int(e.split(b"=")[1])] = int(pid.name)
            time.sleep(0.1)
        assert len(out) == self.hosts, f"ranks found: {out}\n{self.log()}"
        return out


def feed(job: Job, batches, host_batches=None, timeout: float = 30, resume_seqs=None,
         hold: threading.Event | None = None):
    """One producer a host, sending its rows of every global batch (or of the first
    host_batches[h]) from where the daemon wants them (WELCOME's next_seq, recorded in
    resume_seqs[h] when given) until the run ends, then END (with hold: no END; the producer
    stays connected until hold is set). Returns the threads and the producers' errors."""
    H = job.hosts
    errors = []

    def run(h):
        try:
            p = infeed.Producer(job.listen(h), name=f"loader-{h}", timeout=timeout)
            n = len(batches) if host_batches is None else host_batches[h]

            def rows(i):
                x, y = batches[i]
                r = len(y) // H
                return {"x": x[h * r:(h + 1) * r], "y": y[h * r:(h + 1) * r]}

            try:
                for b in p.skip_consumed(rows(i) for i in range(n)):
                    p.send(b)
            except infeed.RunEnded:
                pass
            if resume_seqs is not None:
                resume_seqs[h] = p.resume_seq
            if hold is not None:
                hold.wait(60)
            else:
                p.end()
            p.close()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(f"host {h}: {e!r}")

    ts = [threading.Thread(target=run, args=(h,), daemon=True) for h in range(H)]
    for t in ts:
        t.start()
    return ts, errors


def train_losses(job: Job, h: int = 0) -> list[float]:
    return [s["loss"] for s in job.summaries(h) if s["event"] == "train"]


def last_params(folder: Path):
    files = ckpt.files(folder)
    assert files, f"no checkpoint in {folder}"
    return ckpt.read(files[-1])


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


def write_softmax_checkpoint(folder: Path, features: int, classes: int, step: int, params,
                             hosts: int = 1) -> None:
    """A softmax checkpoint with these parameters (sgd), as the daemon writes one
    (tests/e2e/ckpt.py); with hosts > 1, each host's table has its producer 'loader-H'."""
    folder.mkdir(parents=True, exist_ok=True)
    n = features * classes + classes
    header = {"format": "infeed-checkpoint", "program": "softmax",
              "settings": {"features": features, "classes": classes, "hidden": 0},
              "params": [{"name": "W", "shape": [features, classes], "offset": 0,
                          "count": features * classes},
                         {"name": "b", "shape": [classes], "offset": features * classes,
                          "count": classes}],
              "nparam_floats": n,
              "optimizer": {"kind": "sgd", "slots": 0, "learning_rate": 0.1, "momentum": 0.9,
                            "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
              "global_step": step, "opt_step": step, "producers": {}}
    if hosts > 1:
        header["hosts"] = hosts
        header["host_producers"] = [{f"loader-{h}": step - 1} for h in range(hosts)]
    ckpt.write(folder / f"ckpt-{step:012d}.ifdckpt", header, np.asarray(params, np.float32))


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


def eval_summary(job: Job, h: int) -> dict:
    ev = [s for s in job.summaries(h) if s["event"] == "eval"]
    assert len(ev) == 1, (h, job.summaries(h), job.log())
    return ev[0]


def same_values(got, want, where="host_calls"):
    """Integers (counts) bit for bit, floats within 1e-6 relative, recursively."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (where, got, want)
        for k in want:
            same_values(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            same_values(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12), (where, got, want)
    else:
        assert got == want, (where, got, want)


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
