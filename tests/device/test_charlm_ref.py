"""tests/util/charlm_ref.py, the float64 reference of the program charlm, checked on its own:

- its hand-written gradients equal central finite differences of its loss, on random small
  shapes (1 or 2 layers, heads, head width, block, vocabulary, batch) with random parameters:
  every parameter's whole gradient along a random direction, and single entries of each;
- the attention is causal: tokens after position i change no logit at or before i (and do
  change the later ones);
- predict on the first k tokens is the full sequence's distribution at position k - 1;
- at the program's initialization the loss is near ln(vocab);
- its parameters are charlm_setup's (device/programs/charlm.c), by name and order, and
  flatten / unflatten lay them out as the program does (one vector, in that order).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "util"))
import charlm_ref as ref  # noqa: E402

SEEDS = range(8)


def random_case(seed: int, std: float = 0.4):
    """Random shapes, parameters (gains and biases too, not ones and zeros) and tokens."""
    rng = np.random.default_rng(seed)
    layers, heads = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    width = heads * int(rng.integers(1 if heads > 1 else 2, 5))  # width 1: a norm outputs 0
    block, vocab, batch = int(rng.integers(1, 7)), int(rng.integers(2, 10)), int(rng.integers(1, 4))
    t = int(rng.integers(1, block + 1))  # a sequence may be shorter than the block
    params = {}
    for name, shape, init in ref.param_specs(layers, width, block, vocab):
        base = 1.0 if init == "ones" else 0.0
        params[name] = base + rng.normal(0.0, std, shape)
    tokens = rng.integers(0, vocab, (batch, t))
    targets = rng.integers(0, vocab, (batch, t))
    return params, tokens, targets, heads, rng


@pytest.mark.parametrize("seed", SEEDS)
def test_gradients_equal_finite_differences(seed):
    params, tokens, targets, heads, rng = random_case(seed)
    value, grads = ref.loss_and_grads(params, tokens, targets, heads)
    assert value == pytest.approx(ref.loss(params, tokens, targets, heads), rel=1e-12)
    assert list(grads) == list(params)
    h = 1e-5

    def central(name, direction):
        plus = dict(params, **{name: params[name] + h * direction})
        minus = dict(params, **{name: params[name] - h * direction})
        return (ref.loss(plus, tokens, targets, heads)
                - ref.loss(minus, tokens, targets, heads)) / (2 * h)

    for name, p in params.items():
        g = grads[name]
        assert g.shape == p.shape, name
        u = rng.standard_normal(p.shape)  # the whole gradient, along a random direction
        fd = central(name, u)
        assert float((g * u).sum()) == pytest.approx(fd, rel=1e-6, abs=1e-9), name
        for _ in range(3):  # and single entries
            e = np.zeros(p.shape)
            idx = tuple(int(rng.integers(0, s)) for s in p.shape)
            e[idx] = 1.0
            assert float(g[idx]) == pytest.approx(central(name, e), rel=1e-6, abs=1e-9), \
                (name, idx)


def test_embedding_gradient_adds_repeated_tokens():
    """A token at several positions gets the sum of their gradients (np.add.at, not a store)."""
    params, _, _, heads, rng = random_case(100)
    b, t = 2, params["pos_emb"].shape[0]
    tokens = np.zeros((b, t), dtype=np.int64)  # token 0 everywhere
    targets = rng.integers(0, params["tok_emb"].shape[0], (b, t))
    _, grads = ref.loss_and_grads(params, tokens, targets, heads)
    u = np.zeros_like(params["tok_emb"])
    u[0] = rng.standard_normal(u.shape[1])
    h = 1e-5
    fd = (ref.loss(dict(params, tok_emb=params["tok_emb"] + h * u), tokens, targets, heads)
          - ref.loss(dict(params, tok_emb=params["tok_emb"] - h * u), tokens, targets, heads)) / (2 * h)
    assert float((grads["tok_emb"] * u).sum()) == pytest.approx(fd, rel=1e-6)
    assert not grads["tok_emb"][1:].any()


@pytest.mark.parametrize("seed", SEEDS)
def test_attention_is_causal(seed):
    params, tokens, _, heads, rng = random_case(seed)
    vocab, block = params["tok_emb"].shape[0], params["pos_emb"].shape[0]
    tokens = rng.integers(0, vocab, (tokens.shape[0], block))
    if block < 2:
        pytest.skip("one position: nothing after it")
    i = int(rng.integers(0, block - 1))
    other = tokens.copy()
    other[:, i + 1:] = (tokens[:, i + 1:] + 1) % vocab
    a, b = ref.logits(params, tokens, heads), ref.logits(params, other, heads)
    np.testing.assert_allclose(a[:, :i + 1], b[:, :i + 1], rtol=1e-12, atol=1e-12)
    assert np.abs(a[:, i + 1:] - b[:, i + 1:]).max() > 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_predict_is_the_last_positions_distribution(seed):
    params, tokens, _, heads, rng = random_case(seed)
    vocab, block = params["tok_emb"].shape[0], params["pos_emb"].shape[0]
    tokens = rng.integers(0, vocab, (tokens.shape[0], block))
    z = ref.logits(params, tokens, heads)
    for k in range(1, block + 1):
        p = ref.predict(params, tokens[:, :k], heads)
        assert p.shape == (tokens.shape[0], vocab)
        e = np.exp(z[:, k - 1] - z[:, k - 1].max(-1, keepdims=True))
        np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)


def test_initial_loss_is_near_log_vocab():
    rng = np.random.default_rng(5)
    for _ in range(3):
        layers, heads = int(rng.integers(1, 3)), int(rng.integers(1, 5))
        width, block, vocab = heads * int(rng.integers(4, 17)), int(rng.integers(4, 33)), 256
        params = ref.init_params(layers, width, block, vocab, rng)
        for name, shape, init in ref.param_specs(layers, width, block, vocab):
            assert params[name].shape == shape
            if init == "normal":
                assert params[name].std() == pytest.approx(ref.STD, rel=0.5)
            assert ref.no_decay(name) == (init != "normal"), name
        tokens = rng.integers(0, vocab, (2, block))
        targets = rng.integers(0, vocab, (2, block))
        assert ref.loss(params, tokens, targets, heads) == pytest.approx(math.log(vocab),
                                                                         abs=0.05)


def test_parameters_are_charlm_setups():
    """The names, ranks and initializers of device/programs/charlm.c's tables (first_params,
    layer_params per layer as h%lld.*, last_params), in its order (tests/e2e/test_charlm.py
    checks the daemon's checkpoint against param_specs too)."""
    src = (ROOT / "device" / "programs" / "charlm.c").read_text()
    inits = {"n": "normal", "z": "zeros", "o": "ones"}

    def table(name):
        body = src[src.index(f"charlm_param {name}"):]
        body = body[:body.index("};")]
        return [(n, int(r), inits[i]) for n, r, i in
                re.findall(r'\{"([^"]+)", (\d), [^}]*\'([nzo])\'\}', body)]
    layer = table("layer_params")
    got = table("first_params") + [(f"h0.{n}", r, i) for n, r, i in layer] + \
        table("last_params")
    expect = [(n, len(shape), init) for n, shape, init in ref.param_specs(1, 8, 4, 16)]
    assert got == expect


def test_flat_layout_round_trips():
    rng = np.random.default_rng(9)
    layers, width, block, vocab = 2, 6, 5, 7
    params = ref.init_params(layers, width, block, vocab, rng)
    flat = ref.flatten(params, layers, width, block, vocab)
    specs = ref.param_specs(layers, width, block, vocab)
    assert flat.size == sum(math.prod(s) for _, s, _ in specs)
    assert flat[:vocab * width].reshape(vocab, width).tolist() == params["tok_emb"].tolist()
    assert flat[-vocab:].tolist() == params["head.b"].tolist()
    back = ref.unflatten(flat, layers, width, block, vocab)
    assert list(back) == [n for n, _, _ in specs]
    for n in params:
        np.testing.assert_array_equal(back[n], params[n])
    with pytest.raises(ValueError, match="expected %d values" % flat.size):
        ref.unflatten(flat[:-1], layers, width, block, vocab)
