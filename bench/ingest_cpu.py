#!/usr/bin/env python3
"""The daemon's CPU time a batch in bench_ingest's cells, for one or more infeedd builds.

bench_ingest's ratio (infeed over raw libzmq) moves with whatever else the machine runs; the
daemon's own CPU time a batch moves much less. This runs bench_ingest with each daemon wrapped in
`perf stat` (task-clock, context switches, and the system calls the hand-offs make), alternating
the daemons for --rounds rounds, and prints per daemon the median (and quartiles) of each count
over its cells, divided by the cell's --steps (so the 100 warm-up batches and the daemon's start
and end count as part of a batch), and the median ratio per transport.

    python3 bench/ingest_cpu.py [--bench build-rel/bench/bench_ingest] [--rounds 3]
        [--size 4096] [--transports tcp,ipc] [--repeat 3] [--seconds 0.5] [--wakeups]
        NAME=INFEEDD ...

--wakeups records the scheduler's events instead (`perf record -e sched:sched_wakeup -e
sched:sched_switch`) and prints, a batch, who woke whom (the waking thread's name -> the woken
thread's) and how often each thread was switched out asleep (S) or while runnable (R): the
daemon's hand-offs between its threads, and libzmq's.

INFEEDD: an infeedd binary; a libinfeed.so.0 beside it is used instead of the one it was built
with (copy both to keep a build for comparison). Needs perf (and the syscalls tracepoints;
without them only task-clock and context switches are counted).
"""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

EVENTS = ["task-clock", "context-switches"]
SYSCALLS = ["poll", "write", "futex", "sched_yield"]


def tracepoints_ok():
    r = subprocess.run(["perf", "stat", "-e", "syscalls:sys_enter_poll", "true"],
                       capture_output=True, text=True)
    return r.returncode == 0


def wrapper(path, infeedd, out, events, wakeups=False):
    libdir = os.path.dirname(os.path.abspath(infeedd))
    ldp = (f'export LD_LIBRARY_PATH={libdir}\n'
           if os.path.exists(os.path.join(libdir, "libinfeed.so.0")) else "")
    stat = f'perf stat -x, -e {",".join(events)} -o {out}/$$.txt'
    record = f"perf record -q -e sched:sched_wakeup -e sched:sched_switch -o {out}/$$.txt"
    with open(path, "w") as f:
        f.write(f"""#!/bin/sh
steps=0; prev=""
for a in "$@"; do [ "$prev" = "--steps" ] && steps=$a; prev=$a; done
echo "$steps" > {out}/$$.steps
{ldp}exec {record if wakeups else stat} -- {os.path.abspath(infeedd)} "$@"
""")
    os.chmod(path, 0o755)


WAKE = re.compile(r"\s*(.+?)\s+sched:sched_wakeup:\s+comm=(.+?) pid=")
SWITCH = re.compile(r".*sched:sched_switch:\s+prev_comm=(.+?) prev_pid=.* prev_state=(\S+) ")


def sched_counts(f):
    """Wake-ups (waker -> woken) and switches (thread, S asleep or R runnable) in a perf.data."""
    out = subprocess.run(["perf", "script", "-i", f, "-F", "comm,event,trace"],
                         capture_output=True, text=True).stdout
    counts = {}
    for line in out.splitlines():
        m = WAKE.match(line)
        key = f"{m.group(1)} -> {m.group(2)}" if m else None
        if m is None and (m := SWITCH.match(line)):
            key = f"switch {m.group(1)} {'S' if m.group(2).startswith('S') else 'R'}"
        if key:
            counts[key] = counts.get(key, 0) + 1
    return counts


def read_cells(out, wakeups=False):
    cells = []
    for f in glob.glob(os.path.join(out, "*.txt")):
        steps = int(open(f[:-4] + ".steps").read())
        if wakeups:
            counts = sched_counts(f)
            if steps > 0 and counts:
                cells.append({k: c / steps for k, c in counts.items()})
            continue
        counts = {}
        for line in open(f):
            v = line.strip().split(",")
            if len(v) < 3 or line.startswith("#"):
                continue
            try:
                counts[v[2].replace("syscalls:sys_enter_", "")] = float(v[0])
            except ValueError:
                pass  # <not counted>
        if steps > 0 and "task-clock" in counts:
            cells.append({k: c / steps for k, c in counts.items()})
    return cells


def load():
    return open("/proc/loadavg").read().split()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default="build-rel/bench/bench_ingest")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", default="4096")
    ap.add_argument("--transports", default="tcp,ipc")
    ap.add_argument("--repeat", default="3")
    ap.add_argument("--seconds", default="0.5")
    ap.add_argument("--wakeups", action="store_true",
                    help="count the scheduler's wake-ups and switches instead of perf stat's")
    ap.add_argument("daemons", nargs="+", metavar="NAME=INFEEDD")
    a = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("ingest_cpu: perf not found (apt-get install linux-perf)")
    events = EVENTS + (["syscalls:sys_enter_" + s for s in SYSCALLS] if tracepoints_ok() else [])
    daemons = []
    for d in a.daemons:
        name, sep, path = d.partition("=")
        if not sep or not os.access(path, os.X_OK):
            sys.exit(f"ingest_cpu: {d}: expected NAME=INFEEDD with an executable infeedd")
        daemons.append((name, path))
    tmp = tempfile.mkdtemp(prefix="ifd-ingest-cpu-")
    ratios = {}
    print(f"load average at start: {load()}")
    for r in range(a.rounds):
        for name, path in daemons:
            out = os.path.join(tmp, name)
            os.makedirs(out, exist_ok=True)
            wrap = os.path.join(tmp, name + ".sh")
            wrapper(wrap, path, out, events, a.wakeups)
            res = subprocess.run([a.bench, "--infeedd", wrap, "--size", a.size, "--transports",
                                  a.transports, "--repeat", a.repeat, "--seconds", a.seconds],
                                 capture_output=True, text=True)
            for line in res.stdout.splitlines():
                m = re.match(r"(\d+ \w+)\s+(\S+)\s+\d+\s+\S+\s+\S+\s+\S+\s+\S+\s+(\S+)", line)
                if m and m.group(3) != "-":
                    ratios.setdefault((name, m.group(1), m.group(2)), []).append(float(m.group(3)))
            print(f"round {r + 1} {name}: load {load()}", flush=True)
    print(f"load average at end: {load()}")
    keys = ["task-clock", "context-switches"] + SYSCALLS
    for name, _ in daemons:
        cells = read_cells(os.path.join(tmp, name), a.wakeups)
        if a.wakeups:  # every pair seen, the most frequent first (by the median a batch)
            seen = {k for c in cells for k in c}
            keys = sorted(seen, key=lambda k: -statistics.median(c.get(k, 0) for c in cells))[:16]
        parts = []
        for k in keys:
            v = [c.get(k, 0) * (1000 if k == "task-clock" else 1) for c in cells
                 if k in c or a.wakeups]
            if not v:
                continue
            q = statistics.quantiles(v, n=4, method="inclusive") if len(v) >= 2 else [v[0]] * 3
            unit = " us" if k == "task-clock" else ""
            parts.append(f"{k} {statistics.median(v):.3f}{unit} [{q[0]:.3f}-{q[2]:.3f}]")
        sep = ",\n  " if a.wakeups else ", "
        print(f"{name}: {len(cells)} cells, a batch: " + sep.join(parts))
        for (n, size, tr), v in sorted(ratios.items()):
            if n == name:
                print(f"  {size} {tr}: ratio median {statistics.median(v):.2f} of {len(v)} "
                      f"({' '.join(f'{x:.2f}' for x in v)})")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
