"""Program ABI 4 end to end, through infeedd and the Python producer: int32 token ids of a
per-row shape (ids [T]) through the batch checks, per-host sharding over the replicas and the
device; the program's JSON settings (--program-config) and their record in checkpoints. The
tokens program (tests/util/tokens_program.c, loaded as a plugin) learns E[id] = target[id] over
every position until the loss is near 0, predicts target[ids] from its checkpoint; an id out of
range is refused with a sentence naming the tensor, row and element, in train and predict mode;
a resume with other settings is refused with a sentence."""

import json
import os

import numpy as np
import pytest

import infeed
from conftest import run_infeedd
from helpers import stream_until_end


def tokens_plugin() -> str:
    path = os.environ.get("INFEED_TOKENS_PLUGIN")
    if not path or not os.path.isfile(path):
        pytest.skip("the tokens plugin is not built (set INFEED_TOKENS_PLUGIN)")
    return path


def test_token_ids_train_predict_and_resume(daemon, rng, tmp_path):
    replicas = rng.choice([1, 2])
    vocab, block = rng.randint(2, 12), rng.randint(4, 16)
    batch = replicas * rng.randint(max(1, vocab // block), 6)
    steps = rng.randint(250, 350)
    settings = {"vocab": vocab, "block": block}
    print(f"replicas {replicas} batch {batch} vocab {vocab} block {block} steps {steps}")
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    target = nrng.uniform(-2, 2, vocab).astype(np.float32)

    def tokens(rows):
        ids = nrng.integers(0, vocab, (rows, block)).astype(np.int64)  # converted to int32
        return ids, target[ids]

    # lr 1: each step moves E[v] toward target[v] by its share of the positions (at most all)
    flags = dict(program_lib=tokens_plugin(), program="tokens",
                 program_config=json.dumps(settings), replicas=replicas, batch_size=batch,
                 iterations_per_loop=25, summary_every=25, learning_rate=1.0,
                 checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=0)
    d = daemon(steps=steps, **flags)
    p, _ = stream_until_end(d.listen, lambda i: dict(zip(("ids", "y"), tokens(batch))))
    assert d.wait() == 0, d.log()
    assert p.bye["status"] == "ok" and p.bye["global_step"] == steps, p.bye
    losses = [s["loss"] for s in d.summaries() if s["event"] == "train"]
    print("losses", losses)
    assert len(losses) >= 5 and all(np.isfinite(losses)), losses
    assert losses[-1] < 1e-3 * losses[0], losses
    ck = infeed.checkpoint.load(tmp_path / "ck")
    assert ck.settings["program_config"] == settings
    assert ck.params["E"].shape == (vocab, 1)

    # predict from the checkpoint: E[ids] at every position, a partial batch padded
    ids = nrng.integers(0, vocab, (2 * batch + 1, block)).astype(np.int32)
    pd = daemon(mode="predict", steps=0, **dict(flags, checkpoint_every=None))
    with infeed.Producer(pd.listen, name="predict", timeout=20) as prod:
        for i in range(0, len(ids), batch):
            prod.send(ids=ids[i:i + batch])
        got = list(prod.predictions())
    assert pd.wait() == 0, pd.log()
    pred = np.concatenate([a["outputs"] if "outputs" in a else next(iter(a.values()))
                           for _, a in got])
    assert pred.shape == ids.shape, pred.shape
    np.testing.assert_allclose(pred, target[ids], atol=2e-2)

    # a resume with other settings: refused, naming program_config and both
    other = dict(settings, block=block + 1)
    r = run_infeedd("--program-lib", tokens_plugin(), "--program", "tokens", "--program-config",
                    json.dumps(other), "--steps", "5", "--batch-size", str(batch),
                    "--replicas", str(replicas), "--checkpoint-dir", str(tmp_path / "ck"),
                    "--resume", "--listen", "tcp://127.0.0.1:*", "--publish", "tcp://127.0.0.1:*",
                    "--control", "tcp://127.0.0.1:*")
    assert r.returncode == 2, r
    canon = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    assert f"checkpoint: program_config: the checkpoint has {canon}, this run " in r.stderr, \
        r.stderr


@pytest.mark.parametrize("mode", ["train", "predict"])
def test_an_id_out_of_range_is_refused(daemon, rng, mode):
    vocab, block, batch = rng.randint(2, 50), rng.randint(1, 10), rng.randint(1, 6)
    d = daemon(program_lib=tokens_plugin(), program="tokens", mode=mode,
               program_config=json.dumps({"vocab": vocab, "block": block}), batch_size=batch,
               steps=5 if mode == "train" else 0)
    ids = np.zeros((batch, block), np.int32)
    row, elem = rng.randrange(batch), rng.randrange(block)
    ids[row, elem] = vocab
    data = dict(ids=ids) if mode == "predict" else dict(ids=ids, y=np.zeros((batch, block),
                                                                             np.float32))
    p = infeed.Producer(d.listen, timeout=20)
    p.send(**data)
    with pytest.raises(infeed.InfeedError) as ei:
        p.wait()
    assert ei.value.code == "ERANGE", ei.value
    assert f"tensor 'ids' row {row} element {elem}: {vocab} is out of range, expected 0 <= " \
        f"value < {vocab}" in ei.value.message, ei.value.message
    p.close()
    d.kill()


def test_program_config_errors_exit_2():
    r = run_infeedd("--program-lib", tokens_plugin(), "--program", "tokens", "--program-config",
                    '{"vocab": 1}', "--steps", "5")
    assert r.returncode == 2, r
    assert r.stderr.strip() == "infeedd: program 'tokens': --program-config setting 'vocab': " \
        "expected an integer from 2 to 4096, got 1", r.stderr
