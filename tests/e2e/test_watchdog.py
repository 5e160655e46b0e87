"""The watchdog (--watchdog), the ring depths in the control status, and the infeed's initial
sleep (--initial-infeed-sleep) against a real daemon."""

import re
import time

import numpy as np

import infeed
from helpers import status_until

D, K, B = 4, 3, 8


def batch(i: int) -> dict:
    r = np.random.default_rng(i)
    return {"x": r.random((B, D), dtype=np.float32), "y": r.integers(0, K, B, dtype=np.int32)}


def test_stalled_producer_trips_the_watchdog(daemon):
    """A producer sends a few batches and then nothing, without END: the daemon exits 1 once no
    step completed for --watchdog seconds, with a sentence that says what starves."""
    d = daemon(replicas=2, features=D, classes=K, batch_size=B, iterations_per_loop=5,
               steps=100, watchdog=1, summary_every=0)
    p = infeed.Producer(d.listen, name="stalls", timeout=20)
    for i in range(3):
        p.send(batch(i))
    st = status_until(d, lambda s: s["global_step"] == 3)
    assert st["global_step"] == 3, st
    # While it starves: the status shows each replica's rings, the infeeds empty.
    rings = st["rings"]
    assert [r["replica"] for r in rings] == [0, 1], st
    for r in rings:
        assert (r["infeed"], r["infeed_capacity"], r["outfeed_capacity"]) == (0, 16, 64), r
        assert 0 <= r["outfeed"] <= r["outfeed_capacity"], r
    t0 = time.monotonic()
    assert d.wait(15) == 1, d.log()
    assert time.monotonic() - t0 < 5
    log = d.log()
    want = ("the run ended with an error: watchdog: no step completed for 1 s (global step 3): "
            "the infeeds of replicas 0 and 1 are empty (waiting for input); no outfeed ring is "
            "full; 1 producer connected, 0 ended")
    assert want in log, log
    end = d.end_summary()
    assert (end["status"], end["global_step"]) == ("error", 3), end
    assert end["error"].startswith("watchdog: no step completed") and "ETIMEDOUT" in end["code"]
    p.close()


def test_watchdog_off_by_default_and_a_producer_that_ends_is_not_starving(daemon):
    """Without --watchdog a stalled run waits; with it, a producer that sends END ends the run
    well (input ended) rather than tripping the watchdog."""
    d = daemon(replicas=1, features=D, classes=K, batch_size=B, iterations_per_loop=2,
               steps=100, watchdog=0.5, summary_every=0)
    p = infeed.Producer(d.listen, name="ends", timeout=20)
    for i in range(3):
        p.send(batch(i))
    p.end()
    p.close()
    assert d.wait(15) == 0, d.log()
    end = d.end_summary()
    assert (end["status"], end["reason"], end["global_step"]) == ("ok", "input_ended", 3), end

    d = daemon(replicas=1, features=D, classes=K, batch_size=B, iterations_per_loop=2,
               steps=100, summary_every=0)
    p = infeed.Producer(d.listen, name="stalls", timeout=20)
    p.send(batch(0))
    # starving for 1.5 s by the daemon's own clock (a watchdog of 1 s would have ended it)
    status_until(d, lambda st: st["infeed_waiting_sec"] >= 1.5, what="1.5 s of starving")
    assert d.proc.poll() is None, d.log()
    assert d.control({"cmd": "stop"}) == {"ok": True}
    assert d.wait(15) == 0, d.log()
    p.close()


def test_initial_infeed_sleep_holds_the_first_step(daemon):
    d = daemon(replicas=2, features=D, classes=K, batch_size=B, iterations_per_loop=2, steps=4,
               initial_infeed_sleep=2, summary_every=0)
    t0 = time.monotonic()
    p = infeed.Producer(d.listen, name="early", timeout=20)
    for i in range(4):
        p.send(batch(i))
    st = status_until(d, lambda st: st["batches_accepted"] == 4, what="4 batches accepted")
    assert st["global_step"] == 0 or time.monotonic() - t0 >= 2, st
    p.end()
    assert d.wait(20) == 0, d.log()
    assert d.end_summary()["global_step"] == 4
    assert re.search(r"infeed: sleeping 2 s before the first batch", d.log()), d.log()
    p.close()
