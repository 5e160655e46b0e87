"""The C producer (examples/c_producer.c, include/infeed/client.h) over the shared-memory
transport against a real infeedd: it trains exactly as over tcp on the same rows (copying send
and in-place buffer/commit, several steps a message), reports the transport, and falls back to
BATCH when the daemon gives no pool (--shm off), or fails quoting the daemon with --shm on."""

import subprocess

import pytest

from helpers import c_producer, run_program


def c_run(exe, d, *flags, batches):
    return run_program([exe, "--endpoint", d.listen, "--features", str(d.flags["features"]),
                "--classes", str(d.flags["classes"]), "--batches", str(batches), *flags])


def train_losses(d):
    return [s["loss"] for s in d.summaries() if s["event"] == "train"]


@pytest.mark.parametrize("listen", ["tcp", "ipc"])
def test_c_producer_over_shm_trains_as_over_tcp(daemon, rng, tmp_path, listen):
    exe = c_producer()
    replicas = rng.choice([1, 2])
    steps = rng.randint(20, 60)
    most = rng.randint(1, 4)
    flags = dict(replicas=replicas, program="softmax", features=rng.randint(1, 40),
                 classes=rng.randint(2, 6), batch_size=replicas * rng.randint(1, 16),
                 iterations_per_loop=rng.randint(1, 5), steps=steps, summary_every=1,
                 max_steps_per_message=most, seed=rng.randint(1, 999))
    seed = str(rng.randint(1, 1 << 30))
    print(f"flags {flags}, producer seed {seed}")

    ref = daemon(**flags)
    r = c_run(exe, ref, "--shm", "off", "--seed", seed, batches=steps)
    assert r.returncode == 0, r.stderr
    assert "transport: tcp\n" in r.stdout, r.stdout
    assert ref.wait() == 0, ref.log()
    want = train_losses(ref)
    assert len(want) == steps, want

    for mode, in_place in (("auto", "off"), ("on", "on")):
        extra = {} if listen == "tcp" else {"listen": f"ipc://{tmp_path}/shm-{mode}.sock"}
        d = daemon(**flags, **extra)
        r = c_run(exe, d, "--shm", mode, "--seed", seed, "--steps-per-message", str(most),
                  "--in-place", in_place, batches=steps)
        assert r.returncode == 0, r.stderr
        assert "transport: shm\n" in r.stdout, r.stdout
        assert d.wait() == 0, d.log()
        assert train_losses(d) == want, (mode, in_place)  # the same bits


def test_c_producer_without_a_pool(daemon, rng):
    exe = c_producer()
    steps = rng.randint(5, 30)
    flags = dict(replicas=1, program="softmax", features=8, classes=3, batch_size=8,
                 steps=steps, summary_every=1, shm="off")
    d = daemon(**flags)
    # on: hello fails, quoting the daemon's shm_refused sentence
    r = c_run(exe, d, "--shm", "on", "--name", "wants-shm", batches=steps)
    assert r.returncode == 1, r.stdout
    assert "ENOTSUP" in r.stderr and "shm on" in r.stderr and "--shm" in r.stderr, r.stderr
    # auto: BATCH instead, and the run trains to its last step
    r = c_run(exe, d, "--in-place", "on", batches=steps)
    assert r.returncode == 0, r.stderr
    assert "transport: tcp (no shared memory: " in r.stdout, r.stdout
    assert d.wait() == 0, d.log()
    assert len(train_losses(d)) == steps


def test_c_producer_falls_back_when_the_pool_cannot_be_opened(daemon, rng):
    """In another PID namespace the daemon's /proc/PID/fd/N is not there: auto says HELLO again
    without shm (the daemon drops the pool) and streams BATCH; on fails naming the path."""
    exe = c_producer()
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("unshare --pid --mount-proc is not permitted here")
    steps = rng.randint(5, 30)
    d = daemon(replicas=1, program="softmax", features=8, classes=3, batch_size=8, steps=steps,
               summary_every=1)
    ns = ["unshare", "--pid", "--fork", "--mount-proc"]
    flags = ["--endpoint", d.listen, "--features", "8", "--classes", "3", "--batches", str(steps)]
    r = run_program(ns + [exe, *flags, "--shm", "on", "--name", "on"])
    assert r.returncode == 1, r.stdout
    assert "shm on: shm pool /proc/" in r.stderr and "cannot open it" in r.stderr, r.stderr
    r = run_program(ns + [exe, *flags, "--in-place", "on"])
    assert r.returncode == 0, r.stderr
    assert "transport: tcp (no shared memory: shm pool /proc/" in r.stdout, r.stdout
    assert d.wait() == 0, d.log()
    assert len(train_losses(d)) == steps
