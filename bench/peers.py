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
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "clients" / "python"))
import infeed  # noqa: E402

JOBS = {
    "softmax32": dict(program="softmax", features=64, classes=10, hidden=None, batch=32,
                      steps=60000),
    "mlp32": dict(program="mlp", features=784, classes=10, hidden=128, batch=32, steps=6000),
    "mlp1024": dict(program="mlp", features=784, classes=10, hidden=128, batch=1024, steps=400),
}
TARGETS = {"softmax32": 5.0, "mlp32": 1.5, "mlp1024": 1.1}  # x Keras/JAX (issue 18)
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


def sgemm_rate(exe: str) -> dict | None:
    """bench_blas's single-thread sgemm GFLOP/s of the kernel infeedd runs (--blas-kernel auto) on
    the 1024x784x128 product, and the CPUs this process may use."""
    bench = Path(exe).resolve().parent.parent / "bench" / "bench_blas"
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--infeedd", default=None, help="the daemon (default: build-rel, then build)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per run (default: each job's own, about 2 s of infeedd's work: "
                         + ", ".join(f"{j} {v['steps']}" for j, v in JOBS.items()) + ")")
    ap.add_argument("--jobs", default=",".join(JOBS), help="comma-separated: " + ", ".join(JOBS))
    ap.add_argument("--replicas", default="1,2", help="replica counts for infeedd (default 1,2)")
    ap.add_argument("--transports", default="tcp,ipc,shm", help="default tcp,ipc,shm")
    ap.add_argument("--steps-per-message", default="1,100",
                    help="steps one infeedd message carries (--max-steps-per-message; at most "
                         "8 MiB a message), comma-separated: each is a row (default 1,100)")
    ap.add_argument("--no-keras", action="store_true", help="infeedd only")
    ap.add_argument("--daemon-flag", action="append", default=[], metavar="FLAG",
                    help="one more flag for infeedd, such as --daemon-flag=--host-call=none "
                         "(repeat for several)")
    ap.add_argument("--venv", default=str(ROOT / "bench" / ".venv-peers"))
    ap.add_argument("--json", default=None, help="also write the results to this file")
    a = ap.parse_args()
    DAEMON_FLAGS.extend(a.daemon_flag)
    exe = a.infeedd or next((str(p) for p in (ROOT / "build-rel/host/infeedd",
                                              ROOT / "build/host/infeedd") if p.exists()), None)
    if exe is None:
        ap.error("no infeedd: build one (see the docstring) or pass --infeedd")
    jobs = [j for j in a.jobs.split(",") if j]
    for j in jobs:
        if j not in JOBS:
            ap.error(f"--jobs: unknown job '{j}' (expected some of {', '.join(JOBS)})")
    offered = transports_of_client()
    py = None if a.no_keras else keras_python(Path(a.venv))
    results = []
    blas_lines: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="infeed-peers-") as tmp:
        for name in jobs:
            job = JOBS[name]
            steps = a.steps or job["steps"]
            # a message carries at most 8 MiB (a large batch gains nothing from more steps)
            step_bytes = job["batch"] * (job["features"] + 1) * 4
            ks = sorted({max(1, min(int(v), MSG_BYTES // step_bytes))
                         for v in a.steps_per_message.split(",")})
            rows = max(job["batch"] * 64, 8192, 2 * ks[-1] * job["batch"])
            x, y = dataset(job, rows)
            row = {"job": name, "infeedd": {}, "keras": {}}
            for r in (int(v) for v in a.replicas.split(",")):
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

    rate = sgemm_rate(exe) if any(flops_per_example(JOBS[j]) for j in jobs) else None
    print()
    for line in sorted(blas_lines):
        print(f"infeedd's BLAS: {line}")
    if rate:
        peak = rate["gflops_1thread"] * rate["cpus"]
        print(f"measured sgemm rate: {rate['gflops_1thread']:.1f} GFLOP/s a thread "
              f"({rate['label']}), x {rate['cpus']} CPUs = {peak:.1f} GFLOP/s")
    print(f"{'job':<10} {'peer':<22} {'examples/s':>12} {'wait':>6} {'x jax':>7} {'x tf':>7} "
          f"{'kernel':>10} {'of sgemm':>8}")

    def fraction(job: str, eps: float) -> str:
        f = flops_per_example(JOBS[job])
        if not f or not rate:
            return "-"
        return f"{eps * f * 1e-9 / (rate['gflops_1thread'] * rate['cpus']):.0%}"
    ok = True
    for row in results:
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
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "blas": sorted(blas_lines),
                                            "sgemm": rate}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
