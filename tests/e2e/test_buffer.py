"""Producer.buffer() / commit(): arrays filled in place and sent without a copy train exactly as
send() does; the buffers come back from a pool once their batch is acknowledged; misuse is a
ValueError naming what was expected."""

import numpy as np
import pytest

import infeed
from infeed import protocol as P
from helpers import steps_data

D, K = 6, 4
SCHEMA = [P.schema_entry("x", "float32", [D]), P.schema_entry("y", "int32", [])]


def test_buffer_commit_trains_as_send_and_reuses_buffers(daemon, rng):
    replicas = rng.choice([1, 2])
    batch = replicas * rng.randint(1, 5)
    most = rng.randint(1, 6)
    n = rng.randint(20, 50)
    flags = dict(replicas=replicas, batch_size=batch, features=D, classes=K, steps=n,
                 iterations_per_loop=rng.randint(1, 6), summary_every=1,
                 max_steps_per_message=most, seed=rng.randint(1, 999))
    x, y = steps_data(rng.randrange(1 << 30), n, batch, D, K)
    sizes = []
    while sum(sizes) < n:
        sizes.append(min(rng.randint(1, most), n - sum(sizes)))
    print(f"replicas {replicas} batch {batch} max {most} messages {sizes}")

    ref = daemon(**flags)
    p = infeed.Producer(ref.listen, name="loader", timeout=20)
    for i in range(n):
        p.send(x=x[i * batch:(i + 1) * batch], y=y[i * batch:(i + 1) * batch])
    p.end()
    p.close()
    assert ref.wait() == 0, ref.log()
    want = [s["loss"] for s in ref.summaries() if s["event"] == "train"]

    d = daemon(**flags)
    # the socket's pool of buffers (over shared memory buffer() hands out the pool's slots:
    # test_shared_memory_python.py)
    p = infeed.Producer(d.listen, name="loader", schema=SCHEMA, timeout=20, shm=False)
    row, seen = 0, []
    for k in sizes:
        a = p.buffer(k)
        assert a["x"].shape == (k * batch, D) and a["x"].dtype == np.float32
        assert a["y"].shape == (k * batch,) and a["y"].dtype == np.int32
        seen.append(a["x"])
        a["x"][:] = x[row:row + k * batch]
        a["y"][:] = y[row:row + k * batch]
        seq = p.commit()
        assert seq == row // batch
        row += k * batch
        p.wait()  # acknowledged: its arrays are free again
    p.end()
    p.close()
    assert d.wait() == 0, d.log()
    got = [s["loss"] for s in d.summaries() if s["event"] == "train"]
    assert got == want  # the same bits
    # one set of arrays per message size, reused after each ACK
    distinct = {id(a) for a in seen}
    assert len(distinct) == len(set(sizes)), (len(distinct), sizes)


@pytest.mark.parametrize("shm", [False, True])
def test_buffer_misuse(daemon, rng, shm):
    most = rng.randint(2, 5)
    batch = rng.randint(1, 4)
    d = daemon(replicas=1, batch_size=batch, features=D, classes=K, steps=100000,
               summary_every=0, max_steps_per_message=most)
    # no schema= and nothing sent: buffer() says HELLO and lays the arrays out by the WELCOME's
    q = infeed.Producer(d.listen, name="noschema", timeout=20, shm=shm)
    got = q.buffer()
    assert q.schema == SCHEMA and list(got) == ["x", "y"], (q.schema, list(got))
    assert got["x"].shape == (batch, D) and got["x"].dtype == np.float32, got["x"]
    assert got["y"].shape == (batch,) and got["y"].dtype == np.int32, got["y"]
    got["x"][:] = 1
    got["y"][:] = K - 1
    assert q.commit() == 0 and q.wait() == 0
    q.close()
    p = infeed.Producer(d.listen, name="p", schema=SCHEMA, timeout=20, shm=shm)
    assert p.transport == ("shm" if shm else "socket")
    with pytest.raises(ValueError, match="no buffer to commit"):
        p.commit()
    with pytest.raises(ValueError, match="max_steps_per_message"):
        p.buffer(most + 1)
    with pytest.raises(ValueError, match="steps: expected an int >= 1"):
        p.buffer(0)
    a = p.buffer(2)
    with pytest.raises(ValueError, match="not committed yet"):
        p.buffer()
    with pytest.raises(ValueError, match=rf"rows: expected 0 to {2 * batch}"):
        p.commit(rows=2 * batch + 1)
    assert p.commit(rows=0) is None  # dropped: back in the pool, nothing sent
    assert p.next_seq == 0
    b = p.buffer(2)
    if shm:  # the same slots
        assert np.shares_memory(b["x"], a["x"]) and b["x"].shape == a["x"].shape
    else:  # the same arrays
        assert b["x"] is a["x"]
    if batch > 1:  # train mode: whole steps only
        with pytest.raises(ValueError, match="max_steps_per_message"):
            p.commit(rows=batch + 1)
    b["x"][:] = 0
    b["y"][:] = 0
    assert p.commit(rows=batch) == 0 and p.next_seq == 1  # one step of the two
    p.close()
