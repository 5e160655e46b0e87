"""The command line: --help, --version, and usage or config errors (exit 2, naming the key)."""

import json
import os
import re

import numpy as np
import pytest

import infeed
from conftest import ROOT, run_infeedd
from helpers import gpu_visible, wait_until

ISSUE_FLAGS = """--config --listen --publish --control --summaries --backend --replicas --program
--features --classes --mode --input-mode --batch-size --iterations-per-loop --steps --last-step
--optimizer --learning-rate --loss-reduction --summary-every --seed --credit --log-level --help
--version""".split()

# docs/config.md keys whose flag is not the key's last component with '_' -> '-'
RENAMED = {"num_steps": "steps", "optimizer.kind": "optimizer",
           "initial_infeed_sleep_secs": "initial_infeed_sleep", "watchdog_secs": "watchdog",
           "loop_kind": "iterations_per_loop", "loop_secs": "iterations_per_loop",
           "max_loop_secs": "max_loop_seconds",
           "host_calls": "host_call"}  # one tensor a flag: --host-call NAME=SPEC


def config_md_flags() -> set:
    text = (ROOT / "docs" / "config.md").read_text().split("## Programs")[0]
    keys = []
    for line in text.splitlines():
        m = re.match(r"\|\s*(`[^|]+)\|", line)
        if m:
            keys += re.findall(r"`([a-z0-9_.]+)`", m.group(1))
    flags = set()
    for k in keys:
        if k in RENAMED:
            k = RENAMED[k]
        elif "." in k:
            k = k.split(".")[-1]
        flags.add("--" + k.replace("_", "-"))
    return flags


def test_summaries_md_lists_every_error_source():
    """Every source the runtime records a run's error under (the `<source>: ` of the end
    summary's `error`) is listed in docs/summaries.md (`abort` was not)."""
    row = next(ln for ln in (ROOT / "docs" / "summaries.md").read_text().splitlines()
               if ln.startswith("| `error` |"))
    listed = set(re.findall(r"`([^`]+)`", row))
    found = set()
    for d in ("loop", "intake", "outfeed", "hooks", "device"):
        for f in (ROOT / d).rglob("*.c*"):
            text = f.read_text()
            found |= set(re.findall(r'ifd_rendezvous_(?:record_)?error\([^,]+, "([^"]+)"', text))
            found |= set(re.findall(r'#define SOURCE "([^"]+)"', text))
            found |= set(re.findall(r'ifd_replicas_fail\([^,]+, "([^"]+)"', text))
    # the two sources made with snprintf
    assert '"replica %d"' in (ROOT / "device/replicas.c").read_text()
    assert '"hook %s"' in (ROOT / "loop/session_run.c").read_text()
    found |= {"replica N", "hook NAME"}
    assert {"abort", "session", "infeed"} <= found, found  # the scan still finds them
    assert not found - listed, f"docs/summaries.md lacks the sources {sorted(found - listed)}"


def test_a_setting_not_set_says_so(tmp_path, rng):
    """A program setting left out is "not set" (it said "got 0"); one given as 0 or below says
    what arrived, from a flag or from the file."""
    base = {"mlp": ["--program", "mlp", "--features", "4", "--classes", "3", "--hidden", "8"],
            "softmax": ["--program", "softmax", "--features", "4", "--classes", "3"]}
    program = rng.choice(sorted(base))
    key = rng.choice(["features", "classes"] + (["hidden"] if program == "mlp" else []))
    low = 2 if key == "classes" else 1
    i = base[program].index(f"--{key}")
    without = base[program][:i] + base[program][i + 2:]
    r = run_infeedd(*without, "--steps", "1")
    want = f"infeedd: program '{program}': --{key} must be between {low} and 1048576"
    assert r.returncode == 2 and r.stderr.strip() == want + ", and it is not set", r.stderr
    for v in (0, -rng.randint(1, 9)):
        r = run_infeedd(*without, "--steps", "1", f"--{key}", str(v))
        assert r.returncode == 2 and r.stderr.strip() == f"{want}, got {v}", r.stderr
    cfg = write(tmp_path, json.dumps({key: 0}))
    r = run_infeedd("--config", cfg, *without, "--steps", "1")
    assert r.returncode == 2 and r.stderr.strip().endswith(
        f"setting '{key}' must be between {low} and 1048576, got 0"), r.stderr


def usage_error(*args, key):
    r = run_infeedd(*args)
    out = r.stdout + r.stderr
    assert r.returncode == 2, f"{args}: exit {r.returncode}, expected 2:\n{out}"
    assert key in out or key.replace("_", "-") in out, \
        f"{args}: the output does not name {key!r}:\n{out}"
    assert "Traceback" not in out and len(out) < 4000
    return out


def test_help_lists_every_flag():
    r = run_infeedd("--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    listed = set(re.findall(r"--[a-z][a-z0-9-]*", out))
    missing = [f for f in ISSUE_FLAGS if f not in listed]
    assert not missing, f"--help lacks {missing}:\n{out}"
    doc_flags = config_md_flags()
    assert {"--batch-size", "--steps", "--momentum", "--features"} <= doc_flags  # parsed right
    missing = sorted(doc_flags - listed)
    assert not missing, f"--help lacks the docs/config.md keys {missing}:\n{out}"


def test_version():
    r = run_infeedd("--version")
    assert r.returncode == 0, r.stderr
    cmake = (ROOT / "CMakeLists.txt").read_text()
    version = re.search(r"project\(infeed VERSION ([0-9.]+)", cmake).group(1)
    assert version in r.stdout, r.stdout


@pytest.mark.parametrize("args,key", [
    (["--bogus"], "--bogus"),
    (["--replicas"], "--replicas"),                     # a flag without its value
    (["--replicas", "0"], "replicas"),
    (["--replicas", "two"], "replicas"),
    (["--mode", "infer"], "infer"),
    (["--predictions", "p.jsonl"], "predictions"),       # only in predict mode
    (["--input-mode", "per-chip"], "per-chip"),
    (["--optimizer", "foo"], "foo"),
    (["--loss-reduction", "median"], "median"),
    (["--batch-size", "10", "--replicas", "3"], "batch_size"),
    (["--learning-rate", "-1"], "learning_rate"),
    (["--program", "nosuch"], "nosuch"),
    (["--steps", "10", "--last-step", "20"], "last_step"),
    (["--log-level", "loud"], "loud"),
    (["--program", "mlp"], "hidden"),                   # mlp without its hidden width
    (["--program", "mlp", "--hidden", "0"], "hidden"),
    (["--watchdog", "-1"], "watchdog"),
    (["--watchdog", "soon"], "--watchdog"),
    (["--initial-infeed-sleep", "1e9"], "initial_infeed_sleep"),
    (["--max-steps-per-message", "0"], "max_steps_per_message"),
    (["--max-steps-per-message", "8", "--credit", "4"], "max_steps_per_message (8)"),
    (["--replica-threads", "-1"], "replica_threads"),
    (["--replica-threads", "1025"], "replica_threads"),
    (["--replica-threads", "many"], "--replica-threads"),
    (["--shm", "maybe"], "--shm"),
])
def test_flag_errors(args, key):
    base = ["--features", "4", "--classes", "3", "--steps", "10"]
    out = usage_error(*base, *args, key=key)
    if args[0] == "--optimizer":
        for allowed in ("sgd", "momentum", "adam"):
            assert allowed in out, out
    if args[0] == "--mode":
        assert "eval" in out
    if args[0] == "--input-mode":
        for allowed in ("per-host", "per-host-v2", "per-core", "broadcast"):
            assert allowed in out, out


def write(tmp_path, text):
    p = tmp_path / "infeedd.json"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,key", [
    ('{"replicas": 2, "bogus_key": 1}', "bogus_key"),
    ('{"replicas": "two"}', "replicas"),
    ('{"features": 4, "classes": 3, "optimizer": "foo"}', "optimizer"),
    ('{"replicas": 2,\n  "steps": }\n', "infeedd.json"),  # and where: line 2, a column
    (None, "missing.json"),  # no file
    ("[1, 2]", "object"),
])
def test_config_file_errors(tmp_path, text, key):
    path = write(tmp_path, text) if text is not None else str(tmp_path / "missing.json")
    out = usage_error("--config", path, key=key)
    if key == "infeedd.json":
        assert re.search(r"line 2\b", out) and "column" in out, out


@pytest.mark.parametrize("args,flag,words", [
    (["--batch-size", str(1 << 62)], "--batch-size", [str(1 << 62)]),
    (["--seed", " -1"], "--seed", []),
    (["--max-producers", "0", "--expect-producers", "1"], "--max-producers", []),
])
def test_config_edges(args, flag, words):
    """Config values that used to overflow or be misread (found by fuzzing) get exit 2 and a
    sentence naming the key."""
    r = run_infeedd("--steps", "1", "--features", "4", "--classes", "3", *args)
    assert r.returncode == 2 and flag in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_config_file_then_flags(daemon, tmp_path):
    """Defaults, then the file, then the flags: a flag overrides the file."""
    cfg = write(tmp_path, json.dumps({"replicas": 3, "batch_size": 10, "features": 5,
                                      "classes": 4, "iterations_per_loop": 2, "steps": 3,
                                      "summary_every": 0, "credit": 3}))
    usage_error("--config", cfg, key="batch_size")  # 10 rows over 3 replicas
    d = daemon(config=cfg, replicas=2)
    p = infeed.Producer(d.listen, schema=[("x", "float32", (5,)), ("y", "int32", ())], timeout=10)
    w = p.welcome
    assert (w["replicas"], w["batch_size"], w["credit"]) == (2, 10, 3), w
    try:
        for _ in range(10):
            p.send(x=np.zeros((10, 5), np.float32), y=np.zeros(10, np.int32))
    except infeed.RunEnded:
        pass
    assert p.end()["global_step"] == 3
    p.close()
    assert d.wait() == 0


def team_threads(pid: int) -> list[str]:
    """The names of a process's team helpers ("ifd-replica<r>+<i>")."""
    names = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(open(f"/proc/{pid}/task/{t}/comm").read().strip())
        except OSError:
            pass
    return sorted(n for n in names if n.startswith("ifd-replica") and "+" in n)


def test_replica_threads_form_teams_that_train_the_same_bits(daemon, rng):
    """--replica-threads N gives each replica N - 1 helper threads (named ifd-replica<r>+<i>;
    the backend logs the count at debug level), and without the flag a replica gets the CPUs
    over the replicas. Products large enough to split are shared by the team: a run is
    repeatable bit for bit, and its losses agree with one thread a replica's (to rounding:
    OpenBLAS may pick another kernel for a block than for the whole product)."""
    replicas = rng.randint(1, 2)
    n = rng.randint(2, 4)
    auto = min(8, max(1, len(os.sched_getaffinity(0)) // replicas))
    f, batch = rng.randint(600, 800), 32 * replicas * rng.randint(1, 2)  # >= 1M MACs a product
    flags = dict(program="mlp", features=f, hidden=128, classes=10, batch_size=batch,
                 replicas=replicas, steps=rng.randint(4, 8), log_level="debug", summary_every=1)
    nprng = np.random.default_rng(rng.randrange(1 << 30))
    x = nprng.standard_normal((flags["steps"] * batch, f), dtype=np.float32)
    y = nprng.integers(0, 10, flags["steps"] * batch).astype(np.int32)
    losses = []
    for threads in (n, n, 1, None):
        env_had = os.environ.pop("OPENBLAS_NUM_THREADS", None)
        try:
            extra = {} if threads is None else dict(replica_threads=threads)
            d = daemon(**flags, **extra)
        finally:
            if env_had is not None:
                os.environ["OPENBLAS_NUM_THREADS"] = env_had
        want = auto if threads is None else threads
        named = sorted(f"ifd-replica{r}+{i}" for r in range(replicas) for i in range(1, want))
        # each helper names itself once it runs: wait for the names, not for the daemon's start
        wait_until(lambda: team_threads(d.proc.pid) == named,
                   f"team helpers {named} (threads {threads}): {team_threads(d.proc.pid)}", d)
        p = infeed.Producer(d.listen, timeout=30)
        try:
            for s in range(flags["steps"]):
                p.send(x=x[s * batch:(s + 1) * batch], y=y[s * batch:(s + 1) * batch])
        except infeed.RunEnded:
            pass
        p.end()
        p.close()
        assert d.wait() == 0
        line = f"runs its large products on {want} thread{'s' if want != 1 else ''}"
        assert line in d.log(), (threads, d.log()[-2000:])
        losses.append([s["loss"] for s in d.summaries() if s["event"] == "train"])
        assert len(losses[-1]) == flags["steps"], losses
    assert losses[0] == losses[1], losses  # the same team twice: the same bits
    for other in losses[2:]:
        assert other == pytest.approx(losses[0], rel=1e-4), losses


def test_cuda_backend_without_gpu(tmp_path):
    """--backend cuda where there is no usable GPU (or the backend is not built): exit 1 with one
    clear line naming the cuda backend and why, never a crash; the summaries file gets nothing."""
    if gpu_visible():
        pytest.skip("this machine has a GPU: the error path is not reachable")
    from conftest import free_ports

    lp, pp, cp = free_ports(3)
    summaries = tmp_path / "s.jsonl"
    r = run_infeedd("--backend", "cuda", "--features", "4", "--classes", "3", "--steps", "10",
                    "--listen", f"tcp://127.0.0.1:{lp}", "--publish", f"tcp://127.0.0.1:{pp}",
                    "--control", f"tcp://127.0.0.1:{cp}", "--summaries", str(summaries),
                    "--log-level", "error")
    out = r.stdout + r.stderr
    assert r.returncode == 1, f"exit {r.returncode}, expected 1:\n{out}"
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{r.stderr}"
    line = lines[0]
    assert line.startswith("infeedd: ") and "cuda" in line, line
    # built: "cuda backend: no usable GPU: cudaGetDeviceCount: <reason>"; not built: says so
    assert ("no usable GPU" in line and "cudaGetDeviceCount" in line) or "not built" in line, line


# ---- config messages name what the user typed (a flag or a file key) --------------------------


BASE = ["--features", "4", "--classes", "3"]


def error_line(*args):
    r = run_infeedd(*args)
    assert r.returncode == 2, f"{args}: exit {r.returncode}:\n{r.stdout}{r.stderr}"
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("args,want,not_want", [
    (["--steps", "5", "--last-step", "9"], "--steps and --last-step: expected exactly one",
     "last_step"),
    ([], "--steps and --last-step: expected exactly one of them, got neither", "last_step"),
    (["--steps", "5", "--batch-size", "10", "--replicas", "3"], "--batch-size: 10 is not "
     "divisible", "batch_size"),
    (["--steps", "5", "--max-abs-input", "2", "--check-finite", "off"],
     "--max-abs-input: expected --check-finite on", "check_finite"),
    (["--steps", "5", "--program", "mlp"], "program 'mlp': --hidden must be", "setting 'hidden'"),
    (["--steps", "5", "--initial-infeed-sleep", "1e9"], "--initial-infeed-sleep:",
     "initial_infeed_sleep"),
])
def test_config_messages_name_the_flags_typed(args, want, not_want):
    line = error_line(*BASE, *args)
    assert want in line and not_want not in line, line


def test_config_messages_name_the_file_keys_given_there(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"features": 4, "classes": 3, "steps": 5, "last_step": 9}))
    line = error_line("--config", str(cfg))
    assert "steps and last_step: expected exactly one" in line and "--" not in line, line
    # a flag over a file key: each named as the user gave it
    line = error_line("--config", str(cfg), "--last-step", "12")
    assert "steps and --last-step: expected exactly one" in line, line


def test_later_config_errors_name_the_flags_too(tmp_path):
    """Errors found after the validation pass (checkpoints, key files) follow the same rule;
    a quoted path that holds a key's name stays as it is."""
    missing = tmp_path / "checkpoint_dir"
    line = error_line(*BASE, "--mode", "eval", "--steps", "2", "--checkpoint-dir", str(missing))
    assert line.startswith("infeedd: --checkpoint-dir: ") and f"'{missing}'" in line, line
    line = error_line(*BASE, "--steps", "2", "--curve-secret-key", str(tmp_path / "admin_keys"),
                      "--authorized-keys", str(tmp_path / "authorized_keys"))
    assert line.startswith("infeedd: --curve-secret-key: ") and "/admin_keys'" in line, line
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"features": 4, "classes": 3, "steps": 2, "mode": "eval",
                               "checkpoint_dir": str(missing)}))
    line = error_line("--config", str(cfg))
    assert line.startswith("infeedd: checkpoint_dir: "), line
