/*
 * charlm: a GPT-style decoder over bytes or any small vocabulary (issue 22).
 *
 * Inputs: tokens int32 [T] and the label targets int32 [T] (the next token at every position),
 * T = block. Model, pre-layer-norm as GPT-2:
 *   x = tok_emb[tokens] + pos_emb
 *   for each of the layers:  x += proj(attention(qkv(ln1(x))));  x += out(gelu(fc(ln2(x))))
 *   logits = head(ln_f(x)),  loss = mean over every position of softmax cross-entropy
 * with heads heads of width C / heads under a causal mask, C = width, fc 4C wide. Predict takes
 * tokens and writes the next-token distribution at the last position ([vocab] a row).
 *
 * Parameters: normal(0, 0.02) for the embeddings and every matrix, zeros for biases, ones for
 * the norms' gains; biases and norms carry IFD_PARAM_NO_DECAY. The step runs through the op set
 * only, so it is the same program on every backend.
 */
#include "core/rng.h"
#include "device/programs/common.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define CHARLM_EPS 1e-5f
#define CHARLM_STD 0.02f

/* The parameters of one layer, in this order after tok_emb and pos_emb. */
enum {
    L_LN1_G,
    L_LN1_B,
    L_QKV_W,
    L_QKV_B,
    L_PROJ_W,
    L_PROJ_B,
    L_LN2_G,
    L_LN2_B,
    L_FC_W,
    L_FC_B,
    L_OUT_W,
    L_OUT_B,
    L_NPARAMS
};
enum { P_TOK, P_POS, P_LAYERS }; /* then layers * L_NPARAMS, then ln_f g, b, head W, b */

typedef struct charlm_dims {
    int64_t layers, heads, width, block, vocab;
} charlm_dims;

/* The settings, as setup read and checked them (kept in p->state). */
static charlm_dims charlm_get(const ifd_program *p)
{
    return *(const charlm_dims *)p->state;
}

static void charlm_free_state(ifd_program *p)
{
    free(p->state);
    p->state = NULL;
}

static int lp(const charlm_dims *d, int64_t layer, int which)
{
    (void)d;
    return P_LAYERS + (int)layer * L_NPARAMS + which;
}

static int final_param(const charlm_dims *d, int which) /* 0 ln_f g, 1 ln_f b, 2 head W, 3 b */
{
    return P_LAYERS + (int)d->layers * L_NPARAMS + which;
}

/* One parameter of the model: its name, rank and dims (C, 3C, 4C, V or T by letter) and its
 * initializer: 'n' normal(0, 0.02), 'z' zeros, 'o' ones. Biases and norms (not 'n') carry
 * IFD_PARAM_NO_DECAY. */
typedef struct charlm_param {
    const char *name;
    int rank;
    char d0, d1, init;
} charlm_param;

static const charlm_param first_params[] = {{"tok_emb", 2, 'v', 'c', 'n'},
                                            {"pos_emb", 2, 't', 'c', 'n'}};
static const charlm_param layer_params[L_NPARAMS] = {
    {"ln1.g", 1, 'c', 0, 'o'}, {"ln1.b", 1, 'c', 0, 'z'},    {"qkv.W", 2, 'c', '3', 'n'},
    {"qkv.b", 1, '3', 0, 'z'}, {"proj.W", 2, 'c', 'c', 'n'}, {"proj.b", 1, 'c', 0, 'z'},
    {"ln2.g", 1, 'c', 0, 'o'}, {"ln2.b", 1, 'c', 0, 'z'},    {"fc.W", 2, 'c', '4', 'n'},
    {"fc.b", 1, '4', 0, 'z'},  {"out.W", 2, '4', 'c', 'n'},  {"out.b", 1, 'c', 0, 'z'}};
static const charlm_param last_params[] = {{"ln_f.g", 1, 'c', 0, 'o'},
                                           {"ln_f.b", 1, 'c', 0, 'z'},
                                           {"head.W", 2, 'c', 'v', 'n'},
                                           {"head.b", 1, 'v', 0, 'z'}};

static int64_t dim_of(const charlm_dims *d, char code)
{
    switch (code) {
    case 'c':
        return d->width;
    case '3':
        return 3 * d->width;
    case '4':
        return 4 * d->width;
    case 'v':
        return d->vocab;
    default:
        return d->block;
    }
}

/* Declares n parameters of table, each name after prefix ("" or "h0."). */
static int declare(ifd_program *p, const charlm_dims *d, const char *prefix,
                   const charlm_param *table, int n)
{
    for (int i = 0; i < n; i++) {
        const charlm_param *q = &table[i];
        char name[IFD_NAME_MAX];
        snprintf(name, sizeof name, "%s%s", prefix, q->name);
        int64_t dims[2] = {dim_of(d, q->d0), q->rank > 1 ? dim_of(d, q->d1) : 0};
        ifd_param_init init = {q->init == 'n'   ? IFD_INIT_NORMAL
                               : q->init == 'o' ? IFD_INIT_ONES
                                                : IFD_INIT_ZEROS,
                               q->init == 'n' ? CHARLM_STD : 0.0f};
        int rc = ifd_program_add_param_with(p, name, q->rank, dims, init,
                                            q->init == 'n' ? 0 : IFD_PARAM_NO_DECAY);
        if (rc)
            return rc;
    }
    return IFD_OK;
}

/* The program_config settings, each in its range, heads a divisor of width. */
static int charlm_read(ifd_program *p, charlm_dims *d, ifd_error *err)
{
    static const struct {
        const char *key;
        int64_t def, min, max;
        size_t at;
    } keys[] = {{"layers", 2, 1, 64, offsetof(charlm_dims, layers)},
                {"heads", 4, 1, 256, offsetof(charlm_dims, heads)},
                {"width", 128, 1, 8192, offsetof(charlm_dims, width)},
                {"block", 64, 1, 4096, offsetof(charlm_dims, block)},
                {"vocab", 256, 2, 1 << 20, offsetof(charlm_dims, vocab)}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int rc = ifd_program_config_int(p, keys[i].key, keys[i].def, keys[i].min, keys[i].max,
                                        (int64_t *)((char *)d + keys[i].at), err);
        if (rc)
            return rc;
    }
    if (d->width % d->heads != 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "program 'charlm': program_config setting 'heads': expected a "
                             "divisor of width %lld, got %lld",
                             (long long)d->width, (long long)d->heads);
    return IFD_OK;
}

static int charlm_setup(ifd_program *p, ifd_error *err)
{
    charlm_dims d;
    int rc = charlm_read(p, &d, err);
    if (rc)
        return rc;
    p->state = malloc(sizeof d);
    if (p->state == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "program 'charlm': out of memory");
    *(charlm_dims *)p->state = d;
    /* ids in [0, vocab): the runtime checks every batch, predict's too, before a step */
    if (ifd_program_add_ids(p, "tokens", 0, 1, &d.block, d.vocab) != IFD_OK ||
        ifd_program_add_ids(p, "targets", 1, 1, &d.block, d.vocab) != IFD_OK)
        return ifd_error_set(err, IFD_EINVAL, "program 'charlm': cannot declare its inputs");
    rc = declare(p, &d, "", first_params, 2);
    for (int64_t l = 0; rc == IFD_OK && l < d.layers; l++) {
        char prefix[24];
        snprintf(prefix, sizeof prefix, "h%lld.", (long long)l);
        rc = declare(p, &d, prefix, layer_params, L_NPARAMS);
    }
    rc = rc ? rc : declare(p, &d, "", last_params, 4);
    if (rc)
        return ifd_error_set(err, rc, "program 'charlm': cannot declare its parameters");
    p->predict_cols = d.vocab;
    return IFD_OK;
}

/*
 * The workspace of a step over b sequences (n = b * t rows):
 *   per layer: xin [n,C], h1 [n,C], mean1, rstd1 [n], qkv [n,3C], probs [b,H,t,t], att [n,C],
 *              xmid [n,C], h2 [n,C], mean2, rstd2 [n], f [n,4C], g [n,4C]
 *   then: x [n,C] (the last layer's output), hf [n,C], meanf, rstdf [n], logits, dlogits [n,V]
 *   and the backward's: dx, dh [n,C], dqkv [n,3C], datt [n,C], dg [n,4C], work [b,H,t,t]
 */
typedef struct layer_ws {
    float *xin, *h1, *mean1, *rstd1, *qkv, *probs, *att, *xmid, *h2, *mean2, *rstd2, *f, *g;
} layer_ws;

typedef struct charlm_ws {
    float *x, *hf, *meanf, *rstdf, *logits, *dlogits;
    float *dx, *dh, *dqkv, *datt, *dg, *work;
} charlm_ws;

static int64_t layer_floats(const charlm_dims *d, int64_t b)
{
    int64_t n = b * d->block, c = d->width, att = b * d->heads * d->block * d->block;
    return 16 * n * c + 4 * n + att;
}

static int64_t charlm_workspace(const ifd_program *p, int64_t b)
{
    charlm_dims d = charlm_get(p);
    int64_t n = b * d.block, c = d.width, att = b * d.heads * d.block * d.block;
    return d.layers * layer_floats(&d, b) + 2 * n * c + 2 * n + 2 * n * d.vocab +
           (2 * n * c + 3 * n * c + n * c + 4 * n * c) + att;
}

static layer_ws layer_at(const charlm_dims *d, float *ws, int64_t b, int64_t l)
{
    int64_t n = b * d->block, c = d->width, att = b * d->heads * d->block * d->block;
    float *at = ws + l * layer_floats(d, b);
    layer_ws w;
    w.xin = at, at += n * c;
    w.h1 = at, at += n * c;
    w.mean1 = at, at += n;
    w.rstd1 = at, at += n;
    w.qkv = at, at += 3 * n * c;
    w.probs = at, at += att;
    w.att = at, at += n * c;
    w.xmid = at, at += n * c;
    w.h2 = at, at += n * c;
    w.mean2 = at, at += n;
    w.rstd2 = at, at += n;
    w.f = at, at += 4 * n * c;
    w.g = at;
    return w;
}

static charlm_ws final_at(const charlm_dims *d, float *ws, int64_t b)
{
    int64_t n = b * d->block, c = d->width;
    float *at = ws + d->layers * layer_floats(d, b);
    charlm_ws w;
    w.x = at, at += n * c;
    w.hf = at, at += n * c;
    w.meanf = at, at += n;
    w.rstdf = at, at += n;
    w.logits = at, at += n * d->vocab;
    w.dlogits = at, at += n * d->vocab;
    w.dx = at, at += n * c;
    w.dh = at, at += n * c;
    w.dqkv = at, at += 3 * n * c;
    w.datt = at, at += n * c;
    w.dg = at, at += 4 * n * c;
    w.work = at;
    return w;
}

static const float *param(const ifd_program *p, const float *params, int i)
{
    return params + p->params[i].offset;
}

/* out = x W + b (rows n), or out = res + x W + b when res is not NULL: one gemm_bias. */
static void dense(const ifd_ops *ops, int64_t n, int64_t in, int64_t outc, const float *x,
                  const float *w, const float *bias, const float *res, float *out)
{
    ops->gemm_bias(ops->ctx, n, outc, in, x, w, bias, res, out);
}

/* The forward through ln_f over b sequences: leaves every layer's activations in the workspace
 * and the final norm's output in f->hf. */
static void charlm_forward(const ifd_program *p, const ifd_ops *ops, const charlm_dims *d,
                           const int32_t *tokens, const float *pr, float *ws, int64_t b,
                           charlm_ws *f)
{
    int64_t t = d->block, c = d->width, n = b * t, dh = c / d->heads;
    *f = final_at(d, ws, b);
    float *x0 = d->layers > 0 ? layer_at(d, ws, b, 0).xin : f->x;
    ops->embedding(ops->ctx, n, c, tokens, param(p, pr, P_TOK), x0);
    ops->bias_add(ops->ctx, b, t * c, param(p, pr, P_POS), x0); /* pos_emb on every sequence */
    for (int64_t l = 0; l < d->layers; l++) {
        layer_ws w = layer_at(d, ws, b, l);
        float *next = l + 1 < d->layers ? layer_at(d, ws, b, l + 1).xin : f->x;
        ops->layernorm(ops->ctx, n, c, w.xin, param(p, pr, lp(d, l, L_LN1_G)),
                       param(p, pr, lp(d, l, L_LN1_B)), CHARLM_EPS, w.h1, w.mean1, w.rstd1);
        dense(ops, n, c, 3 * c, w.h1, param(p, pr, lp(d, l, L_QKV_W)),
              param(p, pr, lp(d, l, L_QKV_B)), NULL, w.qkv);
        ops->attention(ops->ctx, b, t, d->heads, dh, w.qkv, w.probs, w.att);
        dense(ops, n, c, c, w.att, param(p, pr, lp(d, l, L_PROJ_W)),
              param(p, pr, lp(d, l, L_PROJ_B)), w.xin, w.xmid);
        ops->layernorm(ops->ctx, n, c, w.xmid, param(p, pr, lp(d, l, L_LN2_G)),
                       param(p, pr, lp(d, l, L_LN2_B)), CHARLM_EPS, w.h2, w.mean2, w.rstd2);
        dense(ops, n, c, 4 * c, w.h2, param(p, pr, lp(d, l, L_FC_W)),
              param(p, pr, lp(d, l, L_FC_B)), NULL, w.f);
        ops->gelu(ops->ctx, n * 4 * c, w.f, w.g);
        dense(ops, n, 4 * c, c, w.g, param(p, pr, lp(d, l, L_OUT_W)),
              param(p, pr, lp(d, l, L_OUT_B)), w.xmid, next);
    }
    ops->layernorm(ops->ctx, n, c, f->x, param(p, pr, final_param(d, 0)),
                   param(p, pr, final_param(d, 1)), CHARLM_EPS, f->hf, f->meanf, f->rstdf);
}

/* dW = x^T dy, db = column sums of dy, and (unless dx is NULL) dx = dy W^T. */
static void dense_grad(const ifd_ops *ops, int64_t n, int64_t in, int64_t outc, const float *x,
                       const float *w, const float *dy, float *dw, float *db, float *dx)
{
    ops->gemm(ops->ctx, 1, 0, in, outc, n, 1.0f, x, dy, 0.0f, dw);
    ops->col_sum(ops->ctx, n, outc, dy, db);
    if (dx)
        ops->gemm(ops->ctx, 0, 1, n, in, outc, 1.0f, dy, w, 0.0f, dx);
}

static int charlm_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                       ifd_error *err)
{
    (void)err;
    charlm_dims d = charlm_get(p);
    int64_t b = a->rows, t = d.block, c = d.width, n = b * t, dh = c / d.heads;
    const int32_t *tokens = a->inputs[0].data, *targets = a->inputs[1].data;
    const float *pr = a->params;
    charlm_ws f;
    charlm_forward(p, ops, &d, tokens, pr, a->workspace, b, &f);
    dense(ops, n, c, d.vocab, f.hf, param(p, pr, final_param(&d, 2)),
          param(p, pr, final_param(&d, 3)), NULL, f.logits);
    ops->softmax_xent(ops->ctx, n, d.vocab, f.logits, targets, a->scale, f.dlogits, a->out);
    if (a->grads == NULL)
        return IFD_OK;
    float *g = a->grads;
#define G(i) (g + p->params[(i)].offset)
    dense_grad(ops, n, c, d.vocab, f.hf, param(p, pr, final_param(&d, 2)), f.dlogits,
               G(final_param(&d, 2)), G(final_param(&d, 3)), f.dh);
    ops->fill(ops->ctx, 2 * c, 0.0f, G(final_param(&d, 0))); /* ln_f g and b, adjacent */
    ops->layernorm_grad(ops->ctx, n, c, f.x, param(p, pr, final_param(&d, 0)), f.meanf, f.rstdf,
                        f.dh, f.dx, G(final_param(&d, 0)), G(final_param(&d, 1)));
    for (int64_t l = d.layers - 1; l >= 0; l--) {
        layer_ws w = layer_at(&d, a->workspace, b, l);
        /* x_next = xmid + out(gelu(fc(ln2(xmid)))) */
        dense_grad(ops, n, 4 * c, c, w.g, param(p, pr, lp(&d, l, L_OUT_W)), f.dx,
                   G(lp(&d, l, L_OUT_W)), G(lp(&d, l, L_OUT_B)), f.dg);
        ops->gelu_grad(ops->ctx, n * 4 * c, w.f, f.dg, f.dg);
        dense_grad(ops, n, c, 4 * c, w.h2, param(p, pr, lp(&d, l, L_FC_W)), f.dg,
                   G(lp(&d, l, L_FC_W)), G(lp(&d, l, L_FC_B)), f.dh);
        ops->fill(ops->ctx, 2 * c, 0.0f, G(lp(&d, l, L_LN2_G)));
        ops->layernorm_grad(ops->ctx, n, c, w.xmid, param(p, pr, lp(&d, l, L_LN2_G)), w.mean2,
                            w.rstd2, f.dh, f.dh, G(lp(&d, l, L_LN2_G)), G(lp(&d, l, L_LN2_B)));
        ops->add(ops->ctx, n * c, 1.0f, f.dh, f.dx);
        /* xmid = xin + proj(attention(qkv(ln1(xin)))) */
        dense_grad(ops, n, c, c, w.att, param(p, pr, lp(&d, l, L_PROJ_W)), f.dx,
                   G(lp(&d, l, L_PROJ_W)), G(lp(&d, l, L_PROJ_B)), f.datt);
        ops->attention_grad(ops->ctx, b, t, d.heads, dh, w.qkv, w.probs, f.datt, f.dqkv, f.work);
        dense_grad(ops, n, c, 3 * c, w.h1, param(p, pr, lp(&d, l, L_QKV_W)), f.dqkv,
                   G(lp(&d, l, L_QKV_W)), G(lp(&d, l, L_QKV_B)), f.dh);
        ops->fill(ops->ctx, 2 * c, 0.0f, G(lp(&d, l, L_LN1_G)));
        ops->layernorm_grad(ops->ctx, n, c, w.xin, param(p, pr, lp(&d, l, L_LN1_G)), w.mean1,
                            w.rstd1, f.dh, f.dh, G(lp(&d, l, L_LN1_G)), G(lp(&d, l, L_LN1_B)));
        ops->add(ops->ctx, n * c, 1.0f, f.dh, f.dx);
    }
    /* x0 = tok_emb[tokens] + pos_emb */
    ops->col_sum(ops->ctx, b, t * c, f.dx, G(P_POS));
    ops->fill(ops->ctx, d.vocab * c, 0.0f, G(P_TOK));
    ops->embedding_grad(ops->ctx, n, c, tokens, f.dx, G(P_TOK));
#undef G
    return IFD_OK;
}

/* The next-token distribution at the last position of each sequence: head(ln_f(x)) of that row
 * alone (a batch of b one-row products), then the softmax. */
static int charlm_predict(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                          ifd_error *err)
{
    (void)err;
    charlm_dims d = charlm_get(p);
    int64_t b = a->rows, t = d.block, c = d.width;
    charlm_ws f;
    charlm_forward(p, ops, &d, a->inputs[0].data, a->params, a->workspace, b, &f);
    ops->gemm_strided_batched(ops->ctx, 0, 0, 1, d.vocab, c, 1.0f, f.hf + (t - 1) * c, t * c,
                              param(p, a->params, final_param(&d, 2)), 0, 0.0f, f.logits, d.vocab,
                              b);
    ops->bias_add(ops->ctx, b, d.vocab, param(p, a->params, final_param(&d, 3)), f.logits);
    ops->softmax(ops->ctx, b, d.vocab, f.logits, a->predictions);
    return IFD_OK;
}

const ifd_program_class ifd_program_charlm = {
    .name = "charlm",
    .description = "a GPT-style decoder (program_config: layers, heads, width, block, vocab): "
                   "tokens int32 [block], targets int32 [block] in [0, vocab), the next token "
                   "at each position; predict: the next-token distribution [vocab]",
    .setup = charlm_setup,
    .free_state = charlm_free_state,
    .workspace_floats = charlm_workspace,
    .train_step = charlm_step,
    .predict_step = charlm_predict,
};
