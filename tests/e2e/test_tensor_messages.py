"""Tensor messages on the PUB socket (docs/summaries.md, "Tensor messages"): the Python client's
side against a fake publisher (an XPUB socket, so that the test waits for the subscriptions
themselves, never for a time), and then against the daemon.

- Subscriber(tensors=[...]) subscribes to the summaries ("{") and to "tensor:NAME" for each name;
  from messages that each hold several steps of one tensor (rows differing between steps) it
  yields (global_step, {name: array}) for the steps whose tensors all arrived, in step order,
  skips a step with one missing, ignores a tensor another subscriber asked for, keeps the
  summaries in .last and stops at the end summary;
- host_call runs fn(**tensors) on every step;
- bad names and damaged messages are refused with a sentence;
- the daemon (the probe program, $INFEED_PROBE_PLUGIN, outfeeds its inputs x3 and y1) publishes
  every step's tensors concatenated over the replicas, in order, for R = 1, 2, 4 and the input
  modes per-host, per-core and broadcast: what numpy computes from the batches sent, for random
  batch sizes and loop lengths (1 among them); on the wire (a raw SUB socket) a message holds
  several steps of a loop, its header's steps and rows match its data, and no message holds a
  step beyond the summary that follows it.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading

import numpy as np
import pytest
import zmq

import infeed
from helpers import sanitized, stream_until_end, wait_until
from infeed.subscriber import parse_tensor

PROBE = os.environ.get("INFEED_PROBE_PLUGIN")


class FakePublisher:
    """An XPUB on a free loopback port that reports the subscriptions it has seen."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()

    def wait_subscriptions(self, topics: set) -> None:
        seen = set()
        while not topics <= seen:
            assert self.sock.poll(10000), f"subscriptions seen {seen}, expected {topics}"
            m = self.sock.recv()
            if m[:1] == b"\x01":
                seen.add(m[1:])

    def tensor(self, name: str, steps, arrays) -> None:
        """One message of tensor name: the steps' arrays (rows may differ), as the daemon sends
        them (docs/summaries.md, "Tensor messages")."""
        h = {"event": "tensor", "mode": "train", "name": name, "dtype": str(arrays[0].dtype),
             "row_shape": list(arrays[0].shape[1:]), "global_steps": list(steps),
             "rows": [a.shape[0] for a in arrays]}
        self.sock.send_multipart([b"tensor:" + name.encode(), json.dumps(h).encode(),
                                  b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)])

    def summary(self, obj: dict) -> None:
        self.sock.send(json.dumps(obj).encode())

    def close(self):
        self.sock.close(0)
        self.ctx.term()


def random_layout(rng: random.Random):
    """A tensor's dtype and row shape (they stay for the run; the rows change)."""
    return (np.float32 if rng.random() < 0.5 else np.int32,
            tuple(rng.randint(1, 4) for _ in range(rng.randint(0, 2))))


def random_array(rng: random.Random, rows: int, layout) -> np.ndarray:
    dt, row_shape = layout
    g = np.random.default_rng(rng.randint(0, 1 << 30))
    if dt == np.float32:
        return g.standard_normal((rows,) + row_shape).astype(np.float32)
    return g.integers(-9, 9, (rows,) + row_shape).astype(np.int32)


def chunks(rng: random.Random, steps: list) -> list:
    """steps cut into runs of random length: the messages of one loop (a byte cap cuts them)."""
    out, i = [], 0
    while i < len(steps):
        n = rng.randint(1, len(steps) - i)
        out.append(steps[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", range(4))
def test_subscriber_groups_tensors_by_step(seed):
    rng = random.Random(seed)
    pub = FakePublisher()
    names = [f"t{i}" for i in range(rng.randint(1, 3))]
    layouts = {n: random_layout(rng) for n in names}
    sub = infeed.Subscriber(pub.endpoint, timeout=10, tensors=names, shm=False)
    try:
        pub.wait_subscriptions({b"{"} | {b"tensor:" + n.encode() for n in names})
        sent = {}
        step, loops = 1, rng.randint(1, 6)
        for _ in range(loops):  # a loop's steps, then each tensor's messages, then maybe a summary
            steps = list(range(step, step + rng.randint(1, 9)))
            step = steps[-1] + 1
            arrays = {}
            for s in steps:
                rows = rng.randint(0, 9)  # rows differ from step to step
                arrays[s] = {n: random_array(rng, rows, layouts[n]) for n in names}
            have = {s: set() for s in steps}
            for n in names:
                for part in chunks(rng, steps):
                    # another subscriber's tensor whose name starts like ours
                    pub.tensor(n + "_other", part, [arrays[s][n] for s in part])
                    if rng.random() < 0.25:
                        continue  # a message the daemon dropped: its steps are skipped
                    pub.tensor(n, part, [arrays[s][n] for s in part])
                    for s in part:
                        have[s].add(n)
            for s in steps:
                if len(have[s]) == len(names):
                    sent[s] = arrays[s]
            if rng.random() < 0.5:
                pub.summary({"event": "train", "global_step": steps[-1]})
        pub.summary({"event": "end", "global_step": 99})
        got = list(sub)
        assert [s for s, _ in got] == sorted(sent)  # every complete step, in step order
        for s, arrays in got:
            assert sorted(arrays) == sorted(names)
            for n in names:
                assert arrays[n].dtype == sent[s][n].dtype
                assert arrays[n].shape == sent[s][n].shape
                np.testing.assert_array_equal(arrays[n], sent[s][n])
        assert sub.last == {"event": "end", "global_step": 99}
    finally:
        sub.close()
        pub.close()


def test_subscriber_keeps_a_bounded_number_of_incomplete_steps():
    """A tensor whose every message is lost, and no summary: the other tensor's steps wait for it,
    at most MAX_PENDING_STEPS of them (the oldest are skipped); a later step whose tensors all
    arrive is still yielded."""
    rng = random.Random(7)
    pub = FakePublisher()
    sub = infeed.Subscriber(pub.endpoint, timeout=10, tensors=["a", "x"], shm=False)
    most = []
    settle = sub._settle
    sub._settle = lambda every=False: (settle(every), most.append(len(sub._pending)))
    try:
        pub.wait_subscriptions({b"{", b"tensor:a", b"tensor:x"})
        bound = infeed.Subscriber.MAX_PENDING_STEPS
        last = bound + rng.randint(100, 3000)
        one = np.zeros((1, 1), np.float32)
        for first in range(1, last + 1, 256):  # "a" alone: x's messages are all lost
            part = list(range(first, min(first + 256, last + 1)))
            pub.tensor("a", part, [one] * len(part))
        pub.tensor("a", [last + 1], [one])
        pub.tensor("x", [last + 1], [one])
        pub.summary({"event": "end", "global_step": last + 1})
        got = list(sub)
        assert [s for s, _ in got] == [last + 1]
        assert max(most) <= bound and max(most) >= bound - 256, (max(most), bound)
    finally:
        sub.close()
        pub.close()


def test_host_call_runs_the_function_on_every_step():
    pub = FakePublisher()
    sub = infeed.Subscriber(pub.endpoint, timeout=10, tensors=["x", "y"], shm=False)
    try:
        pub.wait_subscriptions({b"{", b"tensor:x", b"tensor:y"})
        rng = np.random.default_rng(7)
        want = {}
        for step in range(1, 6):
            x = rng.standard_normal((4, 3)).astype(np.float32)
            y = rng.integers(0, 3, (4,)).astype(np.int32)
            pub.tensor("x", [step], [x])
            pub.tensor("y", [step], [y])
            want[step] = float((x.argmax(axis=1) == y).mean())
        pub.summary({"event": "end"})
        got = dict(infeed.host_call(sub, lambda x, y: float((x.argmax(axis=1) == y).mean())))
        assert got == want
    finally:
        sub.close()
        pub.close()


def test_bad_names_and_messages_are_refused():
    with pytest.raises(TypeError, match="a list of names"):
        infeed.Subscriber("tcp://127.0.0.1:1", tensors="loss")
    with pytest.raises(ValueError, match="at most 7"):
        infeed.Subscriber("tcp://127.0.0.1:1", tensors=[f"t{i}" for i in range(8)])
    with pytest.raises(ValueError, match="1 to 63 bytes"):
        infeed.Subscriber("tcp://127.0.0.1:1", tensors=["x" * 64])
    h = {"event": "tensor", "name": "x", "dtype": "float32", "row_shape": [3],
         "global_steps": [3, 4], "rows": [2, 1]}
    with pytest.raises(ValueError, match=r"steps 3 to 4: 3 rows of float32 \[3\] are 36 bytes, "
                                         r"the message has 20"):
        parse_tensor([b"tensor:x", json.dumps(h).encode(), b"\0" * 20])
    with pytest.raises(ValueError, match="bad header"):
        parse_tensor([b"tensor:x", b"{not json", b""])
    with pytest.raises(ValueError, match="2 global_steps and 1 rows"):
        parse_tensor([b"tensor:x", json.dumps(dict(h, rows=[2])).encode(), b""])
    with pytest.raises(ValueError, match="rows: expected a list of whole numbers"):
        parse_tensor([b"tensor:x", json.dumps(dict(h, rows=[2, -1])).encode(), b""])
    with pytest.raises(ValueError, match="bad header.*'row_shape'"):  # the one-step format
        parse_tensor([b"tensor:x", json.dumps({"event": "tensor", "name": "x", "global_step": 3,
                                               "dtype": "float32", "shape": [2]}).encode(),
                      b"\0" * 8])
    sub = infeed.Subscriber("tcp://127.0.0.1:1", connect_timeout=None)
    with pytest.raises(ValueError, match="asks for no tensors"):
        next(infeed.host_call(sub, lambda: None))
    sub.close()


# ---- the daemon ----------------------------------------------------------------------------------

def probe_batch(producer: int, seq: int, rows: int, classes: int) -> dict:
    """Batch seq of a producer: every value says where it comes from."""
    r = np.arange(rows, dtype=np.float32)
    x = np.stack([np.full(rows, seq, np.float32), np.full(rows, producer, np.float32), r], axis=1)
    return {"x": x / 64, "y": ((seq + producer + np.arange(rows)) % classes).astype(np.int32)}


class RawTensors:
    """A raw SUB socket on the daemon's PUB: every message as it came, tensor or summary."""

    def __init__(self, endpoint: str, names: list):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"{")
        for n in names:  # in order: the daemon reads them in order
            self.sock.setsockopt(zmq.SUBSCRIBE, b"tensor:" + n.encode())
        self.sock.connect(endpoint)
        self.got = []  # ("summary", dict) or ("tensor", header, data bytes)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while self.sock.poll(30000):
            f = self.sock.recv_multipart()
            if len(f) == 1:
                s = json.loads(f[0])
                self.got.append(("summary", s))
                if s.get("event") == "end":
                    return
            else:
                self.got.append(("tensor", json.loads(f[1]), f[2], f[0]))

    def close(self):
        self.thread.join(30)
        self.sock.close(0)


def check_wire(got: list, names: list, dtypes: dict, row_bytes: dict, steps: int, ipl: int,
               summary_every: int) -> None:
    """The messages of a run as a raw SUB socket got them: each tensor's steps 1..steps once, in
    order, several to a message where a loop holds several; the header's rows match the data's
    size; no message holds a step beyond the summary after it, nor a step a summary before it
    covered."""
    seen = {n: [] for n in names}
    covered = 0  # the last train summary's global step
    for i, m in enumerate(got):
        if m[0] == "summary":
            if m[1].get("event") == "train":
                covered = m[1]["global_step"]
            continue
        _, h, data, topic = m
        n = h["name"]
        assert topic == b"tensor:" + n.encode() and n in names, h
        gs, rows = h["global_steps"], h["rows"]
        assert len(gs) == len(rows) >= 1 and h["dtype"] == dtypes[n], h
        assert len(data) == sum(rows) * row_bytes[n], (h, len(data))
        assert gs == list(range(gs[0], gs[0] + len(gs))), h  # consecutive
        assert gs[0] > covered, f"{n} steps {gs} after the summary of step {covered}"
        nxt = next((x[1] for x in got[i + 1:] if x[0] == "summary"), None)
        assert nxt is not None and gs[-1] <= nxt["global_step"], (h, nxt)
        # within one loop (loops of ipl steps from step 1) and one summary window
        assert (gs[0] - 1) // ipl == (gs[-1] - 1) // ipl, (h, ipl)
        if summary_every:
            assert (gs[0] - 1) // summary_every == (gs[-1] - 1) // summary_every, h
        seen[n].append(gs)
    for n in names:
        assert [s for gs in seen[n] for s in gs] == list(range(1, steps + 1)), (n, seen[n])
        if ipl > 1 and summary_every != 1:
            assert max(len(gs) for gs in seen[n]) > 1, (n, seen[n])


@pytest.mark.parametrize("replicas,mode,loop", [
    (1, "per-host", "random"), (2, "per-host", "random"), (4, "per-host", "random"),
    (2, "per-host", 1), (2, "per-core", "random"), (4, "per-core", "random"),
    (2, "broadcast", "random"), (4, "broadcast", 1)])
def test_daemon_publishes_the_concatenated_tensors(daemon, rng, replicas, mode, loop):
    if not PROBE:
        pytest.skip("the probe plugin is not built (set INFEED_PROBE_PLUGIN)")
    rows = rng.randint(1, 4) * (replicas if mode == "per-host" else 1)
    classes, steps = rng.randint(2, 5), rng.randint(3, 40)
    ipl = rng.randint(2, 8) if loop == "random" else loop
    summary_every = rng.choice([0, 2, 3, 5, 7])
    producers = replicas if mode == "per-core" else 1
    d = daemon(program_lib=PROBE, program="probe", features=3, classes=classes,
               batch_size=rows * (1 if mode == "per-host" else replicas), replicas=replicas,
               input_mode=mode, steps=steps, iterations_per_loop=ipl, learning_rate=0.001,
               summary_every=summary_every, expect_producers=producers)
    names = ["x3", "y1", "loss", "grad_norm"]
    sub = infeed.Subscriber(d.publish, timeout=30, tensors=names)
    # the wire itself: a fifth name, asked for last, says its other subscriptions were read
    raw_names = ["x3", "loss", "learning_rate"]
    raw = RawTensors(d.publish, raw_names)
    try:
        # the event: the daemon has read the five names' subscriptions
        wait_until(lambda: d.control({"cmd": "status"})["tensor_messages"]["subscribed"] == 5,
                   "the daemon sees the tensor subscriptions", d)
        ts = [threading.Thread(target=stream_until_end, daemon=True,
                               args=(d.listen, lambda i, p=p: probe_batch(p, i, rows, classes)),
                               kwargs=dict(name=f"p{p}", replica=p if mode == "per-core" else None))
              for p in range(producers)]
        for t in ts:
            t.start()
        got = list(sub)
        for t in ts:
            t.join(30)
        assert d.wait() == 0, d.log()
    finally:
        sub.close()
        raw.close()
    print(f"ipl {ipl}, summary_every {summary_every}, {steps} steps: "
          f"{sum(m[0] == 'tensor' for m in raw.got)} tensor messages on the raw socket")
    assert [s for s, _ in got] == list(range(1, steps + 1)), [s for s, _ in got]
    got = dict(got)
    per_replica = 1 if mode == "broadcast" else replicas
    check_wire(raw.got, raw_names, {"x3": "float32", "loss": "float32", "learning_rate": "float32"},
               {"x3": 12, "loss": 4, "learning_rate": 4}, steps, ipl, summary_every)
    wire_loss = [np.frombuffer(m[2], np.float32) for m in raw.got
                 if m[0] == "tensor" and m[1]["name"] == "loss"]
    np.testing.assert_array_equal(np.concatenate(wire_loss),
                                  np.concatenate([got[s]["loss"] for s in range(1, steps + 1)]))
    assert all(r == per_replica for m in raw.got if m[0] == "tensor" and m[1]["name"] == "loss"
               for r in m[1]["rows"])
    for step in range(1, steps + 1):
        seq = step - 1
        if mode == "per-core":  # every replica's batch of this step, in replica order
            want = [probe_batch(p, seq, rows, classes) for p in range(replicas)]
        else:  # per-host: the batch's rows split in order; broadcast: replica 0's copy
            want = [probe_batch(0, seq, rows, classes)]
        t = got[step]
        np.testing.assert_array_equal(t["x3"], np.concatenate([w["x"] for w in want]))
        np.testing.assert_array_equal(t["y1"], np.concatenate([w["y"] for w in want]))
        assert t["x3"].dtype == np.float32 and t["y1"].dtype == np.int32
        # one loss a replica (broadcast: replica 0's), one global gradient norm a step
        assert t["loss"].shape == ((1,) if mode == "broadcast" else (replicas,)), t["loss"]
        assert t["grad_norm"].shape == (1,) and np.isfinite(t["grad_norm"]).all()
    st = d.summaries()
    assert st[-1]["event"] == "end" and st[-1]["status"] == "ok", st[-1]


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_subscriber_that_never_reads_stays_within_the_logged_bound(daemon, rng):
    """A subscriber asks for a large tensor and reads nothing: the daemon drops what it cannot
    send, and its memory grows by no more than the bound it logs (the outbox and one
    subscriber's queue of the largest message), while far more than that was published."""
    if not PROBE:
        pytest.skip("the probe plugin is not built (set INFEED_PROBE_PLUGIN)")
    rows = rng.choice([1024, 2048, 4096])
    d = daemon(program_lib=PROBE, program="probe", features=3, classes=2, batch_size=rows,
               steps=10 ** 9, iterations_per_loop=50, summary_every=0, learning_rate=0.001,
               credit=8, host_call="none",
               tensor_rate=1 << 30)  # no byte rate in the way: far more than the bound goes out
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.SUBSCRIBE, b"tensor:x3")
    sub.connect(d.publish)
    try:
        wait_until(lambda: d.control({"cmd": "status"})["tensor_messages"]["subscribed"] == 1,
                   "the daemon sees the subscription", d)
        nrng = np.random.default_rng(rng.randrange(1 << 30))
        batch = {"x": nrng.standard_normal((rows, 3)).astype(np.float32),
                 "y": nrng.integers(0, 2, rows, dtype=np.int32)}
        p = infeed.Producer(d.listen, name="flood", timeout=30)
        p.send(batch)
        wait_until(lambda: d.control({"cmd": "status"})["global_step"] >= 1, "a first step", d)
        base = rss_mib(d.proc.pid)
        want_bytes = 0
        st = {}
        while want_bytes < 200 * 2 ** 20:  # far beyond the bound: 200 MiB offered
            for _ in range(50):
                p.send(batch)
            st = d.control({"cmd": "status"})
            want_bytes = st["global_step"] * rows * 12
        tm = st["tensor_messages"]
        grown = rss_mib(d.proc.pid) - base
        p.close()
        d.control({"cmd": "stop"})
        assert d.wait(60) == 0, d.log()
    finally:
        sub.close(0)
    m = re.search(r"hold at most ([\d.]+) MiB waiting in the outbox and ([\d.]+) MiB a "
                  r"subscriber.*and (\d+) KiB a tensor asked for.*and ([\d.]+) MiB of sent "
                  r"messages' buffers kept", d.log(tail=None))
    assert m, d.log()
    bound = (float(m.group(1)) + float(m.group(2)) + tm["subscribed"] * int(m.group(3)) / 1024
             + float(m.group(4)))
    print(f"rows {rows}: grew {grown:.1f} MiB, bound {bound:.1f} MiB, messages {tm}")
    # messages and the steps they held (a message holds one or more steps)
    assert tm["sent_steps"] >= tm["sent"] > 0 and tm["limited_steps"] >= tm["limited"], tm
    assert tm["dropped_steps"] >= tm["dropped"] and tm["pending_bytes"] >= 0, tm
    # far more went out than the bound holds (ZeroMQ drops silently what the queue cannot take)
    assert tm["sent"] * tm["largest"] > 4 * bound * 2 ** 20, (tm, bound)
    # the bound, and 16 MiB for the rest (batches in flight, the allocator's slack); a
    # sanitizer's allocator keeps what is freed (its quarantine), so there only the logged bound
    # and the publishing are checked
    assert sanitized() or grown <= bound + 16, (grown, bound, tm)
