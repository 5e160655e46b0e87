"""Several hosts (docs/multihost.md): infeedd under mpirun on this machine, ipc endpoints only.

2 hosts x 1 replica and 2 x 2 against 1 x 2 and 1 x 4 on the same global batches (each host's
producer sends its rows of every global batch): the same per-step losses and parameters, the
same bits on every host; the input ending on one host ends all at the same step; SIGTERM to one
rank stops all at the same loop boundary; SIGKILL of one rank ends the job, naming it. Skipped
when mpirun is missing or infeedd was built without MPI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ckpt
import infeed
from conftest import infeedd_path

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")


def _mpi_skip_reason():
    exe = infeedd_path()
    if exe is None:
        return "infeedd is not built (set INFEEDD)"
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    r = subprocess.run(["mpirun", "-np", "2", exe, "--version"], capture_output=True, text=True,
                       timeout=60, env=MPI_ENV)
    if r.returncode != 0:
        return f"infeedd cannot run under mpirun here: {(r.stderr or r.stdout)[-300:]}"
    return None


_REASON = _mpi_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


class Job:
    """infeedd on H hosts (H = 1: a plain infeedd), ipc endpoints under tmp."""

    def __init__(self, tmp: Path, hosts: int, **flags):
        self.tmp, self.hosts = tmp, hosts
        tmp.mkdir(parents=True, exist_ok=True)
        f = {"listen": f"ipc://{tmp}/in-{{rank}}", "control": f"ipc://{tmp}/ctl-{{rank}}",
             "publish": "", "summaries": f"{tmp}/summaries-{{rank}}.jsonl",
             "log_level": "info"}
        f.update(flags)
        argv = [infeedd_path()]
        for k, v in f.items():
            if v is None or v is False:
                continue
            argv.append("--" + k.replace("_", "-"))
            if v is not True:
                argv.append(str(v))
        if hosts > 1:
            argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(hosts)] + argv
        else:
            argv = [a.replace("{rank}", "0") for a in argv]
        self.log_path = tmp / "job.log"
        self._log = open(self.log_path, "wb")
        print("starting:", " ".join(argv))
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=MPI_ENV, start_new_session=True)

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


def feed(job: Job, batches, host_batches=None, timeout: float = 30):
    """One producer a host, sending its rows of every global batch until the run ends (or its
    host_batches[h] batches), then END. Returns the producers' errors."""
    H = job.hosts
    errors = []

    def run(h):
        try:
            p = infeed.Producer(job.listen(h), name=f"loader-{h}", timeout=timeout)
            n = len(batches) if host_batches is None else host_batches[h]
            try:
                for i in range(n):
                    x, y = batches[i]
                    rows = len(y) // H
                    p.send({"x": x[h * rows:(h + 1) * rows], "y": y[h * rows:(h + 1) * rows]})
            except infeed.RunEnded:
                pass
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


def test_input_ending_on_one_host_ends_all_at_the_same_step(tmp_path, rng):
    ended_at = rng.randint(2, 12)
    batch = 4
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((batch, 3)).astype(np.float32),
                nrng.integers(0, 2, batch, dtype=np.int32)) for _ in range(200)]
    job = Job(tmp_path, 2, program="softmax", features=3, classes=2, batch_size=batch,
              steps=1000, iterations_per_loop=rng.randint(1, 6), expect_producers=1)
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
    time.sleep(1.0)
    os.kill(pids[target], signal.SIGTERM)
    rc = job.wait(30)
    assert rc == 0, job.log()
    ends = [job.summaries(h)[-1] for h in range(2)]
    for e in ends:
        assert e["event"] == "end" and e["reason"] == "stopped", e
        assert f"stop requested on host {target}" in e["message"], e
        assert e["global_step"] % ipl == 0, e
    assert ends[0]["global_step"] == ends[1]["global_step"] > 0, ends


def test_sigkill_of_one_rank_ends_the_job_naming_it(tmp_path, rng):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    batches = [(nrng.standard_normal((4, 3)).astype(np.float32),
                nrng.integers(0, 2, 4, dtype=np.int32)) for _ in range(100000)]
    job = Job(tmp_path, 2, program="softmax", features=3, classes=2, batch_size=4,
              steps=10 ** 9, iterations_per_loop=3)
    ts, errors = feed(job, batches, timeout=5)
    pids = job.rank_pids()
    victim = rng.choice([0, 1])
    time.sleep(1.0)
    t0 = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    rc = job.wait(20)
    took = time.monotonic() - t0
    log = job.log()
    assert rc != 0, log
    assert took < 10, f"{took:.1f} s\n{log}"
    assert f"rank {victim}" in log, log
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


def test_resume_on_several_hosts_needs_rank_in_the_checkpoint_dir(tmp_path):
    job = Job(tmp_path, 2, program="softmax", features=3, classes=2, batch_size=4, steps=5,
              checkpoint_dir=f"{tmp_path}/ck", resume=True)
    rc = job.wait(30)
    assert rc != 0
    assert "--checkpoint-dir must contain {rank}" in job.log(), job.log()
