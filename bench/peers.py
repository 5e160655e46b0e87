#!/usr/bin/env python3
"""bench/peers.py: infeedd against Keras 3 on the same jobs, side by side in one run.

Three jobs (plain SGD, learning rate 0.01, the same in-memory numpy data for every peer):

    softmax32    softmax regression, 64 features, 10 classes, batch 32
    mlp32        MLP 784-128-10 (relu), batch 32
    mlp1024      MLP 784-128-10 (relu), batch 1024

each trained for the same number of steps

  - by infeedd (--iterations-per-loop 100, R = 1 and 2 replicas), fed by the Python producer
    (clients/python) over each transport it has: tcp (loopback) and ipc (a Unix socket), both
    with ``shm=False``, and shm (shared memory over ipc, ``shm=True``; "n/a" with a client
    that has no ``shm``), sending one step a message
    and k steps a message (--steps-per-message; "k1", "k100"); examples/s is the rows the
    daemon trained on over the wall time from the first batch sent to the end of the run (the
    daemon's BYE, which it sends after the last step; its exit, about 50 ms later, is not
    counted, as Keras's process exit is not), and
    "wait" is the fraction of the replicas' step time spent waiting for input (the run's train
    summary's infeed_wait_fraction);
  - by Keras 3 `model.fit(..., steps_per_execution=100)` on the JAX and TensorFlow backends
    (examples/s of a timed epoch after a warm-up epoch). Keras, JAX and tensorflow-cpu are
    installed with pip into a virtual environment of their own (bench/.venv-peers, ignored by
    git; --venv DIR to choose another), the first time only. Not part of CI.

It prints a table, each infeedd row's ratio to Keras/JAX and Keras/TensorFlow and the BLAS
kernel the daemon ran (its log's "cpu backend: BLAS" line), the issue 18 targets (softmax32 >= 5x
Keras/JAX, mlp32 >= 1.5x, mlp1024 >= 1.1x) met or not, and for the MLP jobs the matrix-product
rate each peer achieved (2 (2 D H + 3 H K) floating-point operations an example) as a fraction of
the machine's: bench_blas's single-thread sgemm rate of the daemon's kernel on a 1024x784x128
product, times the CPUs this process may use. Run from the repository root with a Release
build:

    cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DIFD_CUDA=OFF
    cmake --build build-rel -j --target infeedd bench_blas
    python3 bench/peers.py [--infeedd build-rel/host/infeedd] [--steps N] [--jobs mlp32,...]
                           [--replicas 1,2] [--transports tcp,ipc,shm] [--no-keras] [--json F]
                           [--daemon-flag=--host-call=none ...]

Two more jobs (issue 22; not in the default --jobs; `--jobs charlm` names both) train the
built-in GPT-style decoder charlm, 2 layers, 4 heads, width 128, vocabulary 256, on random
windows of examples/charlm/corpus.py (the project's own docs and sources, bytes):

    charlm8      batch 8, block 64
    charlm32     batch 32, block 128

with AdamW (no weight decay on biases and norms), clipping by the global norm and a linear
warmup then a cosine decay (CHARLM_OPTIMIZER), by infeedd (`--program charlm --program-config`,
fed by infeed.feed over ipc, shared memory when the daemon offers it, R of --replicas) and by
bench/keras_charlm.py, the same model in Keras 3 (`model.fit`, steps_per_execution), on the JAX
and TensorFlow backends. They print tokens/s side by side, each infeedd row's ratio to both,
and the achieved FLOP/s, counted as 6 N + 12 L T C a token (N: the matrices' parameters, L T C
the attention's products; the embeddings' lookups and the element-wise work are not counted),
as a fraction of the machine's sgemm rate measured beside that run: bench_blas (--threads N)
runs the 1024x784x128 product on N threads at once, N the CPUs this process may use (the
daemon's threads: R replicas times their teams), just before and just after each peer's run, and
the fraction is the run's FLOP/s over the higher of those two (both printed; on a shared VM the
rate moves by half within minutes, so a rate measured at another moment says little, and a
measurement of about a second can land in a slow moment the run's seconds average out: the
higher one errs toward a lower fraction). `--rounds N`
runs every peer in turn N times and keeps each one's fastest round (the machine's load drifts
over a run). Targets: charlm8 >= 1.5x Keras/JAX; charlm32 >= 1.2x Keras/JAX and >= 60 % of the
sgemm rate beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "clients" / "python"))
sys.path.insert(0, str(ROOT / "examples" / "charlm"))  # corpus.py, for the charlm jobs
import infeed  # noqa: E402

JOBS = {
    "softmax32": dict(program="softmax", features=64, classes=10, hidden=None, batch=32,
                      steps=60000),
    "mlp32": dict(program="mlp", features=784, classes=10, hidden=128, batch=32, steps=6000),
    "mlp1024": dict(program="mlp", features=784, classes=10, hidden=128, batch=1024, steps=400),
}
CHARLM = dict(program="charlm", layers=2, heads=4, width=128, vocab=256)
JOBS["charlm8"] = dict(CHARLM, batch=8, block=64, steps=400, ipl=100)
JOBS["charlm32"] = dict(CHARLM, batch=32, block=128, steps=100, ipl=50)
DEFAULT_JOBS = ("softmax32", "mlp32", "mlp1024")
JOB_GROUPS = {"charlm": ("charlm8", "charlm32")}  # --jobs charlm
TARGETS = {"softmax32": 5.0, "mlp32": 1.5, "mlp1024": 1.1,  # x Keras/JAX (issue 18)
           "charlm8": 1.5, "charlm32": 1.2}  # (issue 22)
SGEMM_TARGETS = {"charlm32": 0.60}  # achieved fraction of the measured sgemm rate (issue 22)
# the charlm jobs' optimizer, for infeedd and Keras alike (decay_steps: the run's steps, at least
# warmup_steps + 1, counting the warmup as infeedd does; bench/keras_charlm.py converts for
# Keras's CosineDecay)
CHARLM_OPTIMIZER = dict(learning_rate=1e-3, beta1=0.9, beta2=0.95, epsilon=1e-8,
                        weight_decay=0.1, clip_norm=1.0, warmup_steps=20,
                        min_learning_rate=1e-4)
# infeedd's flags for the charlm jobs, every name in one place
CHARLM_FLAGS = {"program_config": "--program-config", "optimizer": ("--optimizer", "adamw"),
                "lr_schedule": ("--lr-schedule", "cosine"), "learning_rate": "--learning-rate",
                "beta1": "--beta1", "beta2": "--beta2", "epsilon": "--epsilon",
                "weight_decay": "--weight-decay", "clip_norm": "--clip-norm",
                "warmup_steps": "--warmup-steps", "decay_steps": "--decay-steps",
                "min_learning_rate": "--min-learning-rate"}
LR = 0.01
MSG_BYTES = 8 << 20  # the most bytes one infeedd message carries here
IPL = 100

KERAS_SCRIPT = r'''
import json, os, sys, time
import numpy as np
import keras
job = json.loads(sys.argv[1])
rng = np.random.default_rng(1)
x = rng.standard_normal((job["rows"], job["features"]), dtype=np.float32)
y = rng.integers(0, job["classes"], job["rows"]).astype(np.int32)
layers = [keras.Input((job["features"],))]
if job["hidden"]:
    layers.append(keras.layers.Dense(job["hidden"], activation="relu"))
layers.append(keras.layers.Dense(job["classes"]))
model = keras.Sequential(layers)
model.compile(optimizer=keras.optimizers.SGD(job["lr"]),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              steps_per_execution=job["ipl"], jit_compile=True)
per_epoch = job["rows"] // job["batch"]
model.fit(x, y, batch_size=job["batch"], epochs=1, shuffle=False, verbose=0)  # warm-up, compile
epochs = max(1, job["steps"] // per_epoch)
t0 = time.perf_counter()
model.fit(x, y, batch_size=job["batch"], epochs=epochs, shuffle=False, verbose=0)
dt = time.perf_counter() - t0
print(json.dumps({"examples_per_sec": epochs * per_epoch * job["batch"] / dt,
                  "backend": keras.backend.backend(), "keras": keras.__version__}))
'''


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def dataset(job: dict, rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, job["features"]), dtype=np.float32)
    y = rng.integers(0, job["classes"], rows).astype(np.int32)
    return x, y


def transports_of_client() -> set[str]:
    """The transports the Python client offers: tcp and ipc always; shm when Producer takes it."""
    have = {"tcp", "ipc"}
    if "shm" in infeed.Producer.__init__.__code__.co_varnames:
        have.add("shm")
    return have


DAEMON_FLAGS: list = []  # --daemon-flag


def run_infeedd(exe: str, job: dict, replicas: int, transport: str, steps: int, x, y,
                tmp: Path, per_msg: int = 1) -> dict:
    b = job["batch"]
    if transport == "tcp":
        listen = f"tcp://127.0.0.1:{free_port()}"
    else:
        listen = f"ipc://{tmp}/in-{replicas}-{transport}"
    summaries = tmp / f"s-{job['program']}-{b}-{replicas}-{transport}.jsonl"
    argv = [exe, "--listen", listen, "--publish", "", "--control", "", "--summaries",
            str(summaries), "--program", job["program"], "--features", str(job["features"]),
            "--classes", str(job["classes"]), "--batch-size", str(b), "--replicas", str(replicas),
            "--steps", str(steps), "--iterations-per-loop", str(IPL), "--summary-every", "0",
            "--optimizer", "sgd", "--learning-rate", str(LR), "--log-level", "info",
            "--max-steps-per-message", str(per_msg)]
    if job["hidden"]:
        argv += ["--hidden", str(job["hidden"])]
    argv += DAEMON_FLAGS
    log_path = tmp / f"daemon-{job['program']}-{b}-{replicas}-{transport}-{per_msg}.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    # (a client with shm asks for a pool on a local endpoint by itself: the socket rows say no)
    kw = {"shm": transport == "shm"} if "shm" in transports_of_client() else {}
    nb = len(x) // b // per_msg  # messages of per_msg steps in the data
    rows = per_msg * b
    try:
        time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"infeedd exited {proc.returncode} at start: "
                               f"{log_path.read_text()[-2000:]}")
        p = infeed.Producer(listen, name="bench", timeout=60, **kw)
        sent = 0
        t0 = time.perf_counter()
        try:
            while True:
                i = sent % nb
                p.send(x=x[i * rows:(i + 1) * rows], y=y[i * rows:(i + 1) * rows])
                sent += 1
        except infeed.RunEnded:
            pass
        dt = time.perf_counter() - t0  # the run's end: the daemon's BYE has arrived
        rc = proc.wait(timeout=600)
        p.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0:
        raise RuntimeError(f"infeedd exited {rc}: {log_path.read_text()[-2000:]}")
    lines = [json.loads(line) for line in open(summaries)]
    train = [s for s in lines if s.get("event") == "train"]  # --summary-every 0: the run's one
    wait = train[-1].get("infeed_wait_fraction") if train else None
    return {"examples_per_sec": steps * b / dt, "wait": wait, "blas": blas_of(log_path)}


def charlm_config(job: dict) -> dict:
    """--program-config of a charlm job."""
    return {k: job[k] for k in ("layers", "heads", "width", "block", "vocab")}


def charlm_argv(exe: str, job: dict, replicas: int, steps: int, listen: str, summaries: Path,
                per_msg: int) -> list:
    """infeedd's command line for a charlm job (the optimizer's flags from CHARLM_FLAGS)."""
    argv = [exe, "--listen", listen, "--publish", "", "--control", "", "--summaries",
            str(summaries), "--program", "charlm", CHARLM_FLAGS["program_config"],
            json.dumps(charlm_config(job), separators=(",", ":")), "--batch-size",
            str(job["batch"]), "--replicas", str(replicas), "--steps", str(steps),
            "--iterations-per-loop", str(job["ipl"]), "--summary-every", "0", "--log-level",
            "info", "--max-steps-per-message", str(per_msg)]
    argv += list(CHARLM_FLAGS["optimizer"]) + list(CHARLM_FLAGS["lr_schedule"])
    for key, value in dict(CHARLM_OPTIMIZER, decay_steps=charlm_decay_steps(steps)).items():
        argv += [CHARLM_FLAGS[key], str(value)]
    return argv + DAEMON_FLAGS


def charlm_decay_steps(steps: int) -> int:
    """The cosine's end, warmup included: the run's last step, after the warmup at least."""
    return max(steps, CHARLM_OPTIMIZER["warmup_steps"] + 1)


def charlm_steps_per_message(job: dict) -> int:
    """Steps a message carries: a loop's, at most MSG_BYTES (tokens and targets, int32)."""
    return max(1, min(job["ipl"], MSG_BYTES // (job["batch"] * job["block"] * 2 * 4)))


def run_infeedd_charlm(exe: str, job: dict, replicas: int, steps: int, tmp: Path) -> dict:
    """A charlm run fed by infeed.feed with random windows of the corpus; tokens/s over the
    wall time from the feed's start to the daemon's BYE."""
    import corpus  # examples/charlm

    listen = f"ipc://{tmp}/charlm-{job['batch']}-{replicas}"
    summaries = tmp / f"s-charlm-{job['batch']}-{replicas}.jsonl"
    log_path = tmp / f"daemon-charlm-{job['batch']}-{replicas}.log"
    argv = charlm_argv(exe, job, replicas, steps, listen, summaries, charlm_steps_per_message(job))
    data = corpus.windows(corpus.load(), job["block"], job["batch"] * job["ipl"], seed=1)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.perf_counter()
        try:
            res = infeed.feed(listen, data, name="bench", timeout=120)
        except (infeed.InfeedError, TimeoutError) as e:
            if proc.poll() is None:
                raise
            raise RuntimeError(f"infeedd (charlm) exited {proc.returncode}: "
                               f"{log_path.read_text()[-2000:]}") from e
        dt = time.perf_counter() - t0  # the BYE has arrived: the run's last step is done
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0 or not res.ended:
        raise RuntimeError(f"infeedd (charlm) exited {rc}: {log_path.read_text()[-2000:]}")
    train = [s for s in (json.loads(line) for line in open(summaries))
             if s.get("event") == "train"]
    last = train[-1] if train else {}
    return {"tokens_per_sec": steps * job["batch"] * job["block"] / dt,
            "wait": last.get("infeed_wait_fraction"), "loss": last.get("loss"),
            "blas": blas_of(log_path), "transport": res.transport}


def run_keras_charlm(py: Path, backend: str, job: dict, steps: int) -> dict:
    """bench/keras_charlm.py on one backend: tokens/s of a timed fit after a warm-up fit."""
    spec = dict(job, **CHARLM_OPTIMIZER, steps=steps, decay_steps=charlm_decay_steps(steps))
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    out = subprocess.run([str(py), str(ROOT / "bench" / "keras_charlm.py"), json.dumps(spec)],
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"keras/{backend} (charlm): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def flops_per_token(job: dict) -> float:
    """charlm's forward and backward floating-point operations a token: 6 N + 12 L T C, N the
    parameters of its matrices (L 12 C^2 + C V: qkv, proj, fc, out and the head), 12 L T C the
    attention's score and value products (forward and backward, the causal half not taken
    off)."""
    L, C, T, V = job["layers"], job["width"], job["block"], job["vocab"]
    return 6.0 * (L * 12 * C * C + C * V) + 12.0 * L * T * C


def blas_of(log_path: Path) -> str:
    """The daemon's BLAS line ("OpenBLAS 0.3.21, kernel SkylakeX (...)"), from its log."""
    for line in log_path.read_text(errors="replace").splitlines():
        if "cpu backend: BLAS " in line:
            return line.split("cpu backend: BLAS ", 1)[1]
    return "?"


def kernel_of(blas: str) -> str:
    return blas.split("kernel ", 1)[1].split(" ", 1)[0] if "kernel " in blas else "?"


def flops_per_example(job: dict) -> float | None:
    """Forward and backward products of an MLP example: 2 (2 D H + 3 H K)."""
    if not job["hidden"]:
        return None
    d, h, k = job["features"], job["hidden"], job["classes"]
    return 2.0 * (2 * d * h + 3 * h * k)


def bench_blas_of(exe: str) -> Path:
    return Path(exe).resolve().parent.parent / "bench" / "bench_blas"


def sgemm_rate(exe: str) -> dict | None:
    """bench_blas's single-thread sgemm GFLOP/s of the kernel infeedd runs (--blas-kernel auto) on
    the 1024x784x128 product, and the CPUs this process may use."""
    bench = bench_blas_of(exe)
    if not bench.exists():
        print(f"(no {bench}: build the bench_blas target for the matrix-product fraction)")
        return None
    out = subprocess.run([str(bench), "--kernels", "auto", "--reps", "3", "--json"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        print(f"bench_blas failed: {out.stderr[-500:]}")
        return None
    cell = json.loads(out.stdout.strip().splitlines()[-1])[0]
    return {"label": cell["label"], "gflops_1thread": cell["ref 1024x784x128"],
            "cpus": len(os.sched_getaffinity(0))}


def sgemm_rate_now(bench: Path, threads: int) -> float:
    """The machine's sgemm GFLOP/s now: bench_blas's 1024x784x128 product with the daemon's
    kernel (--blas-kernel auto) on `threads` threads at once, their sum (the best of 5 rounds of
    0.25 s, about 1.5 s in all)."""
    out = subprocess.run([str(bench), "--kernels", "auto", "--reps", "5", "--shapes", "ref",
                          "--threads", str(threads), "--json"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"bench_blas --threads {threads} failed: {out.stderr[-500:]}")
    cell = json.loads(out.stdout.strip().splitlines()[-1])[0]
    if cell.get("failed"):
        raise RuntimeError(f"bench_blas --threads {threads} failed: {out.stdout[-500:]}")
    return cell["ref 1024x784x128"]


def beside(rate_now, run):
    """run() with the sgemm rate measured just before and just after it (rate_now(): GFLOP/s, or
    None for no measurement): its result with "sgemm_before" and "sgemm_after"."""
    before = rate_now() if rate_now else None
    res = run()
    after = rate_now() if rate_now else None
    return dict(res, sgemm_before=before, sgemm_after=after)


def sgemm_fraction(res: dict, flops_per_sec: float) -> float | None:
    """A run's FLOP/s over the higher of the sgemm rates measured beside it (None without them)."""
    before, after = res.get("sgemm_before"), res.get("sgemm_after")
    if not before or not after:
        return None
    return flops_per_sec / (max(before, after) * 1e9)


def keras_python(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"== installing keras, jax and tensorflow-cpu into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "keras>=3", "jax[cpu]",
                        "tensorflow-cpu", "numpy"], check=True)
    return py


def run_keras(py: Path, backend: str, job: dict, steps: int, rows: int) -> dict:
    spec = dict(job, steps=steps, rows=rows, lr=LR, ipl=IPL)
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    out = subprocess.run([str(py), "-c", KERAS_SCRIPT, json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"keras/{backend}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_jobs(text: str) -> list:
    """--jobs: names of JOBS or JOB_GROUPS, comma-separated, in order, each once."""
    jobs: list = []
    for j in (v for v in text.split(",") if v):
        for name in JOB_GROUPS.get(j, (j,)):
            if name not in JOBS:
                raise ValueError(f"--jobs: unknown job '{name}' (expected some of "
                                 f"{', '.join(list(JOBS) + list(JOB_GROUPS))})")
            if name not in jobs:
                jobs.append(name)
    return jobs


def run_charlm_job(exe: str | None, py, name: str, steps: int, replicas: str, tmp: Path,
                   rounds: int = 1, rate_now=None) -> dict:
    """One charlm job: in each round, infeedd at each replica count, then Keras on JAX and
    TensorFlow, each run between two measurements of the sgemm rate (rate_now(), GFLOP/s; None:
    none); each peer's row is its fastest round (the least disturbed on a shared machine), with
    every round's tokens/s in "rounds" and its fraction of the rate beside it in "fractions"."""
    job = JOBS[name]
    row = {"job": name, "infeedd": {}, "keras": {}, "steps": steps}

    fpt = flops_per_token(job)

    def keep(where: dict, key: str, res: dict, label: str) -> None:
        seen = where.get(key, {}).get("rounds", [])
        fractions = where.get(key, {}).get("fractions", [])
        if not seen or res["tokens_per_sec"] > where[key]["tokens_per_sec"]:
            where[key] = res
        where[key]["rounds"] = seen + [res["tokens_per_sec"]]
        frac = sgemm_fraction(res, res["tokens_per_sec"] * fpt)
        where[key]["fractions"] = fractions + [frac]
        print(f"{name} {label} (round {len(seen) + 1}): {res}, of sgemm "
              f"{'-' if frac is None else f'{frac:.1%}'}", flush=True)

    for _ in range(rounds):
        for r in (int(v) for v in replicas.split(",") if exe):
            key = f"R{r}/feed"
            keep(row["infeedd"], key,
                 beside(rate_now, lambda: run_infeedd_charlm(exe, job, r, steps, tmp)),
                 f"infeedd {key}")
        for backend in ("jax", "tensorflow") if py else ():
            keep(row["keras"], backend,
                 beside(rate_now, lambda: run_keras_charlm(py, backend, job, steps)),
                 f"keras/{backend}")
    return row


# a run whose two sgemm measurements differ by more than this (of the higher) is marked:
# the machine's rate moved during it, so its fraction is less certain
RATE_MOVED = 0.25


def print_charlm(rows: list, threads: int) -> bool:
    """The charlm jobs' table (tokens/s, ratios, achieved FLOP/s against the sgemm rate measured
    on `threads` threads beside each run) and targets; True when met."""
    print()
    print("charlm: FLOP a token = 6 N + 12 L T C (N: the matrices' parameters, L 12 C^2 + C V)")
    print(f"sgemm: bench_blas 1024x784x128 on {threads} thread(s) at once, GFLOP/s just before "
          f"and just after each run; of sgemm: the run's GFLOP/s over the higher of the two")
    n = max((len(r.get("rounds", [])) for row in rows
             for r in list(row["infeedd"].values()) + list(row["keras"].values())), default=1)
    if n > 1:
        print(f"each row: the fastest of {n} rounds, every peer in turn")
    print(f"{'job':<10} {'peer':<22} {'tokens/s':>10} {'wait':>6} {'x jax':>7} {'x tf':>7} "
          f"{'GFLOP/s':>8} {'sgemm before':>12} {'after':>7} {'of sgemm':>8}")
    ok, moved = True, False
    for row in rows:
        job = JOBS[row["job"]]
        fpt = flops_per_token(job)
        jax = row["keras"].get("jax", {}).get("tokens_per_sec")
        tf = row["keras"].get("tensorflow", {}).get("tokens_per_sec")
        best, best_frac = 0.0, None
        peers = [("infeedd " + k, v) for k, v in row["infeedd"].items()]
        peers += [("keras/" + k, v) for k, v in row["keras"].items()]
        for label, res in peers:
            tps = res["tokens_per_sec"]
            mine = label.startswith("infeedd")
            w = f"{res['wait']:.0%}" if isinstance(res.get("wait"), (int, float)) else ""
            rj = f"{tps / jax:.2f}" if jax and mine else ""
            rt = f"{tps / tf:.2f}" if tf and mine else ""
            before, after = res.get("sgemm_before"), res.get("sgemm_after")
            f = sgemm_fraction(res, tps * fpt)
            mark = ""
            if f is not None and abs(before - after) > RATE_MOVED * max(before, after):
                mark, moved = "*", True
            if mine and tps > best:  # the target's row: the fastest, its own fraction
                best, best_frac = tps, f
            print(f"{row['job']:<10} {label:<22} {tps:>10,.0f} {w:>6} {rj:>7} {rt:>7} "
                  f"{tps * fpt * 1e-9:>8.1f} {before or 0:>12.1f} {after or 0:>7.1f} "
                  f"{'-' if f is None else f'{f:.0%}{mark}':>8}")
        name = row["job"]
        every = sorted(f for r in row["infeedd"].values() for f in r.get("fractions", [])
                       if f is not None)
        if len(every) > 1:
            print(f"{name:<10} infeedd's fraction of the sgemm rate beside it, every run: "
                  f"{', '.join(f'{f:.0%}' for f in every)} "
                  f"(median {statistics.median(every):.0%})")
        if jax and best:
            met = best / jax >= TARGETS[name]
            ok &= met
            print(f"{name:<10} target: best infeedd >= {TARGETS[name]}x keras/jax: "
                  f"{best / jax:.2f}x {'met' if met else 'NOT met'}")
        if name in SGEMM_TARGETS and best_frac is not None:
            met = best_frac >= SGEMM_TARGETS[name]
            ok &= met
            print(f"{name:<10} target: best infeedd >= {SGEMM_TARGETS[name]:.0%} of the sgemm "
                  f"rate beside it (the fastest row's): {best_frac:.0%} "
                  f"{'met' if met else 'NOT met'}")
    if moved:
        print(f"*: the two sgemm measurements of the run differ by more than {RATE_MOVED:.0%}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--infeedd", default=None, help="the daemon (default: build-rel, then build)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per run (default: each job's own, a few seconds of infeedd's work: "
                         + ", ".join(f"{j} {v['steps']}" for j, v in JOBS.items()) + ")")
    ap.add_argument("--jobs", default=",".join(DEFAULT_JOBS),
                    help="comma-separated: " + ", ".join(JOBS) + " (default: "
                    + ",".join(DEFAULT_JOBS) + "; charlm: charlm8,charlm32)")
    ap.add_argument("--replicas", default="1,2", help="replica counts for infeedd (default 1,2)")
    ap.add_argument("--transports", default="tcp,ipc,shm",
                    help="default tcp,ipc,shm (the charlm jobs: infeed.feed over ipc, shared "
                         "memory when the daemon offers it)")
    ap.add_argument("--steps-per-message", default="1,100",
                    help="steps one infeedd message carries (--max-steps-per-message; at most "
                         "8 MiB a message), comma-separated: each is a row (default 1,100; the "
                         "charlm jobs: a loop's steps)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="charlm jobs: rounds of every peer in turn; each row is a peer's "
                         "fastest round (default 1)")
    ap.add_argument("--no-keras", action="store_true", help="infeedd only")
    ap.add_argument("--no-infeedd", action="store_true",
                    help="Keras only (no ratios; --infeedd still locates bench_blas for the "
                         "sgemm rate)")
    ap.add_argument("--daemon-flag", action="append", default=[], metavar="FLAG",
                    help="one more flag for infeedd, such as --daemon-flag=--host-call=none "
                         "(repeat for several)")
    ap.add_argument("--venv", default=str(ROOT / "bench" / ".venv-peers"))
    ap.add_argument("--json", default=None, help="also write the results to this file")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds: expected 1 or more, got {a.rounds}")
    DAEMON_FLAGS.extend(a.daemon_flag)
    exe = a.infeedd or next((str(p) for p in (ROOT / "build-rel/host/infeedd",
                                              ROOT / "build/host/infeedd") if p.exists()), None)
    if exe is None and not a.no_infeedd:
        ap.error("no infeedd: build one (see the docstring) or pass --infeedd")
    try:
        jobs = parse_jobs(a.jobs)
    except ValueError as e:
        ap.error(str(e))
    offered = transports_of_client()
    # the charlm jobs' sgemm rate, beside each run, on as many threads as the daemon runs
    threads = len(os.sched_getaffinity(0))
    rate_now = None
    if exe and bench_blas_of(exe).exists():
        rate_now = lambda: sgemm_rate_now(bench_blas_of(exe), threads)  # noqa: E731
    elif any(JOBS[j]["program"] == "charlm" for j in jobs):
        print(f"(no bench_blas beside {exe}: build the bench_blas target for the charlm jobs' "
              "fraction of the sgemm rate)")
    py = None if a.no_keras else keras_python(Path(a.venv))
    results = []
    blas_lines: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="infeed-peers-") as tmp:
        for name in jobs:
            job = JOBS[name]
            steps = a.steps or job["steps"]
            if job["program"] == "charlm":
                results.append(run_charlm_job(None if a.no_infeedd else exe, py, name, steps,
                                              a.replicas, Path(tmp), a.rounds, rate_now))
                blas_lines.update(r["blas"] for r in results[-1]["infeedd"].values())
                continue
            # a message carries at most 8 MiB (a large batch gains nothing from more steps)
            step_bytes = job["batch"] * (job["features"] + 1) * 4
            ks = sorted({max(1, min(int(v), MSG_BYTES // step_bytes))
                         for v in a.steps_per_message.split(",")})
            rows = max(job["batch"] * 64, 8192, 2 * ks[-1] * job["batch"])
            x, y = dataset(job, rows)
            row = {"job": name, "infeedd": {}, "keras": {}}
            for r in (int(v) for v in a.replicas.split(",") if not a.no_infeedd):
                for t in a.transports.split(","):
                    for k in ks:
                        key = f"R{r}/{t}/k{k}"
                        if t not in offered:
                            row["infeedd"][key] = None
                            continue
                        row["infeedd"][key] = run_infeedd(exe, job, r, t, steps, x, y,
                                                          Path(tmp), k)
                        print(f"{name} infeedd {key}: {row['infeedd'][key]}", flush=True)
                        blas_lines.add(row["infeedd"][key]["blas"])
            if py:
                for backend in ("jax", "tensorflow"):
                    row["keras"][backend] = run_keras(py, backend, job, steps, rows)
                    print(f"{name} keras/{backend}: {row['keras'][backend]}", flush=True)
            results.append(row)

    mlp = any(JOBS[j]["program"] != "charlm" and flops_per_example(JOBS[j]) for j in jobs)
    rate = sgemm_rate(exe) if exe and mlp else None
    print()
    for line in sorted(blas_lines):
        print(f"infeedd's BLAS: {line}")
    if rate:
        peak = rate["gflops_1thread"] * rate["cpus"]
        print(f"measured sgemm rate: {rate['gflops_1thread']:.1f} GFLOP/s a thread "
              f"({rate['label']}), x {rate['cpus']} CPUs = {peak:.1f} GFLOP/s")
    if any(JOBS[j]["program"] != "charlm" for j in jobs):
        print(f"{'job':<10} {'peer':<22} {'examples/s':>12} {'wait':>6} {'x jax':>7} "
              f"{'x tf':>7} {'kernel':>10} {'of sgemm':>8}")

    def fraction(job: str, eps: float) -> str:
        f = flops_per_example(JOBS[job])
        if not f or not rate:
            return "-"
        return f"{eps * f * 1e-9 / (rate['gflops_1thread'] * rate['cpus']):.0%}"
    ok = True
    for row in (r for r in results if JOBS[r["job"]]["program"] != "charlm"):
        jax = row["keras"].get("jax", {}).get("examples_per_sec")
        tf = row["keras"].get("tensorflow", {}).get("examples_per_sec")
        best = 0.0
        for key, res in row["infeedd"].items():
            if res is None:
                print(f"{row['job']:<10} {'infeedd ' + key:<22} {'n/a':>12}")
                continue
            eps = res["examples_per_sec"]
            best = max(best, eps)
            w = f"{res['wait']:.0%}" if isinstance(res["wait"], (int, float)) else "-"
            rj = f"{eps / jax:.2f}" if jax else "-"
            rt = f"{eps / tf:.2f}" if tf else "-"
            print(f"{row['job']:<10} {'infeedd ' + key:<22} {eps:>12,.0f} {w:>6} {rj:>7} {rt:>7} "
                  f"{kernel_of(res['blas']):>10} {fraction(row['job'], eps):>8}")
        for backend, res in row["keras"].items():
            eps = res["examples_per_sec"]
            print(f"{row['job']:<10} {'keras/' + backend:<22} {eps:>12,.0f} {'':>6} {'':>7} "
                  f"{'':>7} {'':>10} {fraction(row['job'], eps):>8}")
        if jax:
            met = best / jax >= TARGETS[row["job"]]
            ok &= met
            print(f"{row['job']:<10} target: best infeedd >= {TARGETS[row['job']]}x keras/jax: "
                  f"{best / jax:.2f}x {'met' if met else 'NOT met'}")
    charlm_rows = [r for r in results if JOBS[r["job"]]["program"] == "charlm"]
    if charlm_rows:
        ok &= print_charlm(charlm_rows, threads)
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "blas": sorted(blas_lines),
                                            "sgemm": rate}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
