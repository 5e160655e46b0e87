"""infeedctl against a live infeedd: status (readable and --json), stop, watch (the progress
line until the end summary), CURVE keys, and the sentences for no daemon and bad usage."""

import json
import re
import subprocess
import time

import numpy as np
import pytest

import infeed
from conftest import dead_tcp_endpoint, free_ports
from helpers import CURVE_BATCH as BATCH
from helpers import CURVE_CLASSES as CLASSES
from helpers import CURVE_FEATURES as FEATURES
from helpers import ctl, ctl_endpoints, infeedctl_path, wait_connected
from helpers import curve_batch as batch
from helpers import curve_producer as producer


def start(daemon, **flags):
    f = dict(program="softmax", features=FEATURES, classes=CLASSES, batch_size=BATCH,
             iterations_per_loop=2, summary_every=2)
    f.update(flags)
    return daemon(**f)


def test_status_readable_and_json(daemon, rng):
    steps = rng.randint(50, 200)
    d = start(daemon, steps=steps, replicas=rng.choice([1, 2]))
    nprng = np.random.default_rng(rng.randint(0, 2**31))
    sent = rng.randint(1, 5)
    shm = rng.choice([True, False])
    p = infeed.Producer(d.listen, name="loader-7", timeout=10, shm=shm)
    for i in range(sent):
        p.send(batch(nprng, i))
    p.wait()
    r = ctl("status", "--json", *ctl_endpoints(d))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["ok"] and s["last_step"] == steps and s["mode"] == "train", s
    assert [(q["name"], q["shm"]) for q in s["producers"]] == [("loader-7", shm)], s
    assert s["global_step"] <= sent and s["batches_accepted"] == sent, s
    r = ctl("status", *ctl_endpoints(d))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"global step   {s['global_step']} / {steps}" in out, out
    assert "loader-7" in out and f"accepted {sent}" in out, out
    assert ("shared memory" in out) == shm, out
    assert f"program softmax on {s['replicas']} cpu replica" in out, out
    assert len(re.findall(r"replica \d+\s+infeed \d+/\d+, outfeed \d+/\d+", out)) == s["replicas"]
    p.close()


def test_stop_ends_the_run(daemon, rng):
    d = start(daemon, steps=100000)
    nprng = np.random.default_rng(rng.randint(0, 2**31))
    p = infeed.Producer(d.listen, name="p", timeout=10)
    for i in range(rng.randint(2, 6)):
        p.send(batch(nprng, i))
    r = ctl("stop", *ctl_endpoints(d))
    assert r.returncode == 0, r.stderr
    assert "stopping" in r.stdout, r.stdout
    try:
        for i in range(1000):
            p.send(batch(nprng, i))
    except infeed.RunEnded:
        pass
    assert d.wait() == 0, d.log()
    end = d.end_summary()
    assert end["reason"] == "stopped" and end["global_step"] < 100000, end
    p.close()


def watch(d, *extra):
    """infeedctl watch on d, once it is under way: its first line says the control socket
    answered its status (a watch without that answer cannot tell a daemon that vanished), and its
    subscriber is connected (PUB drops what it publishes before a subscription). communicate()
    gives the whole output, that first line included."""
    proc = subprocess.Popen([infeedctl_path(), "watch", *ctl_endpoints(d), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    assert first.startswith("watching infeedd at "), (first, proc.poll())
    wait_connected(d.publish)
    rest = proc.communicate

    def communicate(*args, **kw):
        out, err = rest(*args, **kw)
        return first + out, err

    proc.communicate = communicate
    return proc


def feed(d, rng, n, name="p"):
    nprng = np.random.default_rng(rng.randint(0, 2**31))
    with infeed.Producer(d.listen, name=name, timeout=10) as p:
        try:
            for i in range(n):
                p.send(batch(nprng, i))
        except infeed.RunEnded:
            pass


def test_watch_shows_progress_and_ends_with_the_run(daemon, rng):
    steps = 2 * rng.randint(10, 40)
    d = start(daemon, steps=steps)
    proc = watch(d)
    feed(d, rng, steps * 3)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"watching infeedd at {d.publish}: train mode, program softmax"), \
        lines[0]
    progress = [line for line in lines if line.startswith("step ")]
    assert progress, out
    summaries = [s for s in d.summaries() if s["event"] == "train"]
    # one line per train summary, in order, with its numbers
    assert len(progress) == len(summaries), (progress, summaries)
    for line, s in zip(progress, summaries):
        assert line.startswith(f"step {s['global_step']}/{steps} "), line
        assert f"loss {s['loss']:.4g}" in line and f"accuracy {s['accuracy']:.3f}" in line, line
        assert "examples/s" in line and "infeed wait" in line, line
        if s["global_step"] < steps and s["steps_per_sec"] > 0:
            assert re.search(r"ETA \d+:\d\d", line), line
    assert lines[-1] == f"end: ok (last_step) at global step {steps} after {steps} steps", out
    assert d.wait() == 0


def test_watch_exits_1_when_the_run_ends_with_an_error(daemon, rng):
    d = start(daemon, steps=1000, watchdog=rng.uniform(2.0, 3.0))  # no input: the watchdog fires
    proc = watch(d)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, (out, err)
    assert re.search(r"^end: error \(error\) at global step 0 after 0 steps: .*watchdog", out,
                     re.M), out
    assert d.wait() == 1


def test_watch_notices_a_daemon_that_vanishes(daemon, rng):
    d = start(daemon, steps=1000)
    proc = watch(d, "--timeout", "1")
    d.kill()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, (out, err)
    assert "the daemon stopped answering before its end summary came" in err, err


def test_watch_asks_again_a_control_socket_that_did_not_answer_at_first(rng):
    """A control socket that does not answer watch's first status (busy) is asked again after
    5 s without a summary; once it has answered, its silence ends the watch (before, watch
    never checked again and waited for ever after such a daemon died). A fake control (ROUTER)
    drops the first request, answers the second, then is gone; a fake PUB publishes nothing."""
    import zmq
    ctx = zmq.Context()
    ctl_sock, pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
    ctl_port = ctl_sock.bind_to_random_port("tcp://127.0.0.1")
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    last = rng.randint(100, 10000)
    proc = subprocess.Popen([infeedctl_path(), "watch", "--control",
                             f"tcp://127.0.0.1:{ctl_port}", "--publish",
                             f"tcp://127.0.0.1:{pub_port}", "--timeout", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert ctl_sock.poll(20000), "watch sent no status request"
        ctl_sock.recv_multipart()  # dropped: the daemon is busy
        assert ctl_sock.poll(20000), "watch did not ask the control socket again"
        ident, empty, req = ctl_sock.recv_multipart()
        assert json.loads(req) == {"cmd": "status"}, req
        status = {"ok": True, "mode": "train", "program": "softmax", "global_step": 3,
                  "last_step": last}
        ctl_sock.send_multipart([ident, empty, json.dumps(status).encode()])
        first = proc.stdout.readline()
        assert first.startswith(f"watching infeedd at tcp://127.0.0.1:{pub_port}: train mode"), \
            first
        assert f"of {last}" in first, first
        ctl_sock.close(linger=0)  # the daemon is gone
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        ctx.destroy(linger=0)
    assert proc.returncode == 1, (out, err)
    assert "the daemon stopped answering before its end summary came" in err, err


def test_no_daemon_one_sentence_and_exit_1(rng):
    """One sentence naming the endpoint, its flag and --timeout, after about --timeout: watch,
    which asks the control socket and subscribes, waits for both at once (it waited twice)."""
    lp, pp = free_ports(2)
    for cmd in ("status", "stop", "watch"):
        t = round(rng.uniform(2, 3), 2)
        t0 = time.monotonic()
        r = ctl(cmd, "--control", f"tcp://127.0.0.1:{lp}", "--publish", f"tcp://127.0.0.1:{pp}",
                "--timeout", str(t))
        took = time.monotonic() - t0
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, (cmd, r.stderr)
        assert "no daemon answered at tcp://127.0.0.1:" in lines[0], lines[0]
        assert f"within {t:g} s" in lines[0], (t, lines[0])
        assert "--control" in lines[0] or "--publish" in lines[0], lines[0]
        assert took < 1.5 * t + 1, f"{cmd} took {took:.1f} s with --timeout {t}"


def test_curve_refusals_say_why(curve_daemon, keys, rng):
    """Against a CURVE daemon: no --server-key is told that the daemon may require CURVE, a key
    not in --admin-keys that it was refused, and a CURVE client that hears nothing at all that
    the daemon may refuse its key."""
    d = curve_daemon(steps=1000)
    t = str(round(rng.uniform(0.5, 1.0), 2))
    server = ["--server-key", str(keys["dir"] / "daemon.pub")]
    need = ": the handshake failed: it may require CURVE (pass --server-key and --key-file)"
    refused = (": it refused this client's CURVE key (is its public key in the daemon's "
               "--admin-keys?)")
    dead = dead_tcp_endpoint()
    for args, words in [
            (["status", *ctl_endpoints(d)], need),
            (["stop", *ctl_endpoints(d)], need),
            (["watch", *ctl_endpoints(d)], need),
            (["status", *ctl_endpoints(d), *server, "--key-file", str(keys["dir"] / "a.key")],
             refused),
            (["status", "--control", dead, *server, "--key-file", str(keys["dir"] / "admin.key")],
             f"; is infeedd running with --control {dead}, or does it refuse this client's key "
             f"(CURVE)?")]:
        r = ctl(*args, "--timeout", t)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, (args, r.stderr)
        assert "no daemon answered at " in lines[0] and words in lines[0], (args, lines[0])
    assert d.proc.poll() is None, "a refused stop stopped the daemon"


@pytest.mark.parametrize("args,want", [
    ([], "expected a command"),
    (["statu"], "unknown command 'statu'"),
    (["status", "--bogus"], "unknown option '--bogus'"),
    (["status", "--timeout", "soon"], "--timeout"),
    (["status", "--timeout", "0"], "--timeout"),
    (["stop", "--json"], "--json"),
    (["status", "--server-key", "x.pub"], "--key-file"),
    (["status", "--control"], "--control: expected a value"),
    (["status", "stop"], "unexpected argument 'stop'"),
])
def test_usage_errors_exit_2(args, want):
    r = ctl(*args)
    assert r.returncode == 2, (args, r.stderr)
    assert want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_help_and_version():
    r = ctl("--help")
    assert r.returncode == 0
    for word in ("status", "stop", "watch", "--json", "--control", "--publish", "--server-key",
                 "--key-file", "--timeout", "--help", "--version"):
        assert word in r.stdout, word
    r = ctl("--version")
    assert r.returncode == 0 and r.stdout.startswith("infeedctl "), r.stdout


def test_curve_keys(curve_daemon, keys, rng):
    d = curve_daemon(steps=20, summary_every=2, iterations_per_loop=2)
    admin = ["--server-key", str(keys["dir"] / "daemon.pub"),
             "--key-file", str(keys["dir"] / "admin.key")]
    r = ctl("status", "--json", *ctl_endpoints(d), *admin)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["last_step"] == 20
    # no keys, or a key not in --admin-keys: the daemon answers nothing
    for who in ([], ["--server-key", str(keys["dir"] / "daemon.pub"),
                     "--key-file", str(keys["dir"] / "a.key")]):
        r = ctl("status", *ctl_endpoints(d), "--timeout", "0.5", *who)
        assert r.returncode == 1 and "no daemon answered" in r.stderr, r.stderr
    r = ctl("status", *ctl_endpoints(d), "--server-key", str(keys["dir"] / "missing.pub"),
            "--key-file", str(keys["dir"] / "admin.key"))
    assert r.returncode == 1 and "missing.pub" in r.stderr, r.stderr
    # watch with a subscriber key, to the end
    proc = watch(d, *admin)
    nprng = np.random.default_rng(rng.randint(0, 2**31))
    with producer(d, keys, "a", "loader-0") as p:
        try:
            for i in range(200):
                p.send(batch(nprng, i))
        except infeed.RunEnded:
            pass
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "step 20/20" in out and out.strip().endswith("end: ok (last_step) at global step 20 "
                                                        "after 20 steps"), out
