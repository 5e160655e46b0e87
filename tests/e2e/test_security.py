"""CURVE (docs/protocol.md, "Security"): a real infeedd with --curve-secret-key, its producers,
subscribers and control clients with and without allowed keys; keygen; key file errors; the
refusal of non-loopback endpoints without keys.

A refused peer gets nothing at all, so "nothing" is checked by waiting a bounded time for an
answer that must not come, while an allowed peer on the same daemon does get answers."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import time

import numpy as np
import pytest
import zmq

import infeed
from conftest import dead_tcp_endpoint, free_ports, keygen, run_infeedd
from infeed import keys as K
from infeed import protocol as P
from rawpeer import RawPeer, batch_frames, hello
from helpers import (CURVE_BATCH, CURVE_CLASSES, CURVE_FEATURES, CURVE_SCHEMA, c_producer,
                     subscribed, wait_log)
from helpers import curve_batch as batch
from helpers import curve_producer as producer

FEATURES, CLASSES, BATCH, SCHEMA = CURVE_FEATURES, CURVE_CLASSES, CURVE_BATCH, CURVE_SCHEMA
RAW_SCHEMA = [P.schema_entry(*e) for e in SCHEMA]


# ---- keygen ----------------------------------------------------------------------------------

def test_keygen_files(tmp_path):
    public, secret = keygen(tmp_path / "k")
    key, pub = tmp_path / "k.key", tmp_path / "k.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert pub.read_text() == public + "\n"
    assert K.load_public_key(pub) == public
    assert zmq.curve_public(secret.encode()).decode() == public
    before = key.read_bytes()
    r = run_infeedd("keygen", str(tmp_path / "k"))
    assert r.returncode == 2 and "exists" in r.stderr and "k.key" in r.stderr, r.stderr
    assert key.read_bytes() == before
    r = run_infeedd("keygen")
    assert r.returncode == 2 and "PREFIX" in r.stderr, r.stderr
    assert "keygen PREFIX" in run_infeedd("--help").stdout
    # two runs never give the same key
    assert keygen(tmp_path / "k2")[0] != public


# ---- producers ------------------------------------------------------------------------------

def test_authorized_producer_trains_and_subscribes(curve_daemon, keys):
    d = curve_daemon(steps=40)
    rng = np.random.default_rng(1)
    sub = infeed.Subscriber(d.publish, timeout=0.1, server_key=keys["server"], keypair=keys["b"])
    try:
        with producer(d, keys, "a", "loader-1") as p:
            assert p.welcome["name"] == "loader-1"
            try:
                for i in range(1000):
                    p.send(batch(rng, i))
            except infeed.RunEnded:
                pass
        assert d.wait() == 0, d.log()
        end = d.end_summary()
        assert (end["status"], end["reason"], end["global_step"]) == ("ok", "last_step", 40), end
        got = []
        deadline = time.monotonic() + 5
        while not sub.ended and time.monotonic() < deadline:
            try:
                got.append(sub.recv())
            except TimeoutError:
                pass
        assert got and got[-1]["event"] == "end", got  # a producer key may subscribe
        train = [s for s in d.summaries() if s["event"] == "train"]
        assert train[-1]["loss"] < train[0]["loss"], train
    finally:
        sub.close()


def test_unauthorized_key_delivers_nothing(curve_daemon, keys, rng):
    d = curve_daemon(steps=1000)
    # a listed key works on the same daemon (kept open: its END would end the input)
    good = producer(d, keys, "b", "good")
    good.send(batch(np.random.default_rng(2)))
    good.wait()
    # the stranger's key, the admin's (not a producer key), and no CURVE at all
    for who in ("stranger", "admin", None):
        peer = RawPeer(d.listen)  # connects without CURVE
        if who is not None:
            peer.sock.close(0)
            peer.sock = zmq.Context.instance().socket(zmq.DEALER)
            peer.sock.setsockopt(zmq.LINGER, 0)
            K.apply_client(peer.sock, K.client_keys(server_key=keys["server"], keypair=keys[who]))
            peer.sock.connect(d.listen)
        n = rng.randint(1, 4)
        peer.send(hello(RAW_SCHEMA, f"intruder-{who}"))
        for s in range(n):
            b = batch(np.random.default_rng(s))
            peer.send(batch_frames(s, [b["x"], b["y"]]))
        peer.send([P.pack_header(P.END)])
        peer.drain(1.0)
        assert (peer.welcomes, peer.errors, peer.acks, peer.credits, peer.other) == \
            ([], [], [], [], []), f"{who}: the daemon answered a refused peer"
        peer.close()
        if who == "stranger":
            wait_log(d, keys["stranger"][0][:8])
    st = d.control({"cmd": "status"})
    names = [p["name"] for p in st["producers"]]
    assert names == ["good"], st["producers"]
    assert st["producers"][0]["accepted"] == 1, st["producers"]
    assert st["global_step"] == 1 and st["batch_queue"] == 0, st  # the good batch alone
    log = d.log()
    assert "ingest socket: refused a CURVE peer" in log and keys["stranger"][0][:8] in log, log
    assert keys["stranger"][1][:8] not in log  # never a secret
    # refusals are logged at most once a second per socket, with a count of the rest: many
    # refused clients retrying their handshakes for 2 s give a few lines, and a count
    t0 = time.monotonic()
    lines0 = d.log().count("ingest socket: refused")
    socks = []
    for _ in range(12):
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RECONNECT_IVL, 20)
        K.apply_client(s, K.client_keys(server_key=keys["server"],
                                        keypair=K.generate_keypair()))
        s.connect(d.listen)
        socks.append(s)
    time.sleep(2.2)  # 2 s of refused handshakes, on purpose (the log's rate limit is tested)
    for s in socks:
        s.close(0)
    wait_log(d, "suppressed")
    log = d.log()
    lines = log.count("ingest socket: refused") - lines0
    assert 1 <= lines <= time.monotonic() - t0 + 2, f"{lines} refusal lines:\n{log}"
    counted = log.count("ingest socket: refused a CURVE peer") + sum(
        int(n) for n in re.findall(r"ingest socket: refused (\d+) more CURVE peer", log)) + sum(
        int(n) for n in re.findall(r"ingest socket: refused a CURVE .*\((\d+) more suppressed\)",
                                   log))
    assert counted >= 12 + 2, f"{counted} refusals counted:\n{log}"  # and the stranger's, admin's
    # the Python client: no WELCOME, a TimeoutError naming the wait
    with pytest.raises(TimeoutError, match="WELCOME"):
        producer(d, keys, "stranger", "x", timeout=1)
    good.close()


def test_name_bound_to_another_key_is_refused(curve_daemon, keys):
    d = curve_daemon(steps=1000)
    rng = np.random.default_rng(3)
    a = producer(d, keys, "a", "loader-0")
    a.send(batch(rng))
    a.wait()
    # b (no names of its own) cannot take a's name: EPERM, and a's stream is untouched
    with pytest.raises(infeed.InfeedError) as e:
        producer(d, keys, "b", "loader-0")
    assert e.value.code == "EPERM" and "loader-0" in e.value.message, e.value
    assert "bound to another key" in e.value.message
    # a may not use a name outside its list, nor a made-up one
    with pytest.raises(infeed.InfeedError) as e:
        producer(d, keys, "a", "loader-7")
    assert e.value.code == "EPERM" and "loader-7" in e.value.message, e.value
    with pytest.raises(infeed.InfeedError) as e:
        infeed.Producer(d.listen, timeout=10, schema=SCHEMA, server_key=keys["server"],
                        keypair=keys["a"])
    assert e.value.code == "EPERM" and "no name" in e.value.message, e.value
    for i in range(5):
        a.send(batch(rng))
    a.wait()
    assert a.acked_seq == 5
    # b with a free name, and a with its other name, are welcome
    b = producer(d, keys, "b", "free-name")
    a1 = producer(d, keys, "a", "loader-1")
    for p in (b, a1):
        p.send(batch(rng))
        p.wait()
    st = d.control({"cmd": "status"})
    by_name = {p["name"]: p for p in st["producers"]}
    assert set(by_name) == {"loader-0", "free-name", "loader-1"}, by_name
    assert by_name["loader-0"]["accepted"] == 6 and by_name["loader-0"]["rejected"] == 0
    for p in (a, b, a1):
        p.close()


# ---- control and subscribers ----------------------------------------------------------------

def test_control_needs_an_admin_key(curve_daemon, keys):
    d = curve_daemon(steps=1000)
    for who in ("a", "stranger", None):
        for cmd in ("status", "stop"):
            with pytest.raises(TimeoutError):
                d.control({"cmd": cmd}, timeout=0.7, keypair=None if who is None else keys[who])
    assert d.proc.poll() is None, "a stop without an admin key stopped the daemon"
    wait_log(d, "control socket: refused a CURVE peer")
    st = d.control({"cmd": "status"})
    assert st["state"] == "running", st
    assert d.control({"cmd": "stop"}) == {"ok": True}
    assert d.wait() == 0, d.log()
    assert d.end_summary()["reason"] == "stopped"


def test_subscriber_without_an_allowed_key_gets_nothing(curve_daemon, keys):
    d = curve_daemon(steps=10, summary_every=1, iterations_per_loop=1)
    subs = {who: infeed.Subscriber(d.publish, timeout=0.05, server_key=keys["server"],
                                   keypair=keys[who]) for who in ("admin", "stranger")}
    subs["plain"] = infeed.Subscriber(d.publish, timeout=0.05)
    try:
        subscribed(subs["admin"])  # the allowed one's connection is up before the summaries
        rng = np.random.default_rng(4)
        with producer(d, keys, "b", "p") as p:
            try:
                for i in range(100):
                    p.send(batch(rng, i))
            except infeed.RunEnded:
                pass
        assert d.wait() == 0, d.log()
        got = {who: [] for who in subs}
        deadline = time.monotonic() + 3
        while not subs["admin"].ended and time.monotonic() < deadline:
            for who, s in subs.items():
                try:
                    got[who].append(s.recv())
                except TimeoutError:
                    pass
        assert got["admin"] and got["admin"][-1]["event"] == "end", got["admin"]
        assert got["stranger"] == [] and got["plain"] == [], got
        assert "publish socket: refused a CURVE peer" in d.log()
    finally:
        for s in subs.values():
            s.close()


# ---- the C client ---------------------------------------------------------------------------

def test_c_producer_with_curve(curve_daemon, keys):
    exe = c_producer()
    d = curve_daemon(steps=30, features=16, classes=4)
    kdir = keys["dir"]
    base = [exe, "--endpoint", d.listen, "--features", "16", "--classes", "4",
            "--server-key-file", str(kdir / "daemon.pub")]
    # a's key may not use another name: EPERM from hello, exit 1
    r = subprocess.run(base + ["--name", "c-producer", "--key-file", str(kdir / "a.key"),
                               "--batches", "5"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "loader-0" in r.stderr and "c-producer" in r.stderr, r.stderr
    r = subprocess.run(base + ["--name", "loader-0", "--key-file", str(kdir / "a.key"),
                               "--batches", "1000"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert d.wait() == 0, d.log()
    assert d.end_summary()["global_step"] == 30


def test_refused_clients_hear_why(curve_daemon, keys, rng, tmp_path):
    """When the connect timeout ends, a client the daemon refuses is told so, one without the
    CURVE the daemon requires is told that it may require it, and a CURVE client that hears
    nothing at all that the daemon may refuse its key: never only "is infeedd running there?".
    The Python client and the C example (its hello timeout and its connect timeout alike)."""
    d = curve_daemon(steps=1000)
    limit = rng.uniform(0.5, 1.0)
    dead = dead_tcp_endpoint()
    cases = [  # (who, endpoint, words the sentence must have)
        ("stranger", d.listen, ": it refused this client's CURVE key"),
        (None, d.listen, ": the handshake failed: it may require CURVE (give server_key_file= "
                         "and key_file=)"),
        ("a", dead, f"; is infeedd running with --listen {dead}, or does it refuse this "
                    "client's key (CURVE)?"),
    ]
    for who, endpoint, words in cases:
        kw = {} if who is None else dict(server_key=keys["server"], keypair=keys[who])
        with pytest.raises(TimeoutError) as e:
            infeed.Producer(endpoint, name="x", timeout=30, schema=SCHEMA, connect_timeout=limit,
                            **kw)
        assert f"no daemon answered at {endpoint} within {limit:g} s (connect_timeout)" \
            f"{words}" in str(e.value), (who, str(e.value))
    s = infeed.Subscriber(d.publish, connect_timeout=limit, server_key=keys["server"],
                          keypair=keys["stranger"])
    with pytest.raises(TimeoutError, match="it refused this client's CURVE key"):
        s.recv()
    s.close()
    # the C example: a key file of the stranger's key pair
    stranger = tmp_path / "stranger.key"
    stranger.write_text(f"public-key {keys['stranger'][0]}\nsecret-key {keys['stranger'][1]}\n")
    ms = int(limit * 1000)
    base = [c_producer(), "--features", str(FEATURES), "--classes", str(CLASSES),
            "--connect-timeout", str(ms)]
    curve = ["--server-key-file", str(keys["dir"] / "daemon.pub")]
    for args, endpoint, words in [
            (curve + ["--key-file", str(stranger)], d.listen, cases[0][2]),
            ([], d.listen, ": the handshake failed: it may require CURVE (set server_key_file "
                           "and key_file)"),
            (curve + ["--key-file", str(keys["dir"] / "a.key")], dead, cases[2][2])]:
        r = subprocess.run(base + args + ["--endpoint", endpoint], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert f"producer: no daemon answered at {endpoint} within {ms / 1000:g} s " \
            f"(connect_timeout_ms){words}" in r.stderr, (args, r.stderr)


# ---- config errors --------------------------------------------------------------------------

def one_sentence(r, *fragments):
    out = r.stdout + r.stderr
    assert r.returncode == 2, f"exit {r.returncode}, expected 2:\n{out}"
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line:\n{r.stderr}"
    for f in fragments:  # a key given as a flag is named as the flag (--curve-secret-key)
        assert f in lines[0] or "--" + f.replace("_", "-") in lines[0], \
            f"{f!r} not in {lines[0]!r}"


def test_key_file_errors_exit_2(keys, tmp_path):
    k = keys["flags"]
    base = ["--features", "4", "--classes", "2", "--steps", "1"]
    bad = tmp_path / "bad"
    bad.write_text(f"{keys['a'][0]} x,\n")
    cases = [
        (dict(k, curve_secret_key=str(tmp_path / "missing.key")), ["curve_secret_key",
                                                                   "missing.key"]),
        (dict(k, curve_secret_key=str(tmp_path / "daemon.pub")), ["daemon.pub", "line 1"]),
        (dict(k, authorized_keys=str(bad)), ["authorized_keys", "bad", "line 1", "comma"]),
        (dict(k, admin_keys=str(tmp_path / "authorized")), ["admin_keys", "line 2", "no"]),
        (dict(k, authorized_keys=str(tmp_path / "nope")), ["authorized_keys", "cannot open"]),
        ({"authorized_keys": k["authorized_keys"]}, ["authorized_keys", "curve_secret_key"]),
        ({"curve_secret_key": k["curve_secret_key"]}, ["authorized_keys", "expected a file"]),
    ]
    for flags, fragments in cases:
        argv = list(base)
        for name, v in flags.items():
            argv += ["--" + name.replace("_", "-"), v]
        one_sentence(run_infeedd(*argv), *fragments)


def test_non_loopback_needs_keys_or_insecure(keys):
    port = free_ports(1)[0]
    base = ["--features", "4", "--classes", "2", "--steps", "1"]
    # refused before anything is bound (nothing connects to this endpoint)
    for flag in ("--listen", "--publish", "--control"):
        one_sentence(run_infeedd(*base, flag, f"tcp://0.0.0.0:{port}"), f"tcp://0.0.0.0:{port}",
                     "--insecure", flag[2:])
    one_sentence(run_infeedd(*base, "--listen", "tcp://*:5555"), "--insecure")
    # --insecure passes the check: this run then stops at the next check (eval mode without a
    # checkpoint, exit 2 before any bind), so no wildcard socket is ever opened
    cfg = keys["dir"] / "c.json"
    cfg.write_text(json.dumps({"listen": f"tcp://0.0.0.0:{port}", "insecure": True,
                               "mode": "eval"}))
    for args in (["--mode", "eval", "--insecure", "--listen", f"tcp://0.0.0.0:{port}"],
                 ["--config", str(cfg)]):
        r = run_infeedd(*base, *args)
        assert r.returncode == 2 and "eval mode evaluates a checkpoint" in r.stderr, r.stderr
        assert "--insecure: no socket is authenticated" in r.stderr, r.stderr
    # ipc:// is local
    r = run_infeedd(*base, "--mode", "eval", "--listen", "ipc:///tmp/never-bound.sock")
    one_sentence(r, "eval mode evaluates a checkpoint")


def test_python_key_options(keys, tmp_path):
    """The Python client's key arguments: bad ones raise naming the argument, before any
    socket connects."""
    srv = keys["server"]
    with pytest.raises(ValueError, match="server_key"):
        infeed.Producer("tcp://127.0.0.1:1", keypair=keys["a"])
    with pytest.raises(ValueError, match="keypair, key_file"):
        infeed.Subscriber("tcp://127.0.0.1:1", server_key=srv)
    with pytest.raises(ValueError, match="40 Z85"):
        infeed.Producer("tcp://127.0.0.1:1", server_key=srv[:-1], keypair=keys["a"])
    with pytest.raises(ValueError, match="not the secret key's"):
        infeed.Producer("tcp://127.0.0.1:1", server_key=srv, keypair=(keys["a"][0],
                                                                      keys["b"][1]))
    with pytest.raises(ValueError, match="key pair file"):
        infeed.Producer("tcp://127.0.0.1:1", server_key_file=keys["dir"] / "a.key",
                        key_file=keys["dir"] / "a.key")
    p = infeed.Producer("tcp://127.0.0.1:1", server_key_file=keys["dir"] / "daemon.pub",
                        key_file=keys["dir"] / "a.key", timeout=0.1)
    assert p.socket.getsockopt(zmq.MECHANISM) == zmq.CURVE
    p.close()
