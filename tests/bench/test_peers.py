"""bench/peers.py's charlm jobs without running the benchmark:

- infeedd's command line carries the job's program config and every optimizer flag of
  CHARLM_FLAGS with CHARLM_OPTIMIZER's values (decay over the run's steps), then --daemon-flag's;
- --jobs: "charlm" names both charlm jobs, names are kept once and in order, an unknown one is
  named in the error;
- the FLOP count a token is 6 N + 12 L T C with N counted from charlm_ref's parameter list;
- a message of steps stays under the 8 MiB bound; --rounds runs the peers in turn and keeps
  each one's fastest round;
- the sgemm rate is measured just before and just after every peer's run, and each run's
  fraction (and the 60 % target's verdict) is its FLOP/s over the higher of those two; with a
  bench_blas beside INFEEDD, its --threads measurement gives a positive rate;
- with a Keras environment (bench/.venv-peers, or IFD_KERAS_PYTHON: the Python that has keras,
  jax and tensorflow): bench/keras_charlm.py's model has charlm_ref's loss, gradients and
  predict output at the same weights, on JAX and TensorFlow, on random small shapes;
- the infeedd side's plumbing, with a fake infeedd (tests/e2e/fake_daemon.py on the command
  line's --listen): the corpus's windows arrive as tokens and targets (the next byte at every
  position) in messages of the steps asked, and the run's tokens/s, loss, wait and BLAS line
  are read back from its summaries and log;
- with an infeedd that has the program charlm (INFEEDD, else build/host/infeedd): a short charlm
  job runs through infeed.feed and reports its tokens/s and a finite loss.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "util"))
import charlm_ref  # noqa: E402
import peers  # noqa: E402


def flag_values(argv: list) -> dict:
    """--flag value pairs of a command line (every flag here takes a value)."""
    out = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            assert a not in out, f"{a} twice"
            out[a] = argv[i + 1]
    return out


@pytest.mark.parametrize("name", ["charlm8", "charlm32"])
def test_infeedd_command_line(name, tmp_path, monkeypatch):
    rng = random.Random(name)
    job = peers.JOBS[name]
    warmup = peers.CHARLM_OPTIMIZER["warmup_steps"]
    for steps in (rng.randint(1, warmup), rng.randint(warmup + 1, 5000)):
        check_command_line(job, steps, rng.randint(1, 4), tmp_path, monkeypatch)


def check_command_line(job, steps, replicas, tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "DAEMON_FLAGS", ["--host-call", "none"])
    argv = peers.charlm_argv("infeedd", job, replicas, steps, "ipc:///x", tmp_path / "s.jsonl",
                             peers.charlm_steps_per_message(job))
    assert argv[0] == "infeedd" and argv[-2:] == ["--host-call", "none"]
    f = flag_values(argv[1:])
    assert f["--program"] == "charlm"
    assert json.loads(f[peers.CHARLM_FLAGS["program_config"]]) == {
        k: job[k] for k in ("layers", "heads", "width", "block", "vocab")}
    assert f["--batch-size"] == str(job["batch"]) and f["--steps"] == str(steps)
    assert f["--replicas"] == str(replicas)
    assert f["--iterations-per-loop"] == str(job["ipl"])
    for key, flag in peers.CHARLM_FLAGS.items():
        if isinstance(flag, tuple):  # a flag with its fixed value
            assert f[flag[0]] == flag[1]
        elif key == "decay_steps":  # the run's end, after the warmup at least
            assert f[flag] == str(max(steps, peers.CHARLM_OPTIMIZER["warmup_steps"] + 1))
        elif key != "program_config":
            assert float(f[flag]) == peers.CHARLM_OPTIMIZER[key], key
    assert set(peers.CHARLM_OPTIMIZER) <= set(peers.CHARLM_FLAGS)


def test_jobs_option():
    assert peers.parse_jobs("charlm") == ["charlm8", "charlm32"]
    assert peers.parse_jobs("charlm32,mlp32,charlm,mlp32") == ["charlm32", "mlp32", "charlm8"]
    assert peers.parse_jobs("") == []
    with pytest.raises(ValueError, match="unknown job 'charlm64'"):
        peers.parse_jobs("charlm8,charlm64")
    assert all(j in peers.JOBS for j in peers.DEFAULT_JOBS)


@pytest.mark.parametrize("seed", range(4))
def test_flops_per_token(seed):
    rng = random.Random(seed)
    heads = rng.randint(1, 8)
    job = dict(layers=rng.randint(1, 6), heads=heads, width=heads * rng.randint(1, 32),
               block=rng.randint(1, 256), vocab=rng.randint(2, 1000))
    specs = charlm_ref.param_specs(job["layers"], job["width"], job["block"], job["vocab"])
    n = sum(math.prod(shape) for name, shape, _ in specs
            if len(shape) == 2 and not name.endswith("_emb"))  # the matrices; lookups aren't
    want = 6 * n + 12 * job["layers"] * job["block"] * job["width"]
    assert peers.flops_per_token(job) == want


def test_rounds_alternate_the_peers_and_keep_the_fastest(monkeypatch, tmp_path):
    rng = random.Random(7)
    rounds, calls = rng.randint(2, 4), []
    speed = {}

    def fake(label):
        def run(*args, **kw):
            calls.append(label)
            tps = rng.uniform(1, 100)
            speed.setdefault(label, []).append(tps)
            return {"tokens_per_sec": tps}
        return run

    monkeypatch.setattr(peers, "run_infeedd_charlm",
                        lambda exe, job, r, steps, tmp: fake(f"R{r}")())
    monkeypatch.setattr(peers, "run_keras_charlm",
                        lambda py, backend, job, steps: fake(backend)())
    row = peers.run_charlm_job("infeedd", "python", "charlm8", 10, "1,2", tmp_path, rounds)
    assert calls == ["R1", "R2", "jax", "tensorflow"] * rounds
    for where, key, label in ((row["infeedd"], "R1/feed", "R1"), (row["infeedd"], "R2/feed", "R2"),
                              (row["keras"], "jax", "jax"), (row["keras"], "tensorflow", "tensorflow")):
        assert where[key]["rounds"] == speed[label]
        assert where[key]["tokens_per_sec"] == max(speed[label])
    assert peers.run_charlm_job(None, None, "charlm8", 10, "1", tmp_path, 2)["infeedd"] == {}


def test_sgemm_rate_is_measured_beside_every_run(monkeypatch, tmp_path):
    rng = random.Random(11)
    rounds, calls, rates = rng.randint(1, 3), [], []

    def rate_now():
        rates.append(rng.uniform(50, 300))
        calls.append("rate")
        return rates[-1]

    def fake(label):
        calls.append(label)
        return {"tokens_per_sec": rng.uniform(1000, 60000)}

    monkeypatch.setattr(peers, "run_infeedd_charlm", lambda exe, job, r, steps, tmp: fake(f"R{r}"))
    monkeypatch.setattr(peers, "run_keras_charlm", lambda py, backend, job, steps: fake(backend))
    row = peers.run_charlm_job("infeedd", "python", "charlm32", 10, "1,2", tmp_path, rounds,
                               rate_now)
    assert calls == ["rate", "R1", "rate", "rate", "R2", "rate", "rate", "jax", "rate",
                     "rate", "tensorflow", "rate"] * rounds
    fpt = peers.flops_per_token(peers.JOBS["charlm32"])
    for i, (where, key) in enumerate(((row["infeedd"], "R1/feed"), (row["infeedd"], "R2/feed"),
                                      (row["keras"], "jax"), (row["keras"], "tensorflow"))):
        res = where[key]
        for rnd in range(rounds):  # each round's fraction: against its own two measurements
            before, after = rates[2 * (4 * rnd + i)], rates[2 * (4 * rnd + i) + 1]
            want = res["rounds"][rnd] * fpt / (max(before, after) * 1e9)
            assert res["fractions"][rnd] == pytest.approx(want, rel=1e-12)
        kept = res["rounds"].index(res["tokens_per_sec"])
        assert (res["sgemm_before"], res["sgemm_after"]) == (rates[2 * (4 * kept + i)],
                                                             rates[2 * (4 * kept + i) + 1])


@pytest.mark.parametrize("frac", [0.55, 0.65])
def test_sgemm_target_uses_the_rate_beside_the_run(frac, capsys):
    rng = random.Random(str(frac))
    fpt = peers.flops_per_token(peers.JOBS["charlm32"])
    tps = rng.uniform(10000, 60000)
    mean = tps * fpt / frac / 1e9  # GFLOP/s such that the run is at frac of it
    skew = rng.uniform(0, 0.2) * mean
    # the higher measurement is the denominator: after, or before
    good = {"tokens_per_sec": tps, "sgemm_before": mean - 2 * skew, "sgemm_after": mean}
    if rng.random() < 0.5:
        good["sgemm_before"], good["sgemm_after"] = mean, mean - 2 * skew
    # a slower run beside a much lower rate: a larger fraction, not the fastest row's
    slow = {"tokens_per_sec": tps / 2, "sgemm_before": mean / 10, "sgemm_after": mean / 10}
    keras = {"tokens_per_sec": tps / 10, "sgemm_before": mean, "sgemm_after": mean}
    row = {"job": "charlm32", "infeedd": {"R1/feed": good}, "keras": {"jax": keras}}
    ok = peers.print_charlm([row], 2)
    out = capsys.readouterr().out
    verdict = f"{frac:.0%} {'met' if frac >= 0.6 else 'NOT met'}"
    assert f"rate beside it (the fastest row's): {verdict}" in out
    assert ok == (frac >= 0.6)
    assert f"{mean - 2 * skew:.1f}" in out and f"{mean:.1f}" in out
    row["infeedd"]["R2/feed"] = slow  # the fastest row's fraction is the target's, not the largest
    assert peers.print_charlm([row], 2) == (frac >= 0.6)
    out = capsys.readouterr().out
    assert f"rate beside it (the fastest row's): {verdict}" in out
    assert f"{tps / 2 * fpt / (mean / 10) / 1e9:.0%}*" not in out  # the slow row: not moved
    assert f"{tps / 2 * fpt / (mean / 10) / 1e9:.0%}" in out
    assert ("*: the two sgemm measurements" in out) == (2 * skew > peers.RATE_MOVED * mean)
    keras.update(sgemm_before=mean * 0.6, sgemm_after=mean)  # a rate that moved: marked
    peers.print_charlm([row], 2)
    out = capsys.readouterr().out
    assert f"{tps / 10 * fpt / mean / 1e9:.0%}*" in out and "*: the two sgemm measurements" in out


def test_main_prints_the_charlm_table_with_the_rates_beside(monkeypatch, tmp_path, capsys):
    rng = random.Random(5)
    rates = []

    def rate_now(bench, threads):
        rates.append(rng.uniform(100, 300))
        return rates[-1]

    tps = {r: rng.uniform(10000, 60000) for r in (1, 2)}
    monkeypatch.setattr(peers, "sgemm_rate_now", rate_now)
    monkeypatch.setattr(peers, "bench_blas_of", lambda exe: tmp_path)  # it exists
    monkeypatch.setattr(peers, "run_infeedd_charlm",
                        lambda exe, job, r, steps, tmp: {"tokens_per_sec": tps[r], "blas": "x"})
    monkeypatch.setattr(sys, "argv", ["peers.py", "--jobs", "charlm32", "--no-keras",
                                      "--infeedd", "infeedd", "--replicas", "1,2"])
    rc = peers.main()
    out = capsys.readouterr().out
    assert len(rates) == 4
    fpt = peers.flops_per_token(peers.JOBS["charlm32"])
    best = max((1, 2), key=lambda r: tps[r])
    frac = tps[best] * fpt / (max(rates[2 * best - 2], rates[2 * best - 1]) * 1e9)
    assert f"rate beside it (the fastest row's): {frac:.0%}" in out
    every = sorted(tps[r] * fpt / (max(rates[2 * r - 2], rates[2 * r - 1]) * 1e9) for r in (1, 2))
    assert (f"every run: {every[0]:.0%}, {every[1]:.0%} (median {(every[0] + every[1]) / 2:.0%})"
            in out)
    for r in (1, 2):  # each run's line carries its own fraction
        f = tps[r] * fpt / (max(rates[2 * r - 2], rates[2 * r - 1]) * 1e9)
        assert f"R{r}/feed (round 1): " in out and f"of sgemm {f:.1%}" in out
    assert rc == (0 if frac >= 0.6 else 1)


def bench_blas():
    exe = os.environ.get("INFEEDD") or str(ROOT / "build" / "host" / "infeedd")
    b = peers.bench_blas_of(exe)
    return b if b.is_file() else None


@pytest.mark.skipif(bench_blas() is None, reason="no bench_blas beside INFEEDD")
def test_sgemm_rate_now_on_threads():
    for threads in (1, random.Random(3).randint(2, 4)):
        rate = peers.sgemm_rate_now(bench_blas(), threads)
        assert math.isfinite(rate) and rate > 0
    with pytest.raises(RuntimeError, match="--threads 0"):
        peers.sgemm_rate_now(bench_blas(), 0)


def test_steps_per_message_fit_a_message():
    for name in ("charlm8", "charlm32"):
        job = peers.JOBS[name]
        k = peers.charlm_steps_per_message(job)
        assert 1 <= k <= job["ipl"]
        assert k * job["batch"] * job["block"] * 2 * 4 <= peers.MSG_BYTES
    big = dict(peers.JOBS["charlm32"], batch=4096, block=1024)
    assert peers.charlm_steps_per_message(big) == 1


def keras_python():
    p = os.environ.get("IFD_KERAS_PYTHON") or str(ROOT / "bench" / ".venv-peers" / "bin" / "python")
    return p if os.path.isfile(p) else None


@pytest.mark.skipif(keras_python() is None, reason="no Keras environment (bench/.venv-peers)")
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_keras_model_is_the_reference(backend):
    rng = random.Random(backend)
    heads = rng.randint(1, 3)
    job = dict(layers=rng.randint(1, 2), heads=heads, width=heads * rng.randint(2, 4),
               block=rng.randint(2, 6), vocab=rng.randint(2, 12), batch=rng.randint(1, 3),
               seed=rng.randint(0, 1000))
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    out = subprocess.run([keras_python(), str(ROOT / "bench" / "keras_charlm.py"), "--check",
                          json.dumps(job)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["backend"] == backend
    assert r["loss_rel"] < 1e-5, r
    names = [n for n, _, _ in charlm_ref.param_specs(job["layers"], job["width"], job["block"],
                                                     job["vocab"])]
    assert sorted(r["grad_rel"]) == sorted(names)
    worst = max(r["grad_rel"].items(), key=lambda kv: kv[1])
    assert worst[1] < 1e-4, worst
    assert r["predict_abs"] < 1e-5, r


def infeedd_with_charlm():
    exe = os.environ.get("INFEEDD") or str(ROOT / "build" / "host" / "infeedd")
    if not os.path.isfile(exe):
        return None
    # the refusal of an unknown program names the built-in ones
    out = subprocess.run([exe, "--program", "no-such-program"], capture_output=True, text=True,
                         timeout=30)
    return exe if "charlm" in out.stdout + out.stderr else None


@pytest.mark.skipif(infeedd_with_charlm() is None, reason="no infeedd with the program charlm")
def test_infeedd_charlm_run(tmp_path):
    job = dict(peers.JOBS["charlm8"], ipl=5)
    res = peers.run_infeedd_charlm(infeedd_with_charlm(), job, 1, 10, tmp_path)
    assert res["tokens_per_sec"] > 0
    assert res["loss"] is not None and math.isfinite(res["loss"])
    assert res["loss"] < math.log(job["vocab"]) + 0.5


FAKE_INFEEDD = r"""
import json, sys, threading
sys.path[:0] = [%(e2e)r, %(client)r]
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message
from fake_daemon import FakeDaemon
from infeed import protocol as P

argv = sys.argv[1:]
f = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
t = json.loads(f["--program-config"])["block"]
b, k, steps = int(f["--batch-size"]), int(f["--max-steps-per-message"]), int(f["--steps"])
schema = [P.schema_entry("tokens", "int32", [t]), P.schema_entry("targets", "int32", [t])]


class OnListen(FakeDaemon):
    def _run(self):  # in the fake's own thread, before it polls: the endpoint and a monitor
        self.sock.bind(f["--listen"])
        self.mon = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.ready.set()
        super()._run()


OnListen.ready = threading.Event()
d = OnListen(schema=schema, batch_size=b, max_steps=k, credit=2 * k, last_step=steps // k)
print("cpu backend: BLAS fake 1.0", flush=True)
d.ready.wait()
# the producer's disconnection, once it has the BYE that last_step sends (a close sooner could
# drop the BYE)
while recv_monitor_message(d.mon)["event"] != zmq.EVENT_DISCONNECTED:
    pass
assert d._ended
d.close()
shifted, rows = True, []
for seq, n, frames in d.batches:
    tok = np.frombuffer(frames[0], np.int32).reshape(n, t)
    tgt = np.frombuffer(frames[1], np.int32).reshape(n, t)
    shifted &= bool((tok[:, 1:] == tgt[:, :-1]).all() and tok.min() >= 0 and tgt.max() < 256)
    rows.append(n)
with open(f["--summaries"], "w") as fh:
    fh.write(json.dumps({"event": "train", "loss": 1.5, "infeed_wait_fraction": 0.25}) + "\n")
with open(f["--summaries"] + ".fake.json", "w") as fh:
    json.dump({"rows": rows, "shifted": shifted, "argv": argv}, fh)
"""


@pytest.mark.parametrize("name", ["charlm8", "charlm32"])
def test_infeedd_side_with_a_fake_daemon(name, tmp_path):
    exe = tmp_path / "fake-infeedd"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_INFEEDD % {
        "e2e": str(ROOT / "tests" / "e2e"), "client": str(ROOT / "clients" / "python")})
    exe.chmod(0o755)
    job = dict(peers.JOBS[name], ipl=random.Random(name).randint(2, 6))
    k = peers.charlm_steps_per_message(job)
    steps = 3 * k
    res = peers.run_infeedd_charlm(str(exe), job, 1, steps, tmp_path)
    assert res["loss"] == 1.5 and res["wait"] == 0.25 and res["blas"] == "fake 1.0"
    assert res["tokens_per_sec"] > 0
    got = json.loads(next(tmp_path.glob("*.fake.json")).read_text())
    assert got["shifted"]
    assert len(got["rows"]) >= 3 and all(n == k * job["batch"] for n in got["rows"])
    assert json.loads(got["argv"][got["argv"].index("--program-config") + 1])["block"] == \
        job["block"]
