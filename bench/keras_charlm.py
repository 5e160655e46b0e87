"""The program charlm (device/programs/charlm.c) as a Keras 3 model, for bench/peers.py's charlm
jobs: the same layers and widths, the same initialization (RandomNormal(0.02) for the embeddings
and every matrix, zeros for biases, ones for the norms' gains), AdamW with the weight decay
excluded from biases and norms, clipping by the global norm, a linear warmup then a cosine decay
(CosineDecay with warmup), trained by `model.fit(..., steps_per_execution=...)` on windows of
examples/charlm/corpus.py.

Run by peers.py with the Keras environment's Python (KERAS_BACKEND=jax or tensorflow):

    python bench/keras_charlm.py '{"layers": 2, "heads": 4, "width": 128, "block": 64,
                                   "vocab": 256, "batch": 8, "steps": 200, "ipl": 100, ...}'

prints one JSON line: tokens/s of a timed fit after a warm-up fit (which compiles), the backend
and Keras's version. `--check` instead compares the model's loss and gradients at the same
weights with tests/util/charlm_ref.py (float64) and prints the largest differences.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "charlm"))

import keras  # noqa: E402
from keras import ops  # noqa: E402

STD = 0.02
EPS = 1e-5

class PositionEmbedding(keras.layers.Layer):
    """x + pos_emb, pos_emb [block, width] drawn from RandomNormal(0.02)."""

    def __init__(self, block, width, **kw):
        super().__init__(**kw)
        self.block, self.width = block, width

    def build(self, input_shape):
        self.pos_emb = self.add_weight(shape=(self.block, self.width), name="pos_emb",
                                       initializer=keras.initializers.RandomNormal(stddev=STD))

    def call(self, x):
        return x + self.pos_emb[: x.shape[1]]


class CausalAttention(keras.layers.Layer):
    """Causal softmax attention over qkv [B, T, 3C] (the q, k, v thirds; head i's columns
    [i dh, (i + 1) dh) in each), scores scaled by 1 / sqrt(dh): [B, T, C]. No weights."""

    def __init__(self, heads, **kw):
        super().__init__(**kw)
        self.heads = heads

    def call(self, qkv):
        t, c = qkv.shape[1], qkv.shape[2] // 3
        dh = c // self.heads
        qkv = ops.reshape(qkv, (-1, t, 3, self.heads, dh))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, T, H, dh]
        o = ops.dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(dh))
        return ops.reshape(o, (-1, t, c))


def build_model(layers, heads, width, block, vocab):
    """The functional model: tokens int32 [block] -> logits [block, vocab]. Layer names follow
    the program's parameters (h0_qkv: h0.qkv.W and h0.qkv.b)."""
    normal = keras.initializers.RandomNormal(stddev=STD)
    c = width

    def dense(units, name, activation=None):
        return keras.layers.Dense(units, activation=activation, kernel_initializer=normal,
                                  bias_initializer="zeros", name=name)

    def norm(name):
        return keras.layers.LayerNormalization(epsilon=EPS, name=name)

    def gelu(x):
        return keras.activations.gelu(x, approximate=False)

    tokens = keras.Input((block,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocab, c, embeddings_initializer=normal, name="tok_emb")(tokens)
    x = PositionEmbedding(block, c, name="pos_emb")(x)
    for i in range(layers):
        h = norm(f"h{i}_ln1")(x)
        a = CausalAttention(heads, name=f"h{i}_attention")(dense(3 * c, f"h{i}_qkv")(h))
        x = x + dense(c, f"h{i}_proj")(a)
        h = dense(4 * c, f"h{i}_fc", activation=gelu)(norm(f"h{i}_ln2")(x))
        x = x + dense(c, f"h{i}_out")(h)
    logits = dense(vocab, "head")(norm("ln_f")(x))
    return keras.Model(tokens, logits, name="charlm")


def variables_by_name(model, layers):
    """The program's parameter names -> the model's variables."""
    out = {"tok_emb": model.get_layer("tok_emb").embeddings,
           "pos_emb": model.get_layer("pos_emb").pos_emb}

    def add(prefix, layer):
        lay = model.get_layer(layer)
        if isinstance(lay, keras.layers.LayerNormalization):
            out[prefix + ".g"], out[prefix + ".b"] = lay.gamma, lay.beta
        else:
            out[prefix + ".W"], out[prefix + ".b"] = lay.kernel, lay.bias

    for i in range(layers):
        for p in ("ln1", "qkv", "proj", "ln2", "fc", "out"):
            add(f"h{i}.{p}", f"h{i}_{p}")
    add("ln_f", "ln_f")
    add("head", "head")
    return out


def compile_model(model, job):
    """AdamW (no decay on biases and norms), global-norm clipping, warmup then cosine."""
    o = job  # learning_rate, beta1, beta2, epsilon, weight_decay, clip_norm, warmup_steps,
    # decay_steps (warmup included), min_learning_rate: peers.py's CHARLM_OPTIMIZER
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0, warmup_target=o["learning_rate"],
        warmup_steps=o["warmup_steps"],
        # infeedd's decay_steps counts the warmup (Optax's way), Keras's counts after it
        decay_steps=max(1, o["decay_steps"] - o["warmup_steps"]),
        alpha=o["min_learning_rate"] / o["learning_rate"])
    opt = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=o["weight_decay"],
                                 beta_1=o["beta1"], beta_2=o["beta2"], epsilon=o["epsilon"],
                                 global_clipnorm=o["clip_norm"] or None)
    by_name = variables_by_name(model, o["layers"])
    opt.exclude_from_weight_decay(var_list=[v for n, v in by_name.items()
                                            if n.endswith((".b", ".g"))])
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=o["ipl"], jit_compile=True)
    return model


def windows(job, rows, seed):
    import corpus

    data = corpus.load()
    w = next(corpus.windows(data, job["block"], rows, seed))
    return w["tokens"], w["targets"]


def bench(job):
    """tokens/s of model.fit over job["steps"] steps (a multiple of ipl), after a warm-up fit
    of job["warmup"] executions that compiles."""
    keras.utils.set_random_seed(job.get("seed", 1))
    model = compile_model(build_model(job["layers"], job["heads"], job["width"], job["block"],
                                      job["vocab"]),
                          dict(job, decay_steps=job.get("decay_steps", job["steps"])))
    b, ipl = job["batch"], job["ipl"]
    steps = max(ipl, job["steps"] // ipl * ipl)
    x, y = windows(job, steps * b, job.get("seed", 1))
    warm = job.get("warmup", 1) * ipl * b
    model.fit(x[:warm], y[:warm], batch_size=b, epochs=1, shuffle=False, verbose=0)
    t0 = time.perf_counter()
    hist = model.fit(x, y, batch_size=b, epochs=1, shuffle=False, verbose=0)
    dt = time.perf_counter() - t0
    return {"tokens_per_sec": steps * b * job["block"] / dt, "steps": steps, "seconds": dt,
            "loss": float(hist.history["loss"][-1]), "backend": keras.backend.backend(),
            "keras": keras.__version__}


def loss_and_grads(model, tokens, targets):
    """The mean cross-entropy and its gradient of every trainable variable (float64 numpy), by
    the backend's own differentiation."""
    lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    backend = keras.backend.backend()
    tv = model.trainable_variables
    if backend == "jax":
        import jax

        def f(values):
            logits, _ = model.stateless_call(values, [v.value for v in model.non_trainable_variables],
                                             tokens)
            return lossf(targets, logits)

        value, g = jax.value_and_grad(f)([v.value for v in tv])
    elif backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            value = lossf(targets, model(tokens))
        g = [tf.convert_to_tensor(x) for x in tape.gradient(value, [v.value for v in tv])]
    else:
        raise ValueError(f"keras_charlm: backend {backend!r}: expected jax or tensorflow")
    by_id = {id(v): np.asarray(gi, dtype=np.float64) for v, gi in zip(tv, g)}
    return float(value), by_id


def check(job):
    """The model's loss and gradients at weights drawn by charlm_ref, against charlm_ref."""
    sys.path.insert(0, str(ROOT / "tests" / "util"))
    import charlm_ref as ref

    rng = np.random.default_rng(job.get("seed", 1))
    L, H, C, T, V = (job[k] for k in ("layers", "heads", "width", "block", "vocab"))
    model = build_model(L, H, C, T, V)
    std = job.get("std", 0.3)  # larger than 0.02, so that every layer's gradient is sizeable
    params = {n: (1.0 if init == "ones" else 0.0) + rng.normal(0.0, std, shape)
              for n, shape, init in ref.param_specs(L, C, T, V)}
    by_name = variables_by_name(model, L)
    assert sorted(by_name) == sorted(params), "the model's variables are not the program's"
    for n, v in by_name.items():
        v.assign(params[n].astype(np.float32))
    tokens = rng.integers(0, V, (job["batch"], T)).astype(np.int32)
    targets = rng.integers(0, V, (job["batch"], T)).astype(np.int32)
    value, grads = loss_and_grads(model, tokens, targets)
    want, want_g = ref.loss_and_grads(params, tokens, targets, H)
    err = {}
    for n, v in by_name.items():
        g, w = grads[id(v)], want_g[n]
        err[n] = float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30))
    p = np.asarray(model.predict(tokens, verbose=0), dtype=np.float64)[:, -1]
    p = np.exp(p - p.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return {"loss": value, "ref_loss": want, "loss_rel": abs(value - want) / want,
            "grad_rel": err, "predict_abs": float(np.abs(p - ref.predict(params, tokens, H)).max()),
            "backend": keras.backend.backend()}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--check"]
    job = json.loads(args[0]) if args else {}
    out = check(job) if "--check" in sys.argv[1:] else bench(job)
    print(json.dumps(out))
