"""The README as written: its Python producer example runs and ends cleanly, its flag table
matches infeedd --help (flags and defaults), its links exist, and its C snippets compile."""

import os
import re
import subprocess
import threading

import numpy as np
import pytest

import infeed
from conftest import ROOT, run_infeedd
from helpers import subscribed, wait_until


def readme_python_blocks():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_host_call_example(daemon, rng):
    """The README's host call in Python, run as written against a daemon: a line a step with that
    step's accuracy and mean confidence, the accuracy the step's summary reports."""
    code = next(b for b in readme_python_blocks() if "host_call" in b)
    assert len(code.strip().splitlines()) == 5, code
    steps = rng.randint(2, 8)
    d = daemon(program="softmax", features=4, classes=3, batch_size=8, steps=steps,
               iterations_per_loop=rng.randint(1, 3), summary_every=1)
    printed = []
    env = {"print": printed.append}
    t = threading.Thread(target=exec, daemon=True, args=(
        compile(code.replace("tcp://127.0.0.1:5556", d.publish), "README.md", "exec"), env))
    t.start()
    wait_until(lambda: d.control({"cmd": "status"})["tensor_messages"]["subscribed"] == 3,
               "the README's subscriber asks for its tensors", d)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    with infeed.Producer(d.listen, name="readme", timeout=20) as p:
        try:
            while True:
                p.send(x=nrng.standard_normal((8, 4)).astype(np.float32),
                       y=nrng.integers(0, 3, 8, dtype=np.int32))
        except infeed.RunEnded:
            pass
    assert d.wait() == 0, d.log()
    t.join(30)
    assert not t.is_alive()
    train = {s["global_step"]: s for s in d.summaries() if s["event"] == "train"}
    assert [int(line.split()[1].rstrip(":")) for line in printed] == list(range(1, steps + 1))
    for line in printed:
        step, acc = int(line.split()[1].rstrip(":")), float(line.split()[3].rstrip(","))
        assert acc == pytest.approx(train[step]["accuracy"], abs=1e-3), (line, train[step])


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
    sub = subscribed(infeed.Subscriber(d.publish, timeout=10))
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
