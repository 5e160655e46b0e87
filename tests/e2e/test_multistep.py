"""Multi-step messages (docs/protocol.md, BATCH): a BATCH of k x batch_size rows is k steps in one
message. The same steps sent as messages of random sizes train exactly as one batch a message;
the message costs k credits and is acknowledged step by step; rows the daemon cannot split are
refused naming max_steps_per_message; a run resumed from a checkpoint written between the steps
of a message takes only the steps it had not consumed."""

import signal

import numpy as np

import ckpt
import infeed
from infeed import protocol as P
from helpers import steps_data, wait_until
from rawpeer import RawPeer, batch_frames, hello

D, K = 5, 3


def split(rng, n: int, most: int) -> list[int]:
    """n steps cut into messages of 1..most steps, in random sizes."""
    out = []
    while n:
        k = rng.randint(1, min(most, n))
        out.append(k)
        n -= k
    return out


def train(daemon, flags, x, y, batch, sizes, acks=None):
    d = daemon(**flags)
    p = infeed.Producer(d.listen, name="loader", timeout=20,
                        on_ack=(acks.append if acks is not None else None))
    row = 0
    for k in sizes:
        seq = p.send(x=x[row:row + k * batch], y=y[row:row + k * batch])
        assert p.next_seq == seq + k
        row += k * batch
    p.wait()
    assert p.credit == p.welcome["credit"], (p.credit, p.welcome)
    p.end()
    p.close()
    assert d.wait() == 0, d.log()
    return [s for s in d.summaries() if s["event"] == "train"], p


def test_messages_of_several_steps_train_as_single_steps(daemon, rng):
    replicas = rng.choice([1, 2])
    batch = replicas * rng.randint(1, 6)
    most = rng.randint(2, 9)
    n = rng.randint(20, 60)
    flags = dict(replicas=replicas, batch_size=batch, features=D, classes=K, steps=n,
                 iterations_per_loop=rng.randint(1, 7), summary_every=1,
                 max_steps_per_message=most, seed=rng.randint(1, 1000))
    sizes = split(rng, n, most)
    print(f"replicas {replicas} batch {batch} max {most} steps {n} messages {sizes}")
    x, y = steps_data(rng.randrange(1 << 30), n, batch, D, K)
    one, p1 = train(daemon, flags, x, y, batch, [1] * n)
    acks = []
    many, p2 = train(daemon, flags, x, y, batch, sizes, acks)
    assert [s["global_step"] for s in many] == list(range(1, n + 1))
    assert [s["loss"] for s in many] == [s["loss"] for s in one]  # the same bits
    assert [s["accuracy"] for s in many] == [s["accuracy"] for s in one]
    assert p2.welcome["max_steps_per_message"] == most
    # acknowledged step by step: every seq once, in order (on_ack gets each acked message)
    starts = np.cumsum([0] + sizes[:-1]).tolist()
    assert acks == starts, (acks, starts)
    assert p2.acked_seq == n - 1 and not p2.unacked


def test_rows_and_credit_of_a_multistep_message_are_checked(daemon, rng):
    most = rng.randint(2, 6)
    batch = rng.randint(1, 5)
    credit = 2 * most + rng.randint(0, most - 2)
    d = daemon(replicas=1, batch_size=batch, features=D, classes=K, steps=100000,
               iterations_per_loop=1000, summary_every=0, credit=credit,
               max_steps_per_message=most, initial_infeed_sleep=30)
    r = np.random.default_rng(rng.randrange(1 << 30))
    schema = [P.schema_entry("x", "float32", [D]), P.schema_entry("y", "int32", [])]

    def frames(seq, k, rows=None):
        rows = rows if rows is not None else k * batch
        return batch_frames(seq, [r.random((rows, D), dtype=np.float32),
                                  r.integers(0, K, rows, dtype=np.int32)])

    peer = RawPeer(d.listen)
    peer.send(hello(schema, name="raw"))
    w = peer.welcome()
    assert w["credit"] == credit and w["max_steps_per_message"] == most
    for bad_rows in (batch * (most + 1), batch * 2 + 1 if batch > 1 else None):
        if bad_rows is None:
            continue
        peer.send(frames(0, 1, rows=bad_rows))
        e = peer.error()
        assert e["code"] == "ESHAPE" and e["credit"] == 1, e
        assert f"up to {most} x {batch} (max_steps_per_message" in e["message"], e
        assert f"got {bad_rows}" in e["message"], e
    # a message of `most` steps, then the same again: a whole resent message is a duplicate,
    # its credits come back with a CREDIT (the daemon sleeps before its first batch: nothing is
    # acknowledged meanwhile)
    peer.send(frames(0, most))
    peer.send(frames(0, most))
    peer.until(lambda: peer.credits, "CREDIT")
    assert peer.credits == [most], peer.credits
    # another `most`, then a message of one step more than the credit left
    peer.send(frames(most, most))
    left = credit - 2 * most
    k = left + 1
    peer.send(frames(2 * most, k))
    e = peer.error()
    assert e["code"] == "EPROTO" and e["credit"] == k, e
    assert (f"its {k} steps need {k} credits, {left} are left" if k > 1
            else "no credit left") in e["message"], e
    assert not peer.acks, peer.acks
    peer.close()


def test_resume_between_the_steps_of_a_message(daemon, tmp_path, rng):
    """Checkpoints fall inside messages (loops of 3 steps, messages of 2 or more): a run killed
    and resumed, its producer replaying with skip_consumed (which sends a partly consumed
    message again whole), trains every step exactly once: the same end checkpoint as a run
    never interrupted."""
    batch, most, last = 4, rng.randint(2, 5), 30
    sizes = []
    while sum(sizes) < last:
        sizes.append(min(rng.randint(2, most), last - sum(sizes)))
    x, y = steps_data(rng.randrange(1 << 30), last, batch, D, K)
    cuts = np.cumsum([0] + sizes).tolist()
    msgs = [{"x": x[a * batch:b * batch], "y": y[a * batch:b * batch]}
            for a, b in zip(cuts[:-1], cuts[1:])]
    print(f"max {most} messages {sizes}")

    def flags(folder):
        return dict(replicas=1, batch_size=batch, features=D, classes=K, last_step=last,
                    iterations_per_loop=3, summary_every=0, checkpoint_dir=str(folder),
                    checkpoint_every=3, optimizer="adam", learning_rate=0.05, seed=3,
                    max_steps_per_message=most)

    def replay(d):
        """Every message from where the daemon wants them, then END; the run ends well."""
        p = infeed.Producer(d.listen, name="loader", timeout=20)
        for m in p.skip_consumed(msgs):
            p.send(m)
        p.end()
        p.close()
        assert d.wait() == 0, d.log()

    replay(daemon(**flags(tmp_path / "ref")))
    want = ckpt.read(ckpt.files(tmp_path / "ref")[-1])

    folder = tmp_path / "run"
    d1 = daemon(**flags(folder))
    p1 = infeed.Producer(d1.listen, name="loader", timeout=20)
    # stop sending after message `upto`: the loops that can complete end at step `target`,
    # chosen inside a message (its last checkpoint then falls between two of its steps)
    cands = [u for u in range(1, len(msgs)) if cuts[u] >= 3 and cuts[u] // 3 * 3 not in cuts]
    assert cands, cuts
    upto = rng.choice(cands)
    for m in msgs[:upto]:
        p1.send(m)
    target = cuts[upto] // 3 * 3
    wait_until((folder / f"ckpt-{target:012d}.ifdckpt").exists, f"checkpoint {target}", d1)
    d1.signal(signal.SIGKILL)
    d1.wait()
    p1.close()
    saved = ckpt.read(ckpt.files(folder)[-1])
    consumed = saved["producers"]["loader"]
    assert saved["global_step"] == target and consumed == target - 1, (saved, target)
    print(f"killed after {upto} messages; checkpoint at step {saved['global_step']}, "
          f"loader consumed up to {consumed}")

    replay(daemon(**dict(flags(folder), resume=True)))
    got = ckpt.read(ckpt.files(folder)[-1])
    assert got["global_step"] == last and got["producers"] == {"loader": last - 1}, got
    assert np.array_equal(got["params"], want["params"]), "resumed run differs"
