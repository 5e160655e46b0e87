"""The model out of a run (docs/checkpoint.md, "Loading and exporting"): infeed.checkpoint.load
reads the daemon's checkpoints into numpy, as strictly as the daemon's loader (each damaged file
and each bad header key refused by both, with a sentence naming the file, the field, what was
expected and what was found), picks a folder's checkpoint as --resume does; python -m
infeed.export writes the parameters as .npz and safetensors; the doc's numpy forward pass of the
exported MLP reproduces the daemon's predictions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest

import ckpt
import infeed
import infeed.export
from conftest import ROOT, infeedd_path
from helpers import teacher_data

EXPORT = [sys.executable, "-m", "infeed.export"]


def run_export(*args, pre: str = "") -> subprocess.CompletedProcess:
    """python -m infeed.export ARGS; pre: Python run first in the same interpreter."""
    argv = EXPORT + [str(a) for a in args]
    if pre:
        argv = [sys.executable, "-c", f"{pre}\nimport sys\nfrom infeed.export import main\n"
                f"sys.exit(main({[str(a) for a in args]!r}))"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "clients" / "python"), env.get("PYTHONPATH")) if p)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def doc_forward_pass(npz) -> callable:
    """predict(x) as docs/checkpoint.md's numpy forward pass of the exported MLP defines it, run
    as written with its file name replaced by npz."""
    text = (ROOT / "docs" / "checkpoint.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def predict(" in b]
    assert len(blocks) == 1, blocks
    code = blocks[0].replace('"model.npz"', repr(str(npz)))
    assert repr(str(npz)) in code, code
    env: dict = {}
    exec(compile(code, "docs/checkpoint.md", "exec"), env)
    return env["predict"]


def mlp_shapes(features: int, hidden: int, classes: int) -> list:
    """device/programs/mlp.c's parameters, in vector order."""
    return [("W1", [features, hidden]), ("b1", [hidden]), ("W2", [hidden, classes]),
            ("b2", [classes])]


# ---- a trained mlp: load, export, and the doc's forward pass against predict mode -------------

def train_mlp(daemon, tmp_path, rng) -> dict:
    """A short mlp run of random sizes, replicas and optimizer, checkpointed in tmp_path/ck."""
    run = {"features": rng.randint(2, 9), "hidden": rng.randint(1, 12),
           "classes": rng.randint(2, 6), "replicas": rng.randint(1, 3),
           "optimizer": rng.choice(["sgd", "momentum", "adam"]), "steps": rng.randint(3, 12)}
    run["batch"] = run["replicas"] * rng.randint(1, 8)
    run["folder"] = tmp_path / "ck"
    d = daemon(program="mlp", replicas=run["replicas"], batch_size=run["batch"],
               features=run["features"], hidden=run["hidden"], classes=run["classes"],
               optimizer=run["optimizer"], learning_rate=0.05, steps=run["steps"],
               iterations_per_loop=rng.randint(1, 5), checkpoint_dir=str(run["folder"]),
               checkpoint_every=rng.randint(1, run["steps"]))
    x, y = teacher_data(rng.randrange(1 << 30), run["steps"], run["batch"], run["features"],
                        run["classes"])
    with infeed.Producer(d.listen, name="trainer", timeout=20) as p:
        for i in range(run["steps"]):
            s = slice(i * run["batch"], (i + 1) * run["batch"])
            p.send(x=x[s], y=y[s])
    assert d.wait() == 0, d.log()
    return run


def test_exported_mlp_reproduces_the_daemons_predictions(daemon, tmp_path, rng):
    run = train_mlp(daemon, tmp_path, rng)
    f, h, k = run["features"], run["hidden"], run["classes"]
    ck = infeed.checkpoint.load(run["folder"])
    newest = ckpt.files(run["folder"])[-1]
    assert ck.path == str(newest) and ck.skipped == ()
    assert (ck.program, ck.settings) == ("mlp", {"features": f, "classes": k, "hidden": h}), ck
    assert ck.global_step == ck.opt_step == run["steps"], ck
    assert ck.producers == {"trainer": run["steps"] - 1} and ck.hosts == 1, ck.producers
    assert ck.host_producers == [ck.producers]
    assert ck.optimizer["kind"] == run["optimizer"] and ck.optimizer["learning_rate"] == \
        pytest.approx(0.05), ck.optimizer
    assert [(s["name"], s["shape"]) for s in ck.param_specs] == mlp_shapes(f, h, k)
    assert {n: a.shape for n, a in ck.params.items()} == \
        {n: tuple(s) for n, s in mlp_shapes(f, h, k)}
    assert all(a.dtype == np.float32 for a in ck.params.values())
    assert list(ck.slots) == list(ckpt.SLOTS[run["optimizer"]])
    # the arrays are the file's floats, in the header's order (read here by offset, not by load)
    data = newest.read_bytes()
    hlen = int.from_bytes(data[12:16], "little")
    n = sum(int(np.prod(s)) for _, s in mlp_shapes(f, h, k))
    raw = np.frombuffer(data, "<f4", count=n * (1 + len(ck.slots)), offset=16 + hlen)
    at = 0
    for name, shape in mlp_shapes(f, h, k):
        size = int(np.prod(shape))
        assert np.array_equal(ck.params[name].ravel(), raw[at:at + size]), name
        for i, slot in enumerate(ck.slots.values()):
            assert np.array_equal(slot[name].ravel(), raw[(i + 1) * n + at:][:size]), name
        at += size
    assert ck.params["b1"].any() and ck.params["b2"].any(), "the biases start at 0: it trained"

    npz, st = tmp_path / "model.npz", tmp_path / "model.safetensors"
    r = run_export(run["folder"], "--npz", npz, "--safetensors", st)
    assert r.returncode == 0, r.stderr
    assert f"4 parameters of 'mlp' at global step {run['steps']}" in r.stdout, r.stdout
    with np.load(npz) as z:
        assert sorted(z.files) == sorted(ck.params)
        for name, a in ck.params.items():
            assert z[name].dtype == np.float32 and np.array_equal(z[name], a), name
    safetensors = pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    got = load_file(str(st))
    assert sorted(got) == sorted(ck.params)
    for name, a in ck.params.items():
        assert got[name].dtype == np.float32 and np.array_equal(got[name], a), name
    with safetensors.safe_open(str(st), framework="np") as sf:
        meta = sf.metadata()
    assert meta["program"] == "mlp" and meta["global_step"] == str(run["steps"]), meta
    assert json.loads(meta["settings"]) == ck.settings and meta["checkpoint"] == newest.name

    # predict mode on the same checkpoint, random rows in random batches (a partial last one)
    replicas = rng.randint(1, 3)
    batch = replicas * rng.randint(1, 16)
    d = daemon(mode="predict", program="mlp", replicas=replicas, batch_size=batch, features=f,
               hidden=h, classes=k, steps=0, checkpoint_dir=str(run["folder"]),
               iterations_per_loop=rng.randint(1, 6))
    rows = rng.randint(1, 12 * batch)
    x = np.random.default_rng(rng.randrange(1 << 30)).standard_normal((rows, f)).astype(
        np.float32)
    with infeed.Producer(d.listen, name="scorer", timeout=20) as p:
        for i in range(0, rows, batch):
            p.send(x=x[i:i + batch])
        got = list(p.predictions())
    assert d.wait() == 0, d.log()
    probs = np.concatenate([a["probabilities"] for _, a in got])
    classes = np.concatenate([a["classes"] for _, a in got])
    want = doc_forward_pass(npz)(x)
    assert probs.shape == want.shape == (rows, k)
    np.testing.assert_allclose(probs, want, rtol=0, atol=1e-5)
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-5  # a near tie may go either way in float32
    assert (classes[clear] == want.argmax(axis=1)[clear]).all()


# ---- damaged files and bad headers: refused as the daemon refuses them --------------------------

def valid_file(tmp_path, rng, name="good.ifdckpt"):
    """A random mlp checkpoint written by ckpt.write: (path, its header, params, slots)."""
    f, h, k = rng.randint(1, 6), rng.randint(1, 6), rng.randint(2, 5)
    opt = rng.choice(["sgd", "momentum", "adam"])
    head = ckpt.header("mlp", {"features": f, "hidden": h, "classes": k}, mlp_shapes(f, h, k),
                       rng.randint(0, 10 ** 6), {"loader-0": rng.randint(0, 10 ** 6)}, opt)
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    params = nrng.standard_normal(head["nparam_floats"]).astype(np.float32)
    slots = nrng.standard_normal((len(ckpt.SLOTS[opt]), params.size)).astype(np.float32)
    path = tmp_path / name
    ckpt.write(path, head, params, slots)
    return path, head, params, slots


def daemon_loads(path) -> tuple:
    """(whether infeedd's loader takes the file, its sentence): a predict run of another program
    (linear) that exits 2 either way: a checkpoint that loads fails the fit check instead."""
    exe = infeedd_path()
    if exe is None:
        pytest.skip("infeedd is not built (set INFEEDD)")
    r = subprocess.run([exe, "--mode", "predict", "--program", "linear", "--features", "1",
                        "--classes", "1", "--checkpoint", str(path), "--listen",
                        "tcp://127.0.0.1:*", "--publish", "tcp://127.0.0.1:*", "--control",
                        "tcp://127.0.0.1:*"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 2, f"{path}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    refused = f"checkpoint '{path}':" in r.stderr
    assert refused or "checkpoint: program: the checkpoint is of" in r.stderr, r.stderr
    return not refused, r.stderr.strip()


def client_loads(path) -> tuple:
    """(whether infeed.checkpoint.load takes the file, the checkpoint or the error)."""
    try:
        c = infeed.checkpoint.load(path)
    except infeed.CheckpointError as e:
        assert e.code == "EPROTO" and e.path == str(path), e
        assert str(e).startswith(f"checkpoint '{path}': {e.field}: expected {e.expected}, got "
                                 f"{e.found}"), e
        return False, e
    return True, c


def test_a_truncated_file_is_refused(tmp_path, rng):
    path, _, _, _ = valid_file(tmp_path, rng)
    data = path.read_bytes()
    hlen = int.from_bytes(data[12:16], "little")
    # below the preamble, inside the header, inside the floats, the CRC's last byte missing
    for cut in {rng.randrange(0, 20), rng.randrange(20, 20 + hlen), rng.randrange(20 + hlen,
                len(data)), len(data) - 1}:
        p = tmp_path / f"cut{cut}.ifdckpt"
        p.write_bytes(data[:cut])
        with pytest.raises(infeed.CheckpointError) as e:
            infeed.checkpoint.load(p)
        ctx = f"cut to {cut} of {len(data)}: {e.value}"
        assert e.value.code == "EPROTO" and e.value.field == "size", ctx
        assert e.value.found == f"{cut} bytes" and str(p) in str(e.value), ctx
        want = 20 if cut < 20 else 20 + hlen if cut < 20 + hlen else len(data)
        assert e.value.expected.startswith(f"{'at least ' if cut < 20 + hlen else ''}{want} "
                                           "bytes"), ctx
        assert "truncated" in str(e.value), ctx
        loads, sentence = daemon_loads(p)
        assert not loads and "truncated" in sentence, f"{ctx}\n{sentence}"
    p = tmp_path / "longer.ifdckpt"
    p.write_bytes(data + bytes(rng.randint(1, 9)))
    with pytest.raises(infeed.CheckpointError, match="trailing bytes") as e:
        infeed.checkpoint.load(p)
    assert e.value.field == "size" and e.value.expected.startswith(f"{len(data)} bytes")


def test_a_wrong_magic_version_or_header_length_is_refused(tmp_path, rng):
    path, _, _, _ = valid_file(tmp_path, rng)
    data = bytearray(path.read_bytes())
    while bytes(data[:8]) == ckpt.MAGIC:
        data[rng.randrange(8)] = rng.randrange(256)
    path.write_bytes(bytes(data))
    with pytest.raises(infeed.CheckpointError) as e:
        infeed.checkpoint.load(path)
    assert e.value.field == "magic" and "IFDCKPT" in e.value.expected, e.value
    assert e.value.found == '"' + "".join(f"\\x{b:02x}" for b in data[:8]) + '"', e.value
    loads, sentence = daemon_loads(path)
    assert not loads and sentence == f"infeedd: {e.value}", sentence  # word for word
    # another version
    data[:8] = ckpt.MAGIC
    data[8:12] = rng.randint(2, 1 << 31).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(infeed.CheckpointError) as e:
        infeed.checkpoint.load(path)
    assert e.value.field == "version" and e.value.expected == "1", e.value
    assert e.value.found == str(int.from_bytes(data[8:12], "little")), e.value
    assert not daemon_loads(path)[0]
    # a header length over 16 MiB
    data[8:12] = (1).to_bytes(4, "little")
    data[12:16] = rng.randint((16 << 20) + 1, (1 << 32) - 1).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(infeed.CheckpointError) as e:
        infeed.checkpoint.load(path)
    assert e.value.field == "header length" and e.value.expected == \
        f"at most {16 << 20} bytes of JSON", e.value
    assert e.value.found == str(int.from_bytes(data[12:16], "little")), e.value
    assert not daemon_loads(path)[0]


def test_a_flipped_byte_is_refused(tmp_path, rng):
    path, _, _, _ = valid_file(tmp_path, rng)
    data = path.read_bytes()
    hlen = int.from_bytes(data[12:16], "little")
    for trial in range(6):
        b = bytearray(data)
        # the first trials change a float or the CRC (the checksum tells), the others any byte
        at = rng.randrange(16 + hlen if trial < 3 else 0, len(b))
        b[at] ^= rng.randrange(1, 256)
        p = tmp_path / f"flip{trial}.ifdckpt"
        p.write_bytes(bytes(b))
        ok, e = client_loads(p)
        loads, sentence = daemon_loads(p)
        ctx = f"byte {at} of {len(b)} changed: {e}\n{sentence}"
        assert not ok and not loads, ctx
        if trial < 3:
            assert e.field == "checksum" and "checksum" in sentence, ctx
            stored = int.from_bytes(b[-4:], "little")
            assert e.expected.startswith(f"{stored:08x}"), ctx
            assert e.found == f"{zlib.crc32(bytes(b[:-4])):08x}", ctx
            assert "the file is corrupt" in str(e), ctx
        else:
            assert any(w in sentence for w in ckpt.PROBLEMS), ctx


def mutations(head: dict) -> list:
    """(what, header dict or raw JSON bytes, whether the daemon's loader takes it)."""
    def m(fn):
        h = json.loads(json.dumps(head))
        fn(h)
        return h

    def setp(key, value):
        return lambda h: h.__setitem__(key, value)

    text = json.dumps(head, sort_keys=True)
    name = head["params"][0]["name"]
    out = [
        ("as written", head, True),
        ("an unknown key", m(setp("note", [1, {"x": None}])), True),
        ("two hosts", m(lambda h: h.update(hosts=2, host_producers=[{}, {"a": 3}],
                                           producers={})), True),
        ("no program", m(lambda h: h.pop("program")), False),
        ("an empty program", m(setp("program", "")), False),
        ("a 64-byte program", m(setp("program", "p" * 64)), False),
        ("settings a list", m(setp("settings", [1])), False),
        ("features -1", m(lambda h: h["settings"].update(features=-1)), False),
        ("hidden 2^40 + 1", m(lambda h: h["settings"].update(hidden=(1 << 40) + 1)), False),
        ("classes a real", m(lambda h: h["settings"].update(classes=2.0)), False),
        ("features a boolean", m(lambda h: h["settings"].update(features=True)), False),
        ("program settings", m(lambda h: h["settings"].update(program_config={"layers": 2})),
         True),
        ("program settings a list", m(lambda h: h["settings"].update(program_config=[2])), False),
        ("slots wrong", m(lambda h: h["optimizer"].update(slots=h["optimizer"]["slots"] + 1)),
         False),
        ("a learning rate as text", m(lambda h: h["optimizer"].update(learning_rate="0.1")),
         False),
        ("no epsilon", m(lambda h: h["optimizer"].pop("epsilon")), False),
        ("global step -1", m(setp("global_step", -1)), False),
        ("opt_step null", m(setp("opt_step", None)), False),
        ("an offset off by one", m(lambda h: h["params"][1].update(offset=1 + h["params"][1][
            "offset"])), False),
        ("a count off by one", m(lambda h: h["params"][-1].update(count=h["params"][-1]["count"]
                                                                  + 1)), False),
        ("a 32-byte name", m(lambda h: h["params"][0].update(name="n" * 32)), False),
        # ranks up to 4 (program ABI 4): the same one float in a rank-4 shape is taken
        ("a shape of rank 4", m(lambda h: h["params"][0].update(shape=[1, 1, 1, h["params"][0][
            "count"]])), True),
        ("a shape of rank 5", m(lambda h: h["params"][0].update(shape=[1, 1, 1, 1, 1])), False),
        ("a dimension 0", m(lambda h: h["params"][0].update(shape=[0])), False),
        ("a dimension over 2^40", m(lambda h: h["params"][0].update(shape=[1 << 21, 1 << 20])),
         False),
        ("a parameter missing", m(lambda h: h["params"].pop()), False),
        ("nine parameters", m(lambda h: h["params"].extend([h["params"][0]] * 5)), False),
        ("producers a list", m(setp("producers", [])), False),
        ("an empty producer name", m(setp("producers", {"": 1})), False),
        ("a 64-byte producer name", m(setp("producers", {"p" * 64: 1})), False),
        ("a negative position", m(setp("producers", {"a": -1})), False),
        ("a real position", m(setp("producers", {"a": 1.5})), False),
        ("hosts 2, no host_producers", m(setp("hosts", 2)), False),
        ("hosts 2, one host_producers", m(lambda h: h.update(hosts=2, host_producers=[{}])),
         False),
        ("hosts 0", m(setp("hosts", 0)), False),
        ("hosts 65537", m(setp("hosts", 65537)), False),
        ("nparam_floats off by one", m(lambda h: h.update(nparam_floats=h["nparam_floats"] + 1)),
         False),
        ("an optimizer kind unknown", m(lambda h: h["optimizer"].update(kind="rmsprop")), False),
        # the optimizer features (absent, as written above: off)
        ("a cosine schedule", m(lambda h: h["optimizer"].update(
            lr_schedule="cosine", warmup_steps=3, decay_steps=9, min_learning_rate=0.01,
            weight_decay=0.1, clip_norm=1.5)), True),
        ("an lr_schedule unknown", m(lambda h: h["optimizer"].update(lr_schedule="exp")), False),
        ("warmup_steps -1", m(lambda h: h["optimizer"].update(warmup_steps=-1)), False),
        ("decay_steps a real", m(lambda h: h["optimizer"].update(decay_steps=2.5)), False),
        ("clip_norm as text", m(lambda h: h["optimizer"].update(clip_norm="1")), False),
        # what jansson refuses and Python's json module takes
        ("a duplicate key", text.replace('"format"', '"global_step": 1, "format"', 1).encode(),
         False),
        ("NaN", text.replace('"learning_rate": 0.05', '"learning_rate": NaN').encode(), False),
        ("a real that overflows", text.replace('"learning_rate": 0.05', '"learning_rate": 1e999')
         .encode(), False),
        ("an integer over 64 bits", text.replace(f'"opt_step": {head["opt_step"]}',
                                                 f'"opt_step": {1 << 64}').encode(), False),
        ("a NUL in a string", text.replace('"mlp"', '"m\\u0000lp"').encode(), False),
        ("a lone surrogate", text.replace('"loader-0"', '"\\ud800"').encode(), False),
        ("not UTF-8", text.replace('"mlp"', '"m\xfflp"').encode("latin-1"), False),
        ("not an object", b"[1, 2]", False),
        ("not JSON", text[:-1].encode(), False),
    ]
    out.append(("a name twice", m(lambda h: h["params"][1].update(name=name)), None))
    return out


def test_bad_headers_are_refused_as_the_daemon_refuses_them(tmp_path, rng):
    """Each header mutation (the CRC and size right) is refused by the client exactly when the
    daemon's loader refuses it, except a parameter name given twice: the client's one check
    more (docs/checkpoint.md)."""
    _, head, params, slots = valid_file(tmp_path, rng)
    for i, (what, h, daemon_takes) in enumerate(mutations(head)):
        p = tmp_path / f"m{i}.ifdckpt"
        ckpt.write(p, h, params, slots)
        ok, e = client_loads(p)
        loads, sentence = daemon_loads(p)
        ctx = f"{what}: client {e}\ndaemon: {sentence}"
        if daemon_takes is None:  # the name given twice
            assert loads and not ok and e.field == "header: 'params[1].name'", ctx
            continue
        assert loads == daemon_takes and ok == loads, ctx
        if what == "two hosts":
            assert (e.hosts, e.producers, e.host_producers) == (2, {}, [{}, {"a": 3}]), ctx
        if not ok and e.field.startswith("header: '"):  # the daemon names the same key
            key = [w for w in re.split(r"[.\[\]]", e.field[9:-1]) if w and not w.isdigit()]
            assert key[-1] in sentence, ctx
        elif not ok:
            assert e.field in ("size", "header"), ctx
            words = ("truncated", "trailing bytes") if e.field == "size" else ("header: line",)
            assert any(w in sentence and (w in str(e) or e.field == "header") for w in words), ctx


# ---- a folder: the newest checkpoint that loads ------------------------------------------------

def test_a_folder_gives_its_newest_checkpoint_that_loads(daemon, tmp_path, rng):
    folder = tmp_path / "ck"
    folder.mkdir()
    f, h, k = rng.randint(1, 6), rng.randint(1, 6), rng.randint(2, 5)
    steps = sorted(rng.sample(range(1, 10 ** 6), rng.randint(2, 6)))
    steps[-1] += rng.choice([0, 10 ** 12])  # 13 digits: compared as a number, not a name
    for s in steps:
        name = f"ckpt-{s:012d}.ifdckpt"
        head = ckpt.header("mlp", {"features": f, "hidden": h, "classes": k},
                           mlp_shapes(f, h, k), s, {"p": s - 1})
        ckpt.write(folder / name, head, np.full(head["nparam_floats"], s, np.float32))
    top = steps[-1] + 1
    # never candidates, whatever they hold: a writer's temporary file, a set-aside one, names
    # the daemon would not give that step (it opens the one it makes from the step), others
    short = [f"ckpt-{top}.ifdckpt"] if top < 10 ** 11 else []  # fewer than 12 digits
    for name in short + [f".ckpt-{top:012d}.ifdckpt.tmp-{rng.randint(2, 1 << 20)}",
                         f"ckpt-{top:012d}.ifdckpt.damaged", f"ckpt-{top:019d}.ifdckpt",
                         f"ckpt-0{top:012d}.ifdckpt", f"ckpt-{top:012d}x.ifdckpt", "notes.txt"]:
        head = ckpt.header("mlp", {"features": f, "hidden": h, "classes": k},
                           mlp_shapes(f, h, k), top, {})
        ckpt.write(folder / name, head, np.zeros(head["nparam_floats"], np.float32))
    assert [ckpt.read(p)["global_step"] for p in ckpt.files(folder)] == steps
    paths = ckpt.files(folder)
    bad = rng.randint(1, len(steps) - 1)  # the newest `bad` are damaged
    what = [ckpt.damage(p, rng) for p in paths[len(paths) - bad:]]
    listing = sorted(os.listdir(folder))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = infeed.checkpoint.load(folder)
    ctx = f"steps {steps}; {'; '.join(what) or 'none damaged'}"
    want = steps[len(steps) - 1 - bad]
    assert c.global_step == want and (c.vector == want).all(), ctx
    assert c.path == str(paths[len(paths) - 1 - bad]) and c.producers == {"p": want - 1}, ctx
    assert [e.path for e in c.skipped] == [str(p) for p in reversed(paths[len(paths) - bad:])]
    assert len(w) == bad and all(issubclass(x.category, RuntimeWarning) for x in w), ctx
    for x, e in zip(w, c.skipped):
        assert "skipped a damaged checkpoint" in str(x.message) and e.path in str(x.message)
    assert sorted(os.listdir(folder)) == listing, "the loader renamed or removed a file"
    # the daemon (predict, --checkpoint-dir) takes the same one and warns of the same files
    d = daemon(mode="predict", program="mlp", features=f, hidden=h, classes=k, batch_size=2,
               steps=0, checkpoint_dir=str(folder))
    log = d.log()
    assert f"starting from a checkpoint at global step {want} " in log, f"{ctx}\n{log}"
    assert log.count("skipped a damaged checkpoint") == bad, f"{ctx}\n{log}"
    d.kill()

    # every one damaged: one sentence naming the folder and the newest's problem
    for p in paths[:len(paths) - bad]:
        ckpt.damage(p, rng)
    with pytest.raises(infeed.CheckpointError) as e:
        infeed.checkpoint.load(folder)
    assert e.value.code == "EPROTO" and e.value.path == str(folder), e.value
    assert str(e.value).startswith(f"checkpoint folder '{folder}': none of its {len(steps)} "
                                   f"checkpoints loads; the newest: checkpoint '{paths[-1]}': ")
    assert any(p in str(e.value) for p in ckpt.PROBLEMS), e.value
    one = tmp_path / "one"
    one.mkdir()
    (one / paths[-1].name).write_bytes(paths[-1].read_bytes())
    with pytest.raises(infeed.CheckpointError, match="its only checkpoint does not load"):
        infeed.checkpoint.load(one)


def test_nothing_to_load_is_enotfound_and_a_fifo_eio(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".ckpt-000000000005.ifdckpt.tmp-7").write_bytes(b"x")
    for path, field in ((tmp_path / "empty", "folder"), (tmp_path / "none.ifdckpt", "file")):
        with pytest.raises(infeed.CheckpointError) as e:
            infeed.checkpoint.load(path)
        assert e.value.code == "ENOTFOUND" and e.value.field == field, e.value
        assert str(path) in str(e.value), e.value
    assert "no checkpoint (ckpt-<step>.ifdckpt) in it" in str(
        pytest.raises(infeed.CheckpointError, infeed.checkpoint.load, tmp_path / "empty").value)
    os.mkfifo(tmp_path / "fifo")  # refused at once, not waited on
    with pytest.raises(infeed.CheckpointError) as e:
        infeed.checkpoint.load(tmp_path / "fifo")
    assert e.value.code == "EIO" and e.value.expected == "a regular file", e.value


# ---- python -m infeed.export: its errors, and the client without safetensors ------------------

def test_export_command_errors_and_no_partial_files(tmp_path, rng):
    path, _, _, _ = valid_file(tmp_path, rng)
    r = run_export(path)
    assert r.returncode == 2 and "expected --npz OUT.npz, --safetensors" in r.stderr, r.stderr
    r = run_export("--help")
    assert r.returncode == 0 and "--npz" in r.stdout and "--safetensors" in r.stdout, r.stdout
    bad = tmp_path / "bad.ifdckpt"
    bad.write_bytes(path.read_bytes())
    ckpt.damage(bad, rng)
    r = run_export(bad, "--npz", tmp_path / "out.npz")
    assert r.returncode == 1 and r.stderr.startswith(f"infeed.export: checkpoint '{bad}': "), \
        r.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.ifdckpt", "good.ifdckpt"], os.listdir(tmp_path)


def test_program_settings_are_loaded_and_exported(tmp_path, rng):
    """A checkpoint's program_config (program ABI 4) is settings["program_config"], and goes into
    the safetensors metadata with the other settings."""
    pc = {"layers": rng.randint(1, 8), "heads": rng.randint(1, 4), "name": "x"}
    head = ckpt.header("custom", {"features": 3}, [("w", [2, 3])], 7, {})
    head["settings"]["program_config"] = pc
    ckpt.write(tmp_path / "c.ifdckpt", head, np.zeros(6, np.float32))
    c = infeed.checkpoint.load(tmp_path / "c.ifdckpt")
    assert c.settings["program_config"] == pc
    st = pytest.importorskip("safetensors.numpy")
    infeed.export.export(tmp_path / "c.ifdckpt", safetensors=tmp_path / "c.safetensors")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "c.safetensors"), framework="numpy") as f:
        assert json.loads(f.metadata()["settings"])["program_config"] == pc
    del st


def test_parameters_of_any_name_are_exported(tmp_path, rng):
    """np.savez's own keywords ("file", "allow_pickle"), a rank-0 parameter, ranks 3 and 4 and
    more than 8 parameters (program ABI 4) are names and shapes a program may declare."""
    shapes = [("file", []), ("allow_pickle", [rng.randint(1, 5)]),
              ("w", [rng.randint(1, 4), rng.randint(1, 4)])]
    shapes += [(f"t{i}", [rng.randint(1, 3) for _ in range(rng.randint(1, 4))])
               for i in range(rng.randint(6, 12))]
    head = ckpt.header("custom", {"features": 3}, shapes, 7, {})
    params = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(
        head["nparam_floats"]).astype(np.float32)
    ckpt.write(tmp_path / "c.ifdckpt", head, params)
    st = pytest.importorskip("safetensors.numpy")
    c = infeed.export.export(tmp_path / "c.ifdckpt", npz=tmp_path / "c.npz",
                             safetensors=tmp_path / "c.safetensors")
    got = st.load_file(str(tmp_path / "c.safetensors"))
    with np.load(tmp_path / "c.npz") as z:
        for name, shape in shapes:
            assert c.params[name].shape == tuple(shape), name
            assert z[name].shape == got[name].shape == tuple(shape), name
            assert np.array_equal(z[name], c.params[name]), name
            assert np.array_equal(got[name], c.params[name]), name


def test_the_client_works_without_safetensors(tmp_path, rng):
    path, _, params, _ = valid_file(tmp_path, rng)
    block = "import sys\nsys.modules['safetensors'] = None  # import safetensors fails"
    r = run_export(path, "--npz", tmp_path / "a.npz", "--safetensors", tmp_path / "a.st",
                   pre=block)
    assert r.returncode == 1 and "pip install safetensors" in r.stderr, r.stderr
    assert not (tmp_path / "a.npz").exists() and not (tmp_path / "a.st").exists()
    r = run_export(path, "--npz", tmp_path / "b.npz", pre=block)
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "b.npz") as z:
        assert np.array_equal(np.concatenate([z[n].ravel() for n in ("W1", "b1", "W2", "b2")]),
                              params)

