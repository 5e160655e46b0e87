"""A float64 numpy reference of the built-in program `charlm` (device/programs/charlm.c): the
forward loss, the gradient of every parameter (a hand-written backward pass) and predict's
output, to check the C program and a Keras model against.

The model (GPT-2, pre-layer-norm), over tokens and targets int [B, T], C = width, H = heads,
dh = C / H:

    x = tok_emb[tokens] + pos_emb[:T]
    per layer l:  h = LN1(x);  qkv = h Wqkv + bqkv  ([C, 3C]: the q, k, v thirds; head i's
                  columns [i dh, (i + 1) dh) within each third)
                  x += attention(qkv) Wproj + bproj   (causal, scores scaled by 1 / sqrt(dh))
                  x += gelu(LN2(x) Wfc + bfc) Wout + bout   (fc 4C wide, the exact GELU)
    logits = LN_f(x) Whead + bhead ([C, V]);  loss = mean over the B T positions of the softmax
    cross-entropy against targets

with layer norms of eps 1e-5 over the biased variance. Parameters are a dict by the program's
names (param_specs gives them in the program's order, with shapes, initializers and whether
weight decay applies; flatten and unflatten convert to and from the program's layout, one
vector in that order, as a checkpoint holds it). Used by tests/device/test_charlm_ref.py (finite differences) and
bench/keras_charlm.py's check (the Keras model is the same model).
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np
from scipy.special import erf

EPS = 1e-5
STD = 0.02

LAYER_PARAMS = ("ln1.g", "ln1.b", "qkv.W", "qkv.b", "proj.W", "proj.b", "ln2.g", "ln2.b",
                "fc.W", "fc.b", "out.W", "out.b")


def param_specs(layers: int, width: int, block: int, vocab: int) -> List[Tuple[str, tuple, str]]:
    """(name, shape, init) in charlm_setup's order; init is "normal" (std 0.02), "zeros" or
    "ones". Parameters whose init is not "normal" (biases, norms) have no weight decay."""
    c = width
    specs = [("tok_emb", (vocab, c), "normal"), ("pos_emb", (block, c), "normal")]
    shapes = {"ln1.g": ((c,), "ones"), "ln1.b": ((c,), "zeros"),
              "qkv.W": ((c, 3 * c), "normal"), "qkv.b": ((3 * c,), "zeros"),
              "proj.W": ((c, c), "normal"), "proj.b": ((c,), "zeros"),
              "ln2.g": ((c,), "ones"), "ln2.b": ((c,), "zeros"),
              "fc.W": ((c, 4 * c), "normal"), "fc.b": ((4 * c,), "zeros"),
              "out.W": ((4 * c, c), "normal"), "out.b": ((c,), "zeros")}
    for layer in range(layers):
        for p in LAYER_PARAMS:
            specs.append((f"h{layer}.{p}",) + shapes[p])
    specs += [("ln_f.g", (c,), "ones"), ("ln_f.b", (c,), "zeros"),
              ("head.W", (c, vocab), "normal"), ("head.b", (vocab,), "zeros")]
    return specs


def no_decay(name: str) -> bool:
    """Whether the program flags this parameter IFD_PARAM_NO_DECAY (biases and norms)."""
    return name.endswith((".b", ".g"))


def init_params(layers: int, width: int, block: int, vocab: int,
                rng: np.random.Generator, std: float = STD) -> Dict[str, np.ndarray]:
    """Parameters drawn as the program declares them (normal(0, std), zeros, ones), float64."""
    out = {}
    for name, shape, init in param_specs(layers, width, block, vocab):
        if init == "normal":
            out[name] = rng.normal(0.0, std, shape)
        else:
            out[name] = np.full(shape, 1.0 if init == "ones" else 0.0)
    return out


def flatten(params: Dict[str, np.ndarray], layers: int, width: int, block: int,
            vocab: int) -> np.ndarray:
    """The parameters as the program lays them out: one vector, each parameter's values in
    row-major order at its offset, in charlm_setup's order."""
    return np.concatenate([np.asarray(params[n]).reshape(-1)
                           for n, _, _ in param_specs(layers, width, block, vocab)])


def unflatten(flat, layers: int, width: int, block: int, vocab: int) -> Dict[str, np.ndarray]:
    """The dict by name of a vector laid out as flatten's (a checkpoint's parameters)."""
    flat = np.asarray(flat)
    specs = param_specs(layers, width, block, vocab)
    total = sum(int(np.prod(shape)) for _, shape, _ in specs)
    if flat.size != total:
        raise ValueError(f"charlm_ref.unflatten: expected {total} values for layers {layers}, "
                         f"width {width}, block {block}, vocab {vocab}, got {flat.size}")
    out, at = {}, 0
    for name, shape, _ in specs:
        n = int(np.prod(shape))
        out[name] = flat[at:at + n].reshape(shape)
        at += n
    return out


def layers_of(params: Dict[str, np.ndarray]) -> int:
    n = 0
    while f"h{n}.ln1.g" in params:
        n += 1
    return n


# --- the pieces, each forward with what its backward needs -------------------------------------

def _ln(x, g, b):
    mu = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS)  # biased variance
    xhat = (x - mu) * rstd
    return xhat * g + b, (xhat, rstd, g)


def _ln_grad(dy, cache):
    xhat, rstd, g = cache
    axes = tuple(range(dy.ndim - 1))
    dg, db = (dy * xhat).sum(axes), dy.sum(axes)
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg, db


def _gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _gelu_grad(x):
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _split_heads(m, heads):  # [B, T, C] -> [B, H, T, dh]
    b, t, c = m.shape
    return m.reshape(b, t, heads, c // heads).transpose(0, 2, 1, 3)


def _merge_heads(m):  # [B, H, T, dh] -> [B, T, C]
    b, h, t, dh = m.shape
    return m.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


def _attention(qkv, heads):
    c = qkv.shape[-1] // 3
    q, k, v = (_split_heads(qkv[..., i * c:(i + 1) * c], heads) for i in range(3))
    t, dh = q.shape[2], q.shape[3]
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
    s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, -np.inf)  # position i sees j <= i
    p = _softmax(s)
    return _merge_heads(p @ v), (q, k, v, p)


def _attention_grad(datt, cache, heads):
    q, k, v, p = cache
    dh = q.shape[3]
    do = _split_heads(datt, heads)
    dv = p.transpose(0, 1, 3, 2) @ do
    dp = do @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / math.sqrt(dh)  # masked entries: p = 0
    dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
    return np.concatenate([_merge_heads(dq), _merge_heads(dk), _merge_heads(dv)], -1)


def _forward(params, tokens, heads):
    """The final norm's output [B, T, C] and every layer's cache."""
    tokens = np.asarray(tokens)
    t = tokens.shape[1]
    x = params["tok_emb"][tokens] + params["pos_emb"][:t]
    caches = []
    for layer in range(layers_of(params)):
        P = lambda n: params[f"h{layer}.{n}"]  # noqa: E731
        h, ln1 = _ln(x, P("ln1.g"), P("ln1.b"))
        qkv = h @ P("qkv.W") + P("qkv.b")
        att, ac = _attention(qkv, heads)
        x = x + att @ P("proj.W") + P("proj.b")
        h2, ln2 = _ln(x, P("ln2.g"), P("ln2.b"))
        f = h2 @ P("fc.W") + P("fc.b")
        g = _gelu(f)
        x = x + g @ P("out.W") + P("out.b")
        caches.append((h, ln1, att, ac, h2, ln2, f, g))
    hf, lnf = _ln(x, params["ln_f.g"], params["ln_f.b"])
    return hf, lnf, caches


def logits(params: Dict[str, np.ndarray], tokens, heads: int) -> np.ndarray:
    """The logits [B, T, V] at every position."""
    hf, _, _ = _forward(params, tokens, heads)
    return hf @ params["head.W"] + params["head.b"]


def loss(params: Dict[str, np.ndarray], tokens, targets, heads: int) -> float:
    """The mean softmax cross-entropy over every position."""
    p = _softmax(logits(params, tokens, heads))
    tg = np.asarray(targets)
    picked = np.take_along_axis(p, tg[..., None], -1)[..., 0]
    return float(-np.log(picked).mean())


def predict(params: Dict[str, np.ndarray], tokens, heads: int) -> np.ndarray:
    """Predict mode's output: the next-token distribution at the last position, [B, V]."""
    return _softmax(logits(params, tokens, heads)[:, -1, :])


def loss_and_grads(params: Dict[str, np.ndarray], tokens, targets,
                   heads: int) -> Tuple[float, Dict[str, np.ndarray]]:
    """The loss and the gradient of every parameter (same names and shapes), by backward
    passes written out by hand."""
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    b, t = tokens.shape
    hf, lnf, caches = _forward(params, tokens, heads)
    z = hf @ params["head.W"] + params["head.b"]
    p = _softmax(z)
    n = b * t
    picked = np.take_along_axis(p, targets[..., None], -1)[..., 0]
    value = float(-np.log(picked).mean())
    dz = p.copy()
    np.put_along_axis(dz, targets[..., None], np.take_along_axis(dz, targets[..., None], -1) - 1,
                      -1)
    dz /= n
    g = {}
    g["head.W"] = np.einsum("btc,btv->cv", hf, dz)
    g["head.b"] = dz.sum((0, 1))
    dx, g["ln_f.g"], g["ln_f.b"] = _ln_grad(dz @ params["head.W"].T, lnf)
    for layer in reversed(range(len(caches))):
        P = lambda nm: params[f"h{layer}.{nm}"]  # noqa: E731
        h, ln1, att, ac, h2, ln2, f, gl = caches[layer]
        pre = f"h{layer}."
        # x_next = xmid + gelu(LN2(xmid) Wfc + bfc) Wout + bout
        g[pre + "out.W"] = np.einsum("btk,btc->kc", gl, dx)
        g[pre + "out.b"] = dx.sum((0, 1))
        df = (dx @ P("out.W").T) * _gelu_grad(f)
        g[pre + "fc.W"] = np.einsum("btc,btk->ck", h2, df)
        g[pre + "fc.b"] = df.sum((0, 1))
        d, g[pre + "ln2.g"], g[pre + "ln2.b"] = _ln_grad(df @ P("fc.W").T, ln2)
        dx = dx + d
        # xmid = xin + attention(LN1(xin) Wqkv + bqkv) Wproj + bproj
        g[pre + "proj.W"] = np.einsum("btc,btd->cd", att, dx)
        g[pre + "proj.b"] = dx.sum((0, 1))
        dqkv = _attention_grad(dx @ P("proj.W").T, ac, heads)
        g[pre + "qkv.W"] = np.einsum("btc,btk->ck", h, dqkv)
        g[pre + "qkv.b"] = dqkv.sum((0, 1))
        d, g[pre + "ln1.g"], g[pre + "ln1.b"] = _ln_grad(dqkv @ P("qkv.W").T, ln1)
        dx = dx + d
    g["pos_emb"] = np.zeros_like(params["pos_emb"])
    g["pos_emb"][:t] = dx.sum(0)
    g["tok_emb"] = np.zeros_like(params["tok_emb"])
    np.add.at(g["tok_emb"], tokens.reshape(-1), dx.reshape(n, -1))
    return value, {k: g[k] for k in params}
