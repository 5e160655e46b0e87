"""infeedd on several hosts under mpirun, for the e2e tests (docs/multihost.md): Job starts
the job on ipc endpoints under a tmp folder, feed streams each host's rows of the global batches,
and the readers of losses, parameters and checkpoints the multi-host tests compare."""

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
from conftest import infeedd_path
from helpers import MPI_ENV


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
