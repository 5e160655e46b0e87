"""Tensor messages in shared memory (docs/summaries.md, "Tensor messages in shared memory").

- Against the daemon (the probe program, $INFEED_PROBE_PLUGIN, outfeeds its inputs x3 and y1):
  a Python Subscriber on the daemon's host takes the tensors' data from the daemon's ring by
  itself (shm "auto", loopback tcp or ipc) and yields, every step, in order, arrays equal to a
  shm=False subscriber's (data messages) and to what numpy computes from the batches sent, for
  R = 1, 2, 4 and random batch sizes and loop lengths; with tensor_shm_bytes 0 the same
  subscriber gets data messages on its topic and the same arrays.
- Against a fake publisher and a ring file the test writes: a notice whose data was written
  over (the ring's `written` beyond seq + cap) is lost, counted, and its steps skipped while the
  next message's are yielded; a ring that cannot be opened makes "auto" ask for data messages
  instead ("tensor:NAME") and shm=True raise a sentence naming the ring.
- Under CURVE the notices come through the authenticated PUB socket as any message: a subscriber
  with an allowed key gets every step's labels from the ring; one with a key the daemon does not
  know gets nothing.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

import infeed
from helpers import curve_batch, curve_producer, stream_until_end, wait_until
from test_tensor_messages import FakePublisher, probe_batch

PROBE = os.environ.get("INFEED_PROBE_PLUGIN")
NAMES = ["x3", "y1", "loss", "grad_norm"]


def read_all(sub, out: list) -> None:
    out.extend(sub)


@pytest.mark.parametrize("replicas,ring,endpoint", [
    (1, True, "tcp"), (2, True, "ipc"), (4, True, "tcp"), (2, False, "tcp")])
def test_shm_subscriber_gets_what_a_data_subscriber_gets(daemon, rng, tmp_path, replicas, ring,
                                                         endpoint):
    if not PROBE:
        pytest.skip("the probe plugin is not built (set INFEED_PROBE_PLUGIN)")
    rows = rng.randint(1, 6) * replicas
    classes, steps, ipl = rng.randint(2, 5), rng.randint(20, 80), rng.randint(1, 9)
    # A subscriber slower than the run loses messages by design (ZeroMQ keeps 256 a subscriber),
    # and a loop sends one message a tensor: at most 30 loops of the 5 tensors each subscriber
    # asks for, so that a reader on a loaded machine still has every message (CI saw the shm
    # reader lose steps 52 to 64 of 64 with iterations_per_loop 1, and the end summary after them)
    steps = min(steps, 30 * ipl)
    publish = f"ipc://{tmp_path}/pub" if endpoint == "ipc" else None
    d = daemon(program_lib=PROBE, program="probe", features=3, classes=classes, batch_size=rows,
               replicas=replicas, steps=steps, iterations_per_loop=ipl, learning_rate=0.001,
               summary_every=rng.choice([0, 3, 7]), publish=publish,
               tensor_shm_bytes=None if ring else 0)
    # a last name of each (asked for after the others) says all of its subscriptions were read
    shm = infeed.Subscriber(d.publish, timeout=30, tensors=NAMES + ["param_norm"])
    tcp = infeed.Subscriber(d.publish, timeout=30, tensors=NAMES + ["learning_rate"], shm=False)
    assert shm.shm and not tcp.shm
    got_shm, got_tcp = [], []
    try:
        wait_until(lambda: d.control({"cmd": "status"})["tensor_messages"]["subscribed"] == 6,
                   "the daemon sees the tensor subscriptions", d)
        readers = [threading.Thread(target=read_all, args=(s, g), daemon=True)
                   for s, g in ((shm, got_shm), (tcp, got_tcp))]
        for t in readers:
            t.start()
        stream_until_end(d.listen, lambda i: probe_batch(0, i, rows, classes), name="p0")
        for t in readers:
            t.join(60)
        assert d.wait() == 0, d.log()
        assert shm.shm and shm.lost == 0
    finally:
        shm.close()
        tcp.close()
    assert [s for s, _ in got_shm] == list(range(1, steps + 1)), [s for s, _ in got_shm]
    assert [s for s, _ in got_tcp] == list(range(1, steps + 1)), [s for s, _ in got_tcp]
    for (step, a), (_, b) in zip(got_shm, got_tcp):
        for n in NAMES:
            assert a[n].dtype == b[n].dtype and a[n].shape == b[n].shape, (step, n)
            np.testing.assert_array_equal(a[n], b[n], err_msg=f"step {step} tensor {n}")
        want = probe_batch(0, step - 1, rows, classes)
        np.testing.assert_array_equal(a["x3"], want["x"])
        np.testing.assert_array_equal(a["y1"], want["y"])
        assert a["loss"].shape == (replicas,)
    log = d.log()
    assert "asked for tensor 'x3' in shared memory" in log, log
    assert ("tensor messages in shared memory: a ring of" in log) == ring, log


def test_curve_notices_reach_allowed_subscribers_only(curve_daemon, keys):
    steps = 30
    d = curve_daemon(steps=steps)
    sub = infeed.Subscriber(d.publish, timeout=30, server_key=keys["server"], keypair=keys["b"],
                            tensors=["label", "class"])
    stranger = infeed.Subscriber(d.publish, timeout=0.05, server_key=keys["server"],
                                 keypair=keys["stranger"], tensors=["confidence"])
    got, sent = [], []
    try:
        assert sub.shm
        wait_until(lambda: d.control({"cmd": "status"})["tensor_messages"]["subscribed"] == 2,
                   "the daemon sees the allowed subscriber's tensors", d)
        reader = threading.Thread(target=read_all, args=(sub, got), daemon=True)
        reader.start()
        rng = np.random.default_rng(5)
        with curve_producer(d, keys, "b", "p0") as p:
            try:
                for i in range(1000):
                    b = curve_batch(rng, i)
                    p.send(b)
                    sent.append(b["y"])
            except infeed.RunEnded:
                pass
        reader.join(60)
        assert d.wait() == 0, d.log()
        with pytest.raises(TimeoutError):
            stranger.recv_message()
    finally:
        sub.close()
        stranger.close()
    assert [s for s, _ in got] == list(range(1, steps + 1)), [s for s, _ in got]
    for step, t in got:
        np.testing.assert_array_equal(t["label"], sent[step - 1])
    assert "asked for tensor 'label' in shared memory" in d.log()
    assert "asked for tensor 'confidence'" not in d.log()


# ---- the client's reader against a ring the test writes ----

CAP = 1 << 16


class FakeRing:
    """A ring file laid out as the daemon's (0600): a 4096-byte header, then CAP data bytes."""

    def __init__(self, path, token: bytes):
        self.path, self.token = str(path), token
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        head = b"IFDRING1" + token + CAP.to_bytes(8, "little")
        os.write(fd, head.ljust(4096, b"\0") + bytes(CAP))
        os.close(fd)
        self.pos = 0

    def written(self, v: int) -> None:
        with open(self.path, "r+b") as f:
            f.seek(64)
            f.write(v.to_bytes(8, "little"))

    def put(self, data: bytes) -> int:
        """Writes data at the next position (the daemon's order: `written`, then the data)."""
        seq = self.pos
        self.pos += (len(data) + 63) // 64 * 64
        self.written(self.pos)
        with open(self.path, "r+b") as f:
            f.seek(4096 + seq % CAP)
            f.write(data)
        return seq


def notice(pub: FakePublisher, ring: FakeRing, name: str, steps, arrays, token=None) -> None:
    data = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    seq = ring.put(data)
    h = {"event": "tensor", "mode": "train", "name": name, "dtype": str(arrays[0].dtype),
         "row_shape": list(arrays[0].shape[1:]), "global_steps": list(steps),
         "rows": [a.shape[0] for a in arrays],
         "shm": {"path": ring.path, "size": 4096 + CAP, "token": (token or ring.token).hex(),
                 "seq": seq, "bytes": len(data)}}
    pub.sock.send_multipart([b"tensor-shm:" + name.encode(), json.dumps(h).encode()])


def test_a_message_written_over_is_lost_and_its_steps_skipped(tmp_path, rng):
    ring = FakeRing(tmp_path / "ring", os.urandom(16))
    pub = FakePublisher()
    sub = infeed.Subscriber(pub.endpoint, timeout=10, tensors=["t"])
    try:
        assert sub.shm  # loopback: the ring by default
        pub.wait_subscriptions({b"tensor-shm:t"})
        g = np.random.default_rng(rng.randint(0, 1 << 30))
        rows = [rng.randint(1, 30) for _ in range(6)]
        arrays = [g.standard_normal((r, 3)).astype(np.float32) for r in rows]
        notice(pub, ring, "t", [1, 2], arrays[0:2])
        notice(pub, ring, "t", [3, 4], arrays[2:4])
        assert sub.recv_step() is not None  # steps 1 and 2 read before anything is written over
        # the daemon goes round the ring past steps 3-4's message before the reader gets to it
        ring.pos += CAP
        notice(pub, ring, "t", [5, 6], arrays[4:6])
        pub.summary({"event": "end", "global_step": 6})
        got = [sub.recv_step()] + list(sub)
        assert [s for s, _ in got[1:]] == [5, 6] and got[0][0] == 2, [s for s, _ in got]
        np.testing.assert_array_equal(got[1][1]["t"], arrays[4])
        np.testing.assert_array_equal(got[2][1]["t"], arrays[5])
        assert sub.lost == 1
    finally:
        sub.close()
        pub.close()


@pytest.mark.parametrize("mode", ["auto", True])
def test_a_ring_that_cannot_be_opened(tmp_path, mode):
    ring = FakeRing(tmp_path / "ring", os.urandom(16))
    pub = FakePublisher()
    sub = infeed.Subscriber(pub.endpoint, timeout=10, tensors=["t"], shm=mode)
    try:
        pub.wait_subscriptions({b"tensor-shm:t"})
        a = np.arange(6, dtype=np.int32).reshape(2, 3)
        notice(pub, ring, "t", [1], [a], token=bytes(16))  # not the ring's token
        if mode is True:
            with pytest.raises(ValueError, match="tensor ring .* token"):
                sub.recv_message()
            return
        assert sub.recv_message().get("lost") and not sub.shm
        pub.wait_subscriptions({b"tensor:t"})  # asks for data messages now
        pub.tensor("t", [2], [a])
        pub.summary({"event": "end", "global_step": 2})
        got = list(sub)
        assert [s for s, _ in got] == [2]
        np.testing.assert_array_equal(got[0][1]["t"], a)
    finally:
        sub.close()
        pub.close()


def test_bad_shm_options_and_notices_are_refused(tmp_path):
    with pytest.raises(ValueError, match="shm: expected"):
        infeed.Subscriber("tcp://127.0.0.1:1", tensors=["t"], shm="yes")
    # not on this host: data messages, whatever "auto" would say on loopback
    assert not infeed.Subscriber("tcp://10.1.2.3:1", tensors=["t"], connect_timeout=None).shm
    pub = FakePublisher()
    sub = infeed.Subscriber(pub.endpoint, timeout=10, tensors=["t"])
    try:
        pub.wait_subscriptions({b"tensor-shm:t"})
        h = {"event": "tensor", "mode": "train", "name": "t", "dtype": "int32", "row_shape": [],
             "global_steps": [1], "rows": [1], "shm": {"path": str(tmp_path / "r"), "size": 1}}
        pub.sock.send_multipart([b"tensor-shm:t", json.dumps(h).encode()])
        with pytest.raises(ValueError, match="bad 'shm'.*path, size, token, seq and bytes"):
            sub.recv_message()
    finally:
        sub.close()
        pub.close()
