"""Tensor messages on the PUB socket (docs/summaries.md, "Tensor messages"): the Python client's
side against a fake publisher (an XPUB socket, so that the test waits for the subscriptions
themselves, never for a time), and then against the daemon.

- Subscriber(tensors=[...]) subscribes to the summaries ("{") and to "tensor:NAME" for each name;
  it yields (global_step, {name: array}) for the steps whose tensors all arrived, skips a step
  with one missing, ignores a tensor another subscriber asked for, keeps the summaries in .last
  and stops at the end summary;
- host_call runs fn(**tensors) on every step;
- bad names and damaged messages are refused with a sentence.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import zmq

import infeed
from infeed.subscriber import parse_tensor


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

    def tensor(self, name: str, step: int, a: np.ndarray) -> None:
        h = {"event": "tensor", "mode": "train", "name": name, "global_step": step,
             "dtype": str(a.dtype), "shape": list(a.shape)}
        self.sock.send_multipart([b"tensor:" + name.encode(), json.dumps(h).encode(),
                                  np.ascontiguousarray(a).tobytes()])

    def summary(self, obj: dict) -> None:
        self.sock.send(json.dumps(obj).encode())

    def close(self):
        self.sock.close(0)
        self.ctx.term()


def random_array(rng: random.Random, rows: int) -> np.ndarray:
    shape = (rows,) + tuple(rng.randint(1, 4) for _ in range(rng.randint(0, 2)))
    if rng.random() < 0.5:
        return np.random.default_rng(rng.randint(0, 1 << 30)).standard_normal(shape).astype(
            np.float32)
    return np.random.default_rng(rng.randint(0, 1 << 30)).integers(-9, 9, shape).astype(np.int32)


@pytest.mark.parametrize("seed", range(3))
def test_subscriber_groups_tensors_by_step(seed):
    rng = random.Random(seed)
    pub = FakePublisher()
    names = [f"t{i}" for i in range(rng.randint(1, 3))]
    sub = infeed.Subscriber(pub.endpoint, timeout=10, tensors=names)
    try:
        pub.wait_subscriptions({b"{"} | {b"tensor:" + n.encode() for n in names})
        sent = {}
        for step in range(1, rng.randint(3, 12)):
            rows = rng.randint(1, 9)
            arrays = {n: random_array(rng, rows) for n in names}
            drop = rng.random() < 0.3  # a message the daemon dropped: the step is skipped
            for i, n in enumerate(names):
                if drop and i == len(names) - 1:
                    continue
                pub.tensor(n, step, arrays[n])
                # another subscriber's tensor whose name starts like ours
                pub.tensor(n + "_other", step, arrays[n])
            if not drop:
                sent[step] = arrays
            if step % 3 == 0:
                pub.summary({"event": "train", "global_step": step})
        pub.summary({"event": "end", "global_step": 99})
        got = dict(sub)
        assert sorted(got) == sorted(sent)
        for step, arrays in sent.items():
            assert sorted(got[step]) == sorted(names)
            for n in names:
                assert got[step][n].dtype == arrays[n].dtype
                np.testing.assert_array_equal(got[step][n], arrays[n])
        assert sub.last == {"event": "end", "global_step": 99}
    finally:
        sub.close()
        pub.close()


def test_host_call_runs_the_function_on_every_step():
    pub = FakePublisher()
    sub = infeed.Subscriber(pub.endpoint, timeout=10, tensors=["x", "y"])
    try:
        pub.wait_subscriptions({b"{", b"tensor:x", b"tensor:y"})
        rng = np.random.default_rng(7)
        want = {}
        for step in range(1, 6):
            x = rng.standard_normal((4, 3)).astype(np.float32)
            y = rng.integers(0, 3, (4,)).astype(np.int32)
            pub.tensor("x", step, x)
            pub.tensor("y", step, y)
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
    h = json.dumps({"event": "tensor", "name": "x", "global_step": 3, "dtype": "float32",
                    "shape": [2, 3]}).encode()
    with pytest.raises(ValueError, match=r"float32 \[2, 3\] is 24 bytes, the message has 20"):
        parse_tensor([b"tensor:x", h, b"\0" * 20])
    with pytest.raises(ValueError, match="bad header"):
        parse_tensor([b"tensor:x", b"{not json", b""])
    sub = infeed.Subscriber("tcp://127.0.0.1:1", connect_timeout=None)
    with pytest.raises(ValueError, match="asks for no tensors"):
        next(infeed.host_call(sub, lambda: None))
    sub.close()
