"""The Python client against a fake ROUTER (no daemon needed): framing, credit, errors, END/BYE."""

import struct
import time

import numpy as np
import pytest
import zmq

import infeed
from infeed import protocol as P
from fake_daemon import FakeDaemon, SOFTMAX_SCHEMA, batch


def test_protocol_layouts():
    assert P.pack_header(P.HELLO) == b"IFDP\x01\x00\x01\x00"
    h = P.pack_batch_header(seq=17, rows=64, ntensors=2)
    assert len(h) == 32
    assert h[:8] == b"IFDP\x01\x00\x03\x00"
    assert struct.unpack_from("<qqII", h, 8) == (17, 64, 0, 2)
    assert P.unpack_batch_header(h) == (17, 64, 0, 2)
    a = P.pack_ack(5, 1)
    assert len(a) == 24 and struct.unpack_from("<qII", a, 8) == (5, 1, 0)
    assert P.unpack_ack(a) == (5, 1)
    c = P.pack_credit(3)
    assert len(c) == 16 and P.unpack_credit(c) == 3
    with pytest.raises(P.ProtocolError, match="magic"):
        P.unpack_header(b"XXXX\x01\x00\x01\x00")
    with pytest.raises(P.ProtocolError, match="version: expected 1, got 2"):
        P.unpack_header(b"IFDP\x02\x00\x01\x00")
    with pytest.raises(P.ProtocolError, match="at least 8"):
        P.unpack_header(b"IFDP")
    m = P.unpack_message([P.pack_header(P.ERROR), b'{"code":"ESHAPE","seq":3,"credit":1,'
                                                   b'"message":"m","new_key":1}'])
    assert (m.type, m.seq, m.credit, m.body["code"]) == (P.ERROR, 3, 1, "ESHAPE")
    assert P.unpack_message([P.pack_header(42)]).type == 42  # unknown types are left to the caller


def test_prediction_decoder_refuses_bad_descriptions():
    """A PREDICTION whose description is malformed or whose shape claims more bytes than 2^63
    raises ProtocolError (not KeyError, ValueError or a wrapped size), and a good one decodes."""
    rng = np.random.default_rng()
    rows, k = int(rng.integers(1, 9)), int(rng.integers(1, 17))
    x = rng.random((rows, k), dtype=np.float32)
    hdr = struct.pack("<4sHHqqII", b"IFDP", 1, P.PREDICTION, 7, rows, 0, 1)

    def frames(desc, data=x.tobytes()):
        return [hdr, __import__("json").dumps(desc).encode(), data]

    m = P.unpack_message(frames([{"name": "p", "dtype": "float32", "shape": [k]}]))
    assert m.seq == 7 and np.array_equal(m.arrays["p"], x)
    # 2^62 + 1 rows' worth: np.prod would wrap to a small product
    big = [{"name": "p", "dtype": "float32", "shape": [1 << 31, 1 << 31, k]}]
    bad = [big, [{"dtype": "float32", "shape": [k]}], [{"name": "p", "dtype": "f16",
           "shape": [k]}], [{"name": "p", "dtype": "float32", "shape": [-1]}],
           [{"name": "p", "dtype": "float32", "shape": ["4"]}], ["p"]]
    for desc in bad:
        with pytest.raises(P.ProtocolError, match="PREDICTION: tensor"):
            P.unpack_message(frames(desc))


def test_stream_and_end():
    with FakeDaemon(credit=3, ack_delay=0.01) as d:
        with infeed.Producer(d.endpoint, name="p0", timeout=5) as p:
            sent = []
            for i in range(10):
                x, y = batch(seed=i)
                sent.append((x.copy(), y.copy()))
                assert p.send(x=x, y=y) == i
                assert p.credit >= 0
            assert p.welcome["batch_size"] == 8 and p.batch_size == 8
        assert p.bye["status"] == "ok"
        assert p.acked_seq == 9 and p.unacked == []
        # no schema in HELLO: the producer took the program's from WELCOME
        assert "schema" not in d.hellos[0] and p.schema == SOFTMAX_SCHEMA
        assert d.hellos[0]["name"] == "p0" and d.hellos[0]["first_seq"] == 0
        assert d.in_flight_max <= 3
        assert [b[0] for b in d.batches] == list(range(10))
        for (seq, rows, frames), (x, y) in zip(d.batches, sent):
            assert rows == 8
            assert frames[0] == x.astype("<f4").tobytes() and frames[1] == y.astype("<i4").tobytes()
        assert d.ends == 1


def test_mapping_order_conversion_and_first_seq():
    with FakeDaemon(credit=2) as d:
        p = infeed.Producer(d.endpoint, schema=[("x", np.float32, (4,)), ("y", "int32", ())],
                            first_seq=100, timeout=5)
        assert p.welcome is not None and p.next_seq == 100  # eager HELLO
        x, y = batch()
        # mapping order differs from the schema; a Fortran-ordered, big-endian x is fixed up
        xf = np.asfortranarray(x.astype(">f4"))
        assert p.send({"y": y.tolist(), "x": xf}) == 100
        p.wait()
        assert d.batches[0][2][0] == x.tobytes()
        assert d.batches[0][2][1] == y.astype("<i4").tobytes()
        assert p.acked_seq == 100
        p.end()
        p.close()


def test_type_and_shape_errors_are_local():
    with FakeDaemon() as d:
        p = infeed.Producer(d.endpoint, timeout=5)
        x, y = batch()
        with pytest.raises(TypeError, match="tensor 'x': expected dtype float32, got float64.*"
                                            "round_floats=True"):
            p.send(x=x.astype(np.float64), y=y)  # float64 rounds: only when asked
        p.send(x=x, y=y)
        big = y.astype(np.int64)
        big[3] = 1 << 32
        with pytest.raises(TypeError, match="tensor 'y': expected dtype int32, got int64 holding "
                                            "values from [0-2] to 4294967296, which do not fit"):
            p.send(x=x, y=big)
        with pytest.raises(TypeError, match="tensor 'y'.*not whole numbers"):
            p.send(x=x, y=[0.5] * 8)
        with pytest.raises(ValueError, match=r"tensor 'x': expected shape \(rows, 4\)"):
            p.send(x=x[:, :3], y=y)
        with pytest.raises(ValueError, match="missing 'y'"):
            p.send(x=x)
        with pytest.raises(ValueError, match="unknown 'z'"):
            p.send(x=x, y=y, z=y)
        with pytest.raises(ValueError, match="5 rows, the daemon's batch_size is 8"):
            p.send(x=x[:5], y=y[:5])
        p.send(x=x, y=y)
        p.end()
        p.close()
        assert len(d.batches) == 2


def test_hello_error_raises_with_code():
    with FakeDaemon() as d:
        with pytest.raises(infeed.InfeedError) as ei:
            infeed.Producer(d.endpoint, schema=[("x", "float32", (5,)), ("y", "int32", ())],
                            timeout=5)
        assert ei.value.code == "ESHAPE" and ei.value.seq is None
        assert "schema" in ei.value.message


def test_async_batch_error_raised_from_next_call():
    def reject(seq, frames):
        return ("ERANGE", f"batch {seq}: label out of range") if seq == 2 else None

    with FakeDaemon(credit=8, reject=reject) as d:
        p = infeed.Producer(d.endpoint, timeout=5)
        x, y = batch()
        for _ in range(3):
            p.send(x=x, y=y)
        with pytest.raises(infeed.InfeedError) as ei:
            p.wait()
        assert (ei.value.code, ei.value.seq) == ("ERANGE", 2)
        assert "label out of range" in ei.value.message
        assert not isinstance(ei.value, infeed.RunEnded)
        p.wait()  # the error was raised once; the daemon goes on
        p.send(x=x, y=y)
        assert p.end()["status"] == "ok"
        p.close()
        assert [b[0] for b in d.batches] == [0, 1, 3]


def test_credit_blocks_then_times_out():
    with FakeDaemon(credit=2, ack_delay=3600) as d:  # never acks
        p = infeed.Producer(d.endpoint, timeout=0.3)
        x, y = batch()
        p.send(x=x, y=y)
        p.send(x=x, y=y)
        assert p.credit == 0
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="waiting for credit"):
            p.send(x=x, y=y)
        assert time.monotonic() - t0 < 2
        assert p.unacked == [0, 1]
        p.close()


def test_no_daemon_times_out():
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.ROUTER)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    s.close(0)
    with pytest.raises(TimeoutError, match="WELCOME"):
        infeed.Producer(f"tcp://127.0.0.1:{port}", schema=SOFTMAX_SCHEMA, timeout=0.2)


def test_run_ends_while_streaming():
    with FakeDaemon(credit=2, last_step=5, ack_delay=0.01) as d:
        p = infeed.Producer(d.endpoint, timeout=5)
        x, y = batch()
        n = 0
        with pytest.raises(infeed.RunEnded) as ei:
            for _ in range(1000):
                p.send(x=x, y=y)
                n += 1
        assert ei.value.code == "ECLOSED"
        assert n >= 5 and n < 1000
        assert p.end()["reason"] == "last_step"  # no error from end() after the run ended
        p.close()


def test_subscriber_iterates_until_end():
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = infeed.Subscriber(f"tcp://127.0.0.1:{port}", timeout=2)
    assert pub.poll(5000) and pub.recv() == b"\x01{"  # its subscription: no slow joiner
    pub.send(b'{"event":"train","global_step":10,"loss":0.5,"accuracy":0.75,'
             b'"examples_per_sec":1000}')
    pub.send(b'{"event":"end","global_step":10,"status":"ok","reason":"last_step"}')
    got = list(sub)
    assert [s["event"] for s in got] == ["train", "end"]
    assert infeed.format_summary(got[0]) == "step 10  loss 0.500  accuracy 0.750  1000 ex/s"
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0.05)
    sub.close()
    pub.close(0)
