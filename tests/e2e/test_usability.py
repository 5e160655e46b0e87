"""What a new user meets first: config messages that name what they typed, clients that say when
no daemon answers, the README's examples, and the demo stopping when a daemon exits early."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import infeed
from conftest import ROOT, free_ports, run_infeedd

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


def test_producer_and_subscriber_say_no_daemon_answers(rng):
    (port,) = free_ports(1)
    endpoint = f"tcp://127.0.0.1:{port}"
    limit = rng.uniform(0.3, 1.0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        infeed.Producer(endpoint, name="p", schema=[("x", "float32", (3,))], timeout=None,
                        connect_timeout=limit)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "no daemon answered at " + endpoint in msg and "--listen" in msg, msg
    assert took < limit + 20, took  # it ends although the producer's own timeout is None
    # the schema from the first send: the same
    p = infeed.Producer(endpoint, timeout=None, connect_timeout=limit)
    with pytest.raises(TimeoutError, match="no daemon answered"):
        p.send(x=np.zeros((2, 3), np.float32))
    p.close()
    s = infeed.Subscriber(endpoint, connect_timeout=limit)
    with pytest.raises(TimeoutError) as e:
        next(iter(s))
    assert "no daemon answered at " + endpoint in str(e.value) and "--publish" in str(e.value)
    s.close()
    for bad in (0, -1, "10", True):
        with pytest.raises(ValueError, match="connect_timeout"):
            infeed.Subscriber(endpoint, connect_timeout=bad)


def test_connected_clients_are_not_cut_by_the_connect_timeout(daemon, rng):
    """Once the daemon answered, a short connect timeout no longer matters: a subscriber waits
    out its own timeout and a producer streams on."""
    d = daemon(features=4, classes=3, batch_size=8, steps=5, iterations_per_loop=1,
               summary_every=1)
    limit = rng.uniform(0.2, 0.4)
    s = infeed.Subscriber(d.publish, timeout=limit * 3, connect_timeout=limit)
    with pytest.raises(TimeoutError) as e:
        s.recv()  # no run yet: nothing published
    assert "no summary" in str(e.value), e.value
    got = []
    with infeed.Producer(d.listen, name="p", timeout=20, connect_timeout=limit) as p:
        time.sleep(limit * 2)
        try:
            for _ in range(50):
                p.send(x=np.zeros((8, 4), np.float32), y=np.zeros(8, np.int32))
        except infeed.RunEnded:
            pass
    s.timeout = 10
    for summary in s:
        got.append(summary)
    assert got[-1]["event"] == "end" and got[-1]["global_step"] == 5, got
    assert d.wait() == 0


def readme_python_blocks():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_producer_example_ends_cleanly(daemon, rng):
    """The README's first Python example, run as written (batches: more than --steps takes)."""
    code = readme_python_blocks()[0]
    assert "RunEnded" in code, code
    steps = rng.randint(2, 5)
    d = daemon(replicas=2, program="softmax", features=64, classes=10, batch_size=64,
               iterations_per_loop=2, steps=steps, summary_every=1)
    code = code.replace("tcp://127.0.0.1:5555", d.listen).replace("tcp://127.0.0.1:5556",
                                                                   d.publish)
    x = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    y = np.zeros(64, np.int32)
    env = {"batches": [(x, y)] * (steps * 10)}
    # the subscriber part reads until "end": run the producer part, then the subscriber's
    producer_part, subscriber_part = code.split("# a subscriber")
    sub = infeed.Subscriber(d.publish, timeout=10)
    time.sleep(0.3)
    exec(compile(producer_part, "README.md", "exec"), env)
    summaries = [s for s in sub]
    assert summaries[-1]["event"] == "end" and summaries[-1]["global_step"] == steps
    assert d.wait() == 0
    sub.close()


def help_defaults():
    """{flag: its default as --help prints it, or None for a flag without one}."""
    out = {}
    for line in run_infeedd("--help").stdout.splitlines():
        m = re.match(r"\s+(--[a-z0-9-]+)\b", line)
        if m:
            d = re.search(r"\(default: ([^)]*)\)\s*$", line)
            out[m.group(1)] = d.group(1) if d else None
    return out


def readme_defaults():
    """{flag: its default in the README's table ('' where the cell has none)}; each row lists
    its flags and as many comma-separated defaults."""
    text = (ROOT / "README.md").read_text()
    out = {}
    for row in text.splitlines():
        if not row.startswith("| `--"):
            continue
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        names = re.findall(r"`(--[a-z0-9-]+)", cells[0])
        defaults = [re.sub(r"\s*\(.*\)$", "", d.strip()).strip("`")
                    for d in cells[1].split(",")] if cells[1] else [""] * len(names)
        assert len(defaults) == len(names), f"README row {names}: defaults {defaults}"
        out.update(zip(names, defaults))
    return out


def user_dir() -> str:
    """The folder of the daemon's default control socket (core/userdir.c)."""
    run, xdg = os.environ.get("RUNTIME_DIRECTORY", ""), os.environ.get("XDG_RUNTIME_DIR", "")
    if run.startswith("/") and ":" not in run:
        return run
    return f"{xdg}/infeed" if xdg.startswith("/") else f"/tmp/infeed-{os.geteuid()}"


def same_default(readme, helped):
    readme = readme.replace("DIR", user_dir())  # the README's word for the user's folder
    if helped is None:
        return readme == ""
    if helped in ("unset", "none"):
        return readme == "none"
    try:
        return float(readme) == float(helped)
    except ValueError:
        return readme == helped


def test_readme_flag_table_matches_help():
    """Every flag of infeedd --help is in the README's table with the default --help prints
    (and no flag the daemon does not have)."""
    helped = help_defaults()
    assert {"--initial-global-step", "--predictions", "--help", "--version"} <= set(helped)
    listed = readme_defaults()
    assert sorted(set(helped) - set(listed)) == [], "the README's flag table lacks them"
    assert sorted(set(listed) - set(helped)) == [], "the README lists flags infeedd lacks"
    wrong = {f: (listed[f], helped[f]) for f in helped if not same_default(listed[f], helped[f])}
    assert not wrong, f"README default vs --help default: {wrong}"


def test_readme_links_exist():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README.md links to {target}, which is not here"
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:  # the design note is not here
        assert "ARCHITECTURE.md" not in doc.read_text(), doc


def run_demo(tmp_path, *args, timeout=240):
    from conftest import infeedd_path

    exe = infeedd_path()
    if exe is None:
        pytest.skip("infeedd is not built (set INFEEDD)")
    import os

    env = dict(os.environ, INFEEDD=exe, DEMO_OUT=str(tmp_path))
    t0 = time.monotonic()
    r = subprocess.run([str(ROOT / "demo.sh"), *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    return r, time.monotonic() - t0


def test_demo_trains_evaluates_and_predicts_an_mlp(tmp_path):
    """The model flags given to the demo reach the eval and predict daemons too (they load the
    training run's mlp checkpoint)."""
    r, _ = run_demo(tmp_path, "--program", "mlp", "--hidden", "32", "--steps", "200")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert re.search(r"eval: global step 200, loss [0-9.]+, held-out accuracy", out), out
    assert "predict: 5 batches, 297 predictions" in out, out
    png = tmp_path / "demo-run.png"
    assert f"== plot: loss, accuracy, examples/s and infeed wait against the step: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ends = [json.loads(line) for line in (tmp_path / "demo-summaries.jsonl").open()
            if '"end"' in line]
    assert [(e["mode"], e["status"]) for e in ends] == [("train", "ok"), ("eval", "ok"),
                                                        ("predict", "ok")], ends


def test_demo_stops_at_once_when_the_daemon_exits_early(tmp_path):
    r, took = run_demo(tmp_path, "--watchdog", "-1")  # the training daemon refuses its flags
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "--watchdog" in out and "infeedd exited with status 2 before the producer" in out, out
    assert "no daemon answered" not in out, out  # it did not wait for the producer to give up
    assert took < 9, f"the demo took {took:.1f} s to notice"


def test_readme_c_snippets_compile(tmp_path):
    """Each C block of the README compiles as the body of main() (declared variables, real
    functions and fields)."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    blocks = re.findall(r"```c\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        lines = block.splitlines()
        includes = [line for line in lines if line.startswith("#include")]
        body = [line for line in lines if not line.startswith("#include")]
        src = tmp_path / f"readme{i}.c"
        src.write_text("\n".join(["#include <stdio.h>", "#include <infeed/infeed.h>",
                                  "#include <infeed/client.h>", *includes, "int main(void)",
                                  "{", *body, "    return 0;", "}", ""]))
        r = subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-Wno-unused-variable",
                            "-Wno-unused-but-set-variable", f"-I{ROOT / 'include'}", "-c",
                            str(src), "-o", str(tmp_path / f"readme{i}.o")],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"README C block {i}:\n{src.read_text()}\n{r.stderr}"
