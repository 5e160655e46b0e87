#!/usr/bin/env python3
"""bench/multihost.py: the cost of crossing hosts (docs/multihost.md).

Trains the same model on the same global batches as 1 host x 2 replicas and as 2 hosts x 1
replica (mpirun on this machine, ipc endpoints), and prints each one's steps/s and, for 2 hosts,
the time a step spends in the hosts' all-reduce collective (from the daemon's own count). Needs
mpirun and infeedd built with MPI; run from the repository root:

    python3 bench/multihost.py [--infeedd build/host/infeedd] [--steps 3000] [--features 256]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "clients" / "python"))
import infeed  # noqa: E402

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(exe, hosts, replicas, a, batches, tmp):
    d = Path(tmp) / f"{hosts}x{replicas}"
    d.mkdir()
    argv = [exe, "--listen", f"ipc://{d}/in-{{rank}}", "--control", "", "--publish", "",
            "--summaries", f"{d}/s-{{rank}}.jsonl", "--replicas", str(replicas),
            "--batch-size", str(a.batch), "--steps", str(a.steps), "--iterations-per-loop",
            str(a.ipl), "--summary-every", "0", "--program", "softmax", "--features",
            str(a.features), "--classes", str(a.classes), "--log-level", "info"]
    if hosts > 1:
        argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(hosts)] + argv
    else:
        argv = [x.replace("{rank}", "0") for x in argv]
    log = open(d / "log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=ENV)

    def feed(h):
        p = infeed.Producer(f"ipc://{d}/in-{h}", name=f"b{h}", timeout=60)
        rows = a.batch // hosts
        try:
            i = 0
            while True:
                x, y = batches[i % len(batches)]
                p.send({"x": x[h * rows:(h + 1) * rows], "y": y[h * rows:(h + 1) * rows]})
                i += 1
        except infeed.RunEnded:
            pass
        p.close()

    ts = [threading.Thread(target=feed, args=(h,), daemon=True) for h in range(hosts)]
    for t in ts:
        t.start()
    rc = proc.wait(600)
    for t in ts:
        t.join(10)
    text = (d / "log").read_text(errors="replace")
    if rc != 0:
        sys.exit(f"{hosts}x{replicas}: exit {rc}\n{text[-3000:]}")
    train = [json.loads(line) for line in (d / "s-0.jsonl").read_text().splitlines()]
    train = [s for s in train if s["event"] == "train"]
    sps = train[-1]["steps_per_sec"]
    m = re.search(r"all-reduce across \d+ hosts: \d+ steps, ([0-9.]+) us a step", text)
    return sps, float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--infeedd", default=str(ROOT / "build" / "host" / "infeedd"))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--ipl", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--classes", type=int, default=10)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((a.batch, a.features)).astype(np.float32),
                rng.integers(0, a.classes, a.batch, dtype=np.int32)) for _ in range(64)]
    nparams = (a.features + 1) * a.classes
    print(f"softmax D={a.features} K={a.classes} ({nparams} parameters), global batch {a.batch}, "
          f"{a.steps} steps, iterations_per_loop {a.ipl}")
    print(f"{'hosts x replicas':<18}{'steps/s':>10}{'collective us/step':>22}")
    with tempfile.TemporaryDirectory() as tmp:
        for hosts, replicas in [(1, 2), (2, 1)]:
            sps, us = run(a.infeedd, hosts, replicas, a, batches, tmp)
            print(f"{f'{hosts} x {replicas}':<18}{sps:>10.0f}"
                  f"{'-' if us is None else f'{us:.1f}':>22}")


if __name__ == "__main__":
    main()
