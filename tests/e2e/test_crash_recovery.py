"""Daemon faults end to end (docs/checkpoint.md): infeedd SIGKILLed at random moments, inside a
checkpoint write (the IFD_TEST_CHECKPOINT_PAUSE test hook), or resumed over a damaged newest
checkpoint, then restarted with --resume while its producer replays from WELCOME's next_seq.
Each resumed run's per-step losses and final state must equal an uninterrupted run's.

The comparison is exact, with no tolerance: the cpu backend runs each step with a fixed order
of operations (the same replicas, shards and allreduce order), a resumed run starts from the
checkpoint's bits, and the producer replays the same batches, so every step computes the same
floats. The final parameters and optimizer slots are compared bit for bit. Each step's loss
(--summary-every 1) is compared as the summary prints it, with 15 significant digits
(outfeed/summary.c): it is the sum of the two replicas' float32 losses, which carries far fewer
digits than that, so equal text means equal losses. Any tolerance would only hide a resume that
skipped or repeated a batch or an optimizer update; those move the next loss by about 1e-4.

The SIGKILL test runs twice: with Adam, and with the optimizer features of docs/config.md
(AdamW, clipping by global norm that bites on some steps only, a cosine schedule whose warmup
and decay span the checkpoints), whose state must survive the resume as bit for bit.

Trials are randomized; the seed is in every assertion message (INFEED_TEST_SEED=... repeats it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import ckpt
import infeed
from conftest import run_infeedd
from helpers import seeded_batch, wait_until

FEATURES, CLASSES, BATCH = 5, 3, 8
LAST = 40      # steps of every run; one batch per step
EVERY = 4      # --checkpoint-every
IPL = 2        # --iterations-per-loop: checkpoints land exactly on the multiples of EVERY


def batch(seq: int) -> dict:
    """The stream's batch with sequence number seq: the same bytes whenever it is made."""
    return seeded_batch(5000 + seq, BATCH, FEATURES, CLASSES)


# The optimizers the SIGKILL test runs with: the flags each adds to flags().
WARMUP, DECAY = 6, 30
OPTIMIZERS = {
    "adam": {},
    "adamw_clip_cosine": dict(optimizer="adamw", weight_decay=0.05, clip_norm=0.9,
                              lr_schedule="cosine", warmup_steps=WARMUP, decay_steps=DECAY,
                              min_learning_rate=0.005),
}


def cosine_rate(t: int, lr: float = 0.05, floor: float = 0.005) -> float:
    """The schedule's rate of update t (docs/config.md, "Optimizer features")."""
    if t < WARMUP:
        return lr * t / WARMUP
    f = min(t - WARMUP, DECAY - WARMUP) / (DECAY - WARMUP)
    return floor + (lr - floor) * (1 + np.cos(np.pi * f)) / 2


def flags(folder, **kw) -> dict:
    f = dict(replicas=2, batch_size=BATCH, features=FEATURES, classes=CLASSES, program="softmax",
             optimizer="adam", learning_rate=0.05, iterations_per_loop=IPL, summary_every=1,
             seed=11, checkpoint_dir=str(folder), checkpoint_every=EVERY, keep_checkpoints=50,
             last_step=LAST)
    f.update(kw)
    return f


@pytest.fixture
def seeded(request):
    seed = int(os.environ.get("INFEED_TEST_SEED", random.randrange(1 << 30)))
    print(f"{request.node.name}: seed {seed} (INFEED_TEST_SEED={seed} repeats it)")
    return seed, random.Random(seed)


def losses(d) -> dict[int, float]:
    """global step -> loss of each train summary of d; a last line cut by SIGKILL is left out."""
    out = {}
    if not d.summaries_path.exists():
        return out
    for line in d.summaries_path.read_text().splitlines():
        try:
            s = json.loads(line)
        except json.JSONDecodeError:
            continue
        if s.get("event") == "train":
            assert s["steps"] == 1, s
            out[s["global_step"]] = s["loss"]
    return out


def stream(endpoint: str, timeout: float = 20, pace: float = 0, sent: Optional[list] = None,
           halt: Optional[threading.Event] = None) -> infeed.Producer:
    """Streams batches 0..LAST-1 as 'loader-0' from the daemon's next_seq, then END and BYE;
    pace: seconds between batches; sent: appended to after each batch; halt: once set, stops
    between batches and closes without END."""
    p = infeed.Producer(endpoint, name="loader-0", timeout=timeout)
    try:
        for b in p.skip_consumed(batch(i) for i in range(LAST)):
            p.send(b)
            if sent is not None:
                sent.append(1)
            time.sleep(pace)  # the producer's pace, on purpose
            if halt is not None and halt.is_set():
                return p
        p.end()
    finally:
        p.close()
    return p


class Streamer(threading.Thread):
    """Streams every batch, paced, to a daemon that is about to be killed: stop() ends it (or,
    blocked for credit, its producer's one-second timeout). Stopped before the next daemon
    starts, so that its socket cannot reconnect to a new daemon on a reused port."""

    def __init__(self, endpoint: str, pace: float = 0):
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.pace = pace
        self.sent: list = []
        self.halt = threading.Event()
        self.error = None

    def run(self):
        try:
            stream(self.endpoint, timeout=1, pace=self.pace, sent=self.sent, halt=self.halt)
        except Exception as e:  # noqa: BLE001 - the daemon is killed under it
            self.error = e

    def stop(self):
        self.halt.set()
        self.join(10)
        assert not self.is_alive()


def make_reference(tmp: Path, extra: dict) -> dict:
    """One uninterrupted run with the flags extra adds: its per-step losses, its final
    checkpoint (and folder), and its summaries."""
    from conftest import Daemon
    d = Daemon(tmp, flags(tmp / "ck", **extra))
    try:
        t0 = time.monotonic()
        p = stream(d.listen)
        assert d.wait() == 0, d.log()
        took = time.monotonic() - t0
    finally:
        d.kill()
    assert p.resume_seq == 0 and p.bye["global_step"] == LAST
    want = losses(d)
    assert sorted(want) == list(range(1, LAST + 1)), want
    files = ckpt.files(tmp / "ck")
    assert [int(f.stem[5:]) for f in files] == list(range(EVERY, LAST + 1, EVERY)), files
    end = ckpt.read(files[-1])
    assert end["global_step"] == LAST and end["producers"] == {"loader-0": LAST - 1}
    summaries = [json.loads(ln) for ln in d.summaries_path.read_text().splitlines()]
    return {"losses": want, "end": end, "folder": tmp / "ck", "seconds": took,
            "summaries": summaries}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run: its per-step losses and its final checkpoint (and folder)."""
    return make_reference(tmp_path_factory.mktemp("reference"), OPTIMIZERS["adam"])


@pytest.fixture(scope="module")
def reference_adamw_clip_cosine(tmp_path_factory):
    """As reference, with AdamW, clipping and a cosine schedule; its summaries report each
    step's rate (the schedule's, from update 0) and gradient norm, and the clipping bites on
    some steps and not on others, so the run exercises both."""
    tmp = tmp_path_factory.mktemp("reference_adamw")
    config = tmp / "host_calls.json"
    config.write_text(json.dumps({"host_calls": {"learning_rate": "last", "grad_norm": "last"}}))
    ref = make_reference(tmp, dict(OPTIMIZERS["adamw_clip_cosine"], config=str(config)))
    train = [s for s in ref["summaries"] if s.get("event") == "train"]
    rates = {s["global_step"]: s["host_calls"]["learning_rate"]["last"] for s in train}
    norms = [s["host_calls"]["grad_norm"]["last"] for s in train]
    for step, rate in rates.items():
        assert rate == pytest.approx(cosine_rate(step - 1), rel=1e-6, abs=1e-12), (step, rate)
    clip = OPTIMIZERS["adamw_clip_cosine"]["clip_norm"]
    assert any(n > clip for n in norms) and any(n < clip for n in norms), norms
    assert ref["end"]["optimizer"]["kind"] == "adamw", ref["end"]["optimizer"]
    return ref


def check_resumed(d, p, start: int, ref: dict, folder: Path, ctx: str) -> None:
    """d (resumed from the checkpoint of step start, streamed by p) ran to the end and matches
    the reference: the same loss at every step after start, the same final state."""
    assert d.wait() == 0, f"{ctx}: exit status\n{d.log()}"
    assert p.resume_seq == start, f"{ctx}: WELCOME next_seq {p.resume_seq}, expected {start}"
    assert p.bye["status"] == "ok" and p.bye["global_step"] == LAST, f"{ctx}: {p.bye}"
    got = losses(d)
    assert sorted(got) == list(range(start + 1, LAST + 1)), f"{ctx}: summaries of {sorted(got)}"
    diff = {s: (got[s], ref["losses"][s]) for s in got if got[s] != ref["losses"][s]}
    assert not diff, f"{ctx}: losses differ from the uninterrupted run's (got, want): {diff}"
    end = ckpt.read(ckpt.files(folder)[-1])
    assert end["global_step"] == LAST and end["opt_step"] == LAST, ctx
    assert end["producers"] == {"loader-0": LAST - 1}, f"{ctx}: {end['producers']}"
    assert np.array_equal(end["params"], ref["end"]["params"]), f"{ctx}: final params differ"
    assert np.array_equal(end["slots"], ref["end"]["slots"]), f"{ctx}: final slots differ"
    assert not list(folder.glob(".ckpt-*")), f"{ctx}: a temporary file outlived the resumed run"


def killed_prefix_matches(d, ref: dict, ctx: str) -> None:
    """The steps the killed run finished before the kill had the reference's losses too."""
    for s, v in losses(d).items():
        assert v == ref["losses"][s], f"{ctx}: killed run, step {s}: {v} != {ref['losses'][s]}"


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_sigkill_at_random_moments_then_resume(daemon, tmp_path, request, seeded, opt):
    seed, rng = seeded
    reference = request.getfixturevalue("reference" if opt == "adam" else f"reference_{opt}")
    extra = OPTIMIZERS[opt]
    trials = 8
    resumed_mid_run = 0
    for trial in range(trials):
        folder = tmp_path / f"trial{trial}"
        d1 = daemon(**flags(folder, **extra))
        # The kill lands a random 0 to 3 ms after the producer sent a random number of batches
        # (0: around HELLO), 2 ms apart, while the daemon trains on them: anywhere in a step, a
        # loop boundary or a checkpoint write.
        st = Streamer(d1.listen, pace=0.002)
        k, after = rng.randrange(LAST), rng.uniform(0, 0.003)
        st.start()
        deadline = time.monotonic() + 20
        while len(st.sent) < k and st.is_alive() and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(after)  # a random moment to kill it at, on purpose
        d1.signal(signal.SIGKILL)
        rc = d1.wait()
        ctx = (f"{opt}, seed {seed}, trial {trial}: SIGKILL {after * 1000:.1f} ms after batch {k} "
               f"was sent ({len(st.sent)} by then)")
        st.stop()
        if rc == 0:  # the run ended before the kill: nothing to resume
            print(f"{ctx}: the run had ended")
            continue
        assert rc == -signal.SIGKILL, f"{ctx}: exit {rc}\n{d1.log()}"
        killed_prefix_matches(d1, reference, ctx)
        files = ckpt.files(folder)
        start = int(files[-1].stem[5:]) if files else 0
        ctx += f", newest checkpoint at step {start}"
        assert start % EVERY == 0, ctx
        if start == LAST:  # killed after its last checkpoint: the run is whole
            end = ckpt.read(files[-1])
            assert np.array_equal(end["params"], reference["end"]["params"]), ctx
            continue
        # a fresh start when the kill came before the first checkpoint
        d2 = daemon(**flags(folder, resume=bool(files), **extra))
        p2 = stream(d2.listen)
        check_resumed(d2, p2, start, reference, folder, ctx)
        resumed_mid_run += start > 0
    print(f"{resumed_mid_run} of {trials} trials resumed from a checkpoint inside the run")


@pytest.mark.parametrize("phase", ["partial", "written"])
def test_sigkill_inside_a_checkpoint_write(daemon, tmp_path, reference, seeded, monkeypatch,
                                           phase):
    seed, rng = seeded
    for trial in range(2):
        step = rng.randrange(2 * EVERY, LAST, EVERY)  # one with a complete checkpoint before it
        ctx = f"seed {seed}, trial {trial}: killed in the {phase} write of step {step}"
        folder = tmp_path / f"trial{trial}"
        with monkeypatch.context() as m:
            m.setenv("IFD_TEST_CHECKPOINT_PAUSE", f"{step}:{phase}")
            d1 = daemon(**flags(folder))
        st = Streamer(d1.listen)
        st.start()
        tmp = folder / f".ckpt-{step:012d}.ifdckpt.tmp-{d1.proc.pid}"
        wait_until(lambda: "IFD_TEST_CHECKPOINT_PAUSE" in d1.log() or d1.proc.poll() is not None,
                   f"{ctx}: the writer did not stop", d1)
        assert d1.proc.poll() is None, f"{ctx}: the daemon exited\n{d1.log()}"
        assert tmp.exists(), f"{ctx}: no {tmp.name}: {sorted(os.listdir(folder))}"
        if phase == "written":  # a whole, valid checkpoint, under its temporary name
            assert ckpt.read(tmp)["global_step"] == step, ctx
        else:
            with pytest.raises(ValueError):
                ckpt.read(tmp)
        d1.signal(signal.SIGKILL)
        assert d1.wait() == -signal.SIGKILL, ctx
        st.stop()
        killed_prefix_matches(d1, reference, ctx)
        files = ckpt.files(folder)
        assert int(files[-1].stem[5:]) == step - EVERY, f"{ctx}: {files}"
        assert tmp.exists(), ctx
        d2 = daemon(**flags(folder, resume=True))
        p2 = stream(d2.listen)
        check_resumed(d2, p2, step - EVERY, reference, folder, ctx)
        assert f"removed '{tmp}', left by an interrupted write" in d2.log(), \
            f"{ctx}: no log line for the temporary file\n{d2.log()}"


def test_damaged_newest_checkpoints_are_skipped(daemon, tmp_path, reference, seeded):
    seed, rng = seeded
    for trial in range(3):
        folder = tmp_path / f"trial{trial}"
        folder.mkdir()
        for f in ckpt.files(reference["folder"]):
            (folder / f.name).write_bytes(f.read_bytes())
        files = ckpt.files(folder)
        k = rng.randrange(1, len(files) - 1)  # damaged: the newest k; LAST's among them
        what = [ckpt.damage(f, rng) for f in files[-k:]]
        start = int(files[-k - 1].stem[5:])
        ctx = f"seed {seed}, trial {trial}: {'; '.join(what)}"
        d = daemon(**flags(folder, resume=True))
        p = stream(d.listen)
        log = d.log()
        for f in files[-k:]:
            warned = [ln for ln in log.splitlines() if " warn " in ln and str(f) in ln]
            assert warned and any(w in warned[0] for w in ckpt.PROBLEMS), \
                f"{ctx}: no warning naming {f.name} and its problem\n{log}"
            assert Path(str(f) + ".damaged").exists(), f"{ctx}: {f.name} was not set aside"
        check_resumed(d, p, start, reference, folder, ctx)
        # the run wrote its own checkpoints in place of the damaged ones
        assert [int(f.stem[5:]) for f in ckpt.files(folder)] == \
            list(range(EVERY, LAST + 1, EVERY)), ctx


def test_no_good_checkpoint_is_a_one_line_error(tmp_path, reference, seeded):
    seed, rng = seeded
    folder = tmp_path / "ck"
    folder.mkdir()
    for f in ckpt.files(reference["folder"])[-3:]:
        (folder / f.name).write_bytes(f.read_bytes())
    files = ckpt.files(folder)
    what = [ckpt.damage(f, rng) for f in files]
    before = {f.name: f.read_bytes() for f in files}
    f = flags(folder)
    args = [a for k, v in f.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    f.pop("checkpoint_dir")
    no_dir = [a for k, v in f.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    for argv, names in ((args + ["--resume"], [str(folder), "none of its 3", str(files[-1])]),
                        # an explicit file is refused even when an older good one exists
                        (no_dir + ["--checkpoint", str(files[0])], [str(files[0])])):
        r = run_infeedd(*argv)
        ctx = f"seed {seed}: {'; '.join(what)}: {' '.join(argv[-2:])}"
        assert r.returncode == 2, f"{ctx}: exit {r.returncode}\n{r.stderr}"
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("infeedd: "), f"{ctx}: {r.stderr}"
        for n in names:
            assert n in lines[0], f"{ctx}: {n!r} not in {lines[0]}"
        assert any(w in lines[0] for w in ckpt.PROBLEMS), f"{ctx}: no problem named: {lines[0]}"
    # a start that failed renamed and changed nothing
    assert {f.name: f.read_bytes() for f in ckpt.files(folder)} == before, ctx
    assert not list(folder.glob("*.damaged")), ctx


def test_eval_skips_damaged_checkpoints_and_renames_nothing(daemon, tmp_path, reference, seeded):
    """Eval only reads the folder: the newest checkpoint that loads is evaluated, the damaged
    newer ones are warned about and left where they are."""
    seed, rng = seeded
    folder = tmp_path / "ck"
    folder.mkdir()
    for f in ckpt.files(reference["folder"]):
        (folder / f.name).write_bytes(f.read_bytes())
    files = ckpt.files(folder)
    k = rng.randrange(1, len(files) - 1)
    what = [ckpt.damage(f, rng) for f in files[-k:]]
    start = int(files[-k - 1].stem[5:])
    ctx = f"seed {seed}: {'; '.join(what)}"
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    f = flags(folder, mode="eval", steps=2)
    for key in ("checkpoint_every", "keep_checkpoints", "last_step", "summary_every"):
        f.pop(key)
    d = daemon(**f)
    with infeed.Producer(d.listen, name="evaluator", timeout=20) as p:
        for i in range(2):
            p.send(batch(i))
    assert d.wait() == 0, f"{ctx}\n{d.log()}"
    log = d.log()
    assert f"starting from a checkpoint at global step {start} " in log, f"{ctx}\n{log}"
    for g in files[-k:]:
        assert any(" warn " in ln and str(g) in ln for ln in log.splitlines()), \
            f"{ctx}: no warning naming {g.name}\n{log}"
    assert {g.name: g.read_bytes() for g in folder.iterdir()} == before, f"{ctx}: files changed"
    assert d.end_summary()["global_step"] == start, ctx
