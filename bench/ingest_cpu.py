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

--roles samples the whole bench instead (`perf record -F 4999 -e cpu-clock`, one transport and
one raw and one infeed cell a run) and prints, a batch, the CPU time of each side's threads: raw's
sending thread, its ROUTER thread and its two libzmq I/O threads; the C producer's thread and its
libzmq I/O thread; each of the daemon's threads (libzmq's I/O thread among them). Both cells of a
run move about the same number of batches (the infeed cell's --steps comes from the raw rate), so
both sides are divided by it; samples of the bench's main thread while a daemon runs count as the
producer's.

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


def roles_wrapper(path, infeedd, out):
    libdir = os.path.dirname(os.path.abspath(infeedd))
    ldp = (f'export LD_LIBRARY_PATH={libdir}\n'
           if os.path.exists(os.path.join(libdir, "libinfeed.so.0")) else "")
    with open(path, "w") as f:
        f.write(f"""#!/bin/sh
steps=0; prev=""
for a in "$@"; do [ "$prev" = "--steps" ] && steps=$a; prev=$a; done
echo "$steps" > {out}/$$.steps
{ldp}exec {os.path.abspath(infeedd)} "$@"
""")
    os.chmod(path, 0o755)


def roles_cell(data, steps):
    """CPU us a batch by role, from one bench run's perf.data (one raw and one infeed cell)."""
    text = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,time"],
                          capture_output=True, text=True).stdout
    rows = []
    for line in text.splitlines():
        p = line.split()
        if len(p) >= 3 and "/" in p[-2]:
            pid, tid = (int(x) for x in p[-2].split("/"))
            rows.append((pid, tid, " ".join(p[:-2]), float(p[-1].rstrip(":"))))
    bench = [pid for pid, _, comm, _ in rows if comm.startswith("bench_ingest")]
    if not rows or not bench:
        return {}
    bpid = min(bench)
    daemon = [t for pid, _, comm, t in rows if pid != bpid and comm != "perf"]
    t0, t1 = (min(daemon), max(daemon)) if daemon else (0, 0)
    first = {}
    for _, tid, _, t in rows:
        first[tid] = min(first.get(tid, t), t)
    counts = {}
    for pid, tid, comm, t in rows:
        if pid == bpid and tid == bpid:
            key = "producer: its thread" if t0 <= t <= t1 else "raw: sending thread"
        elif pid == bpid and first[tid] >= t0 - 0.05:
            key = "producer: libzmq I/O"
        elif pid == bpid:
            key = ("raw: libzmq I/O (both ends)" if comm.startswith("ZMQbg/IO") else
                   "raw: ROUTER thread" if not comm.startswith("ZMQbg") else None)
        elif comm.startswith("ZMQbg/IO"):
            key = "daemon: libzmq I/O"
        elif comm.startswith("ifd-") or comm == "infeedd":
            key = "daemon: " + comm
        else:
            key = None
        if key:
            counts[key] = counts.get(key, 0) + 1
    return {k: c / 4999 * 1e6 / steps for k, c in counts.items()}


def roles_report(name, cells):
    keys = sorted({k for c in cells for k in c})
    sums = {}
    print(f"{name}: {len(cells)} runs, CPU us a batch (median [quartiles]):")
    for k in keys:
        v = [c.get(k, 0.0) for c in cells]
        if statistics.median(v) < 0.005:
            continue
        q = statistics.quantiles(v, n=4, method="inclusive") if len(v) >= 2 else [v[0]] * 3
        print(f"  {k:28s} {statistics.median(v):6.2f} [{q[0]:.2f}-{q[2]:.2f}]")
    for side in ("raw", "producer", "daemon"):
        v = [sum(x for k, x in c.items() if k.startswith(side + ":")) for c in cells]
        sums[side] = statistics.median(v)
    print(f"  sums: raw {sums['raw']:.2f}, producer {sums['producer']:.2f}, daemon "
          f"{sums['daemon']:.2f} (infeed {sums['producer'] + sums['daemon']:.2f})")


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
    ap.add_argument("--roles", action="store_true",
                    help="sample the whole bench: the CPU a batch of each side's threads")
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
    if a.roles:
        roles_main(a, daemons, tmp)
        return
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


def roles_main(a, daemons, tmp):
    cells = {}
    print(f"load average at start: {load()}")
    for r in range(a.rounds):
        for name, path in daemons:
            for tr in a.transports.split(","):
                out = os.path.join(tmp, f"{name}-{r}-{tr}")
                os.makedirs(out)
                wrap = os.path.join(out, "infeedd.sh")
                roles_wrapper(wrap, path, out)
                data = os.path.join(out, "perf.data")
                res = subprocess.run(["perf", "record", "-q", "-F", "4999", "-e", "cpu-clock",
                                      "-o", data, "--", a.bench, "--infeedd", wrap, "--size",
                                      a.size, "--transports", tr, "--repeat", "1", "--seconds",
                                      a.seconds], capture_output=True, text=True)
                steps = [int(open(f).read()) for f in glob.glob(os.path.join(out, "*.steps"))]
                for line in res.stdout.splitlines():
                    m = re.match(r"(\d+ \w+)\s+(\S+)\s+\d+\s+\S+\s+\S+\s+\S+\s+\S+\s+(\S+)",
                                 line)
                    if m and m.group(3) != "-":
                        ratios = cells.setdefault((name, "ratio", tr), [])
                        ratios.append(float(m.group(3)))
                if steps and steps[0] > 0:
                    cells.setdefault((name, "cells", tr), []).append(roles_cell(data, steps[0]))
                shutil.rmtree(out)
            print(f"round {r + 1} {name}: load {load()}", flush=True)
    print(f"load average at end: {load()}")
    for name, _ in daemons:
        for tr in a.transports.split(","):
            roles_report(f"{name} {tr}", cells.get((name, "cells", tr), []) or [{}])
            v = cells.get((name, "ratio", tr), [])
            if v:
                print(f"  ratio median {statistics.median(v):.2f} of {len(v)} "
                      f"({' '.join(f'{x:.2f}' for x in v)})")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
