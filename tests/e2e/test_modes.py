"""Input modes end to end: per-core with one producer per replica (HELLO's replica), a bad replica,
the status and the watchdog naming a starving replica; per-host-v2 and broadcast once each."""

import threading
import time

import numpy as np
import pytest

import infeed
from helpers import stream_until_end, wait_log
from rawpeer import RawPeer, hello


def batch_maker(seed: int, rows: int, features: int, classes: int):
    nrng = np.random.default_rng(seed)

    def make(i):
        return {"x": nrng.random((rows, features), dtype=np.float32),
                "y": nrng.integers(0, classes, rows, dtype=np.int32)}
    return make


def run_producers(endpoint: str, makers: list, replicas_of: list, names: list) -> list:
    """One thread per producer, each streaming until the run ends; returns [(producer, sent)]."""
    out: list = [None] * len(makers)
    errors: list = []

    def go(i):
        try:
            out[i] = stream_until_end(endpoint, makers[i], name=names[i], replica=replicas_of[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(makers))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    return out


def test_per_core_trains_to_the_exact_step(daemon, rng):
    replicas = rng.randint(2, 4)
    per = rng.randint(1, 5)
    steps = rng.randint(5, 80)
    ipl = rng.randint(1, 20)
    features, classes = rng.randint(1, 6), rng.randint(2, 5)
    print(f"replicas {replicas} rows {per} steps {steps} ipl {ipl}")
    d = daemon(replicas=replicas, batch_size=per * replicas, steps=steps, iterations_per_loop=ipl,
               summary_every=0, features=features, classes=classes, input_mode="per-core",
               expect_producers=replicas)
    makers = [batch_maker(rng.randrange(1 << 30), per, features, classes) for _ in range(replicas)]
    res = run_producers(d.listen, makers, list(range(replicas)),
                        [f"core-{r}" for r in range(replicas)])
    assert d.wait() == 0, d.log()
    for r, (p, sent) in enumerate(res):
        assert p.welcome["batch_size"] == per and p.welcome["replica"] == r, p.welcome
        assert p.welcome["global_batch_size"] == per * replicas
        assert p.bye["status"] == "ok" and p.bye["reason"] == "last_step", p.bye
        assert p.bye["global_step"] == steps
        # every step took exactly one batch of every replica's stream
        assert p.bye["acked_seq"] == steps - 1, (r, p.bye)
        assert sent >= steps
    end = d.end_summary()
    assert end["status"] == "ok" and end["global_step"] == steps, end
    train = [s for s in d.summaries() if s["event"] == "train"]
    assert sum(s["examples"] for s in train) == steps * per * replicas


def test_hello_replica_is_checked(daemon):
    d = daemon(replicas=3, batch_size=6, steps=5, features=2, classes=2, input_mode="per-core")
    schema = [{"name": "x", "dtype": "float32", "shape": [2]},
              {"name": "y", "dtype": "int32", "shape": []}]
    peer = RawPeer(d.listen)
    for replica, got in [(3, "the integer 3"), (-1, "the integer -1"), ("1", "a string"),
                         (None, "got no key")]:
        extra = {} if replica is None else {"replica": replica}
        peer.send(hello(schema, "bad", **extra))
        e = peer.error()
        assert e["code"] == "EINVAL" and e["credit"] == 0, e
        assert "replica" in e["message"] and "0 to 2" in e["message"], e["message"]
        assert got in e["message"], e["message"]
    # a good one is welcomed with the per-replica batch size
    p = infeed.Producer(d.listen, schema=schema, replica=2, timeout=5)
    assert p.welcome["replica"] == 2 and p.welcome["batch_size"] == 2, p.welcome
    p.close()
    # and per-host takes no replica
    d2 = daemon(replicas=2, batch_size=4, steps=5, features=2, classes=2)
    with pytest.raises(infeed.InfeedError) as ei:
        infeed.Producer(d2.listen, schema=schema, replica=0, timeout=5)
    assert ei.value.code == "EINVAL" and "per-host" in ei.value.message, ei.value.message
    d.signal()
    d2.signal()


def test_status_names_the_starving_replica(daemon, rng):
    replicas = rng.randint(2, 3)
    starving = rng.randrange(replicas)
    per, steps = 2, 12
    d = daemon(replicas=replicas, batch_size=per * replicas, steps=steps, iterations_per_loop=4,
               features=3, classes=2, input_mode="per-core", expect_producers=replicas)
    others = [r for r in range(replicas) if r != starving]
    makers = {r: batch_maker(rng.randrange(1 << 30), per, 3, 2) for r in range(replicas)}
    res: dict = {}

    def go(r):
        res[r] = stream_until_end(d.listen, makers[r], name=f"core-{r}", replica=r)

    ts = [threading.Thread(target=go, args=(r,), daemon=True) for r in others]
    for t in ts:
        t.start()
    status = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = d.control({"cmd": "status"})
        queued = status["batch_queue_per_replica"]
        if status["starving_replica"] == starving and all(queued[r] > 0 for r in others):
            break
        time.sleep(0.05)
    assert status["starving_replica"] == starving, status
    assert status["infeed_waiting"] and status["infeed_waiting_replica"] == starving, status
    assert status["batch_queue_per_replica"][starving] == 0, status
    assert status["global_step"] == 0, status
    assert {p["name"]: p["replica"] for p in status["producers"]} == \
        {f"core-{r}": r for r in others}, status
    # the watchdog says so in the log after 5 s
    wait_log(d, f"replica {starving} is starving")
    # the missing producer comes: the run goes to its last step
    t = threading.Thread(target=go, args=(starving,), daemon=True)
    t.start()
    for t2 in ts + [t]:
        t2.join(60)
    assert d.wait() == 0, d.log()
    assert d.end_summary()["global_step"] == steps
    for r in range(replicas):
        assert res[r][0].bye["acked_seq"] == steps - 1, (r, res[r][0].bye)


@pytest.mark.parametrize("mode", ["per-host-v2", "broadcast"])
def test_one_stream_modes(daemon, rng, mode):
    replicas = rng.randint(2, 4)
    per = rng.randint(1, 5)
    steps = rng.randint(3, 60)
    features, classes = rng.randint(1, 6), rng.randint(2, 5)
    print(f"{mode}: replicas {replicas} rows {per} steps {steps}")
    d = daemon(replicas=replicas, batch_size=per * replicas, steps=steps,
               iterations_per_loop=rng.randint(1, 10), summary_every=0, features=features,
               classes=classes, input_mode=mode)
    p, sent = stream_until_end(d.listen, batch_maker(rng.randrange(1 << 30), per, features,
                                                    classes))
    assert d.wait() == 0, d.log()
    assert p.welcome["batch_size"] == per and p.welcome["input_mode"] == mode
    per_step = replicas if mode == "per-host-v2" else 1
    assert p.bye["reason"] == "last_step" and p.bye["global_step"] == steps, p.bye
    assert p.bye["acked_seq"] == steps * per_step - 1, p.bye
    train = [s for s in d.summaries() if s["event"] == "train"]
    # broadcast: every replica trains on the same rows, counted once
    assert sum(s["examples"] for s in train) == steps * per * per_step
    # a batch of the global size is refused, naming the rows a batch has in this mode
    d2 = daemon(replicas=replicas, batch_size=per * replicas, steps=1, features=features,
                classes=classes, input_mode=mode)
    raw = infeed.Producer(d2.listen, schema=[("x", "float32", [features]), ("y", "int32", [])],
                          timeout=5)
    assert raw.batch_size == per
    with pytest.raises(ValueError):
        raw.send(x=np.zeros((per * replicas, features), np.float32),
                 y=np.zeros(per * replicas, np.int32))
    raw.close()
    d2.signal()


def test_per_host_v2_needs_credit_for_a_step():
    from conftest import run_infeedd
    r = run_infeedd("--input-mode", "per-host-v2", "--replicas", "4", "--batch-size", "8",
                    "--credit", "3", "--steps", "1", "--features", "2", "--classes", "2")
    assert r.returncode == 2, r
    assert "credit" in r.stderr and "per-host-v2" in r.stderr and "at least 4, got 3" in r.stderr, \
        r.stderr
