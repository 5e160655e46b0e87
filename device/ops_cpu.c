/* The op set and the replication ops on the host: CBLAS for products (device/ops_gemm_cpu.c),
 * device/math.h for the elementwise math. Every sum over rows runs in row order (losses in double,
 * column sums in float), so results are repeatable run to run. */
#include "device/cpu/team.h"
#include "device/math.h"
#include "device/nn_cpu.h"
#include "device/ops_gemm_cpu.h"
#include "device/step.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

static void cpu_relu(void *ctx, int64_t n, const float *x, float *y)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        y[i] = ifd_math_relu(x[i]);
}

static void cpu_relu_grad(void *ctx, int64_t n, const float *y, const float *dy, float *dx)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        dx[i] = ifd_math_relu_grad(y[i], dy[i]);
}

static void cpu_tanh(void *ctx, int64_t n, const float *x, float *y)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        y[i] = ifd_math_tanh(x[i]);
}

static void cpu_tanh_grad(void *ctx, int64_t n, const float *y, const float *dy, float *dx)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++)
        dx[i] = ifd_math_tanh_grad(y[i], dy[i]);
}

/* The penalty is summed in double, in element order. */
static void cpu_l2_decay(void *ctx, int64_t n, float decay, float scale, const float *w,
                         float *grad, ifd_step_out *out)
{
    (void)ctx;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += ifd_math_l2_term(w[i], decay);
    out->loss += (float)(scale * s);
    if (grad == NULL)
        return;
    float coef = scale * decay;
    for (int64_t i = 0; i < n; i++)
        grad[i] = ifd_math_l2_grad(w[i], grad[i], coef);
}

static void cpu_softmax(void *ctx, int64_t rows, int64_t k, const float *logits, float *probs)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++)
        ifd_math_softmax_row(logits + r * k, k, probs + r * k);
}

static void cpu_squared_error(void *ctx, int64_t rows, int64_t k, const float *pred, const float *y,
                              float scale, float *dpred, ifd_step_out *out)
{
    (void)ctx;
    double loss = 0.0;
    float gscale = rows > 0 ? scale / (float)rows : 0.0f;
    for (int64_t r = 0; r < rows; r++)
        loss += ifd_math_sq_err_row(pred + r * k, y + r * k, k, gscale, dpred + r * k);
    out->loss = rows > 0 ? (float)(scale * loss / (double)rows) : 0.0f;
    out->correct = 0.0f;
}

static void cpu_classify(void *ctx, int64_t rows, int64_t k, const float *logits, int32_t *cls,
                         float *conf)
{
    (void)ctx;
    ifd_nn_softmax_xent_rows(0, rows, k, logits, NULL, 0.0f, NULL, NULL, cls, conf);
}

static void cpu_copy(void *ctx, void *dst, const void *src, int64_t bytes)
{
    (void)ctx;
    if (bytes > 0)
        memcpy(dst, src, (size_t)bytes);
}

/*
 * The transformer's ops (device/nn_cpu.h), shared with the replica's team where large. Chunks
 * split rows, columns, batch items or (sequence, head) pairs, which each op computes on their
 * own, every sum inside a chunk in the order the one-thread function has; so the bits do not
 * depend on the team's size nor on which thread runs a chunk. The chunk sizes are the shape's
 * alone. Small calls run on the caller.
 */
#define IFD_NN_CHUNK_FLOATS 8192

typedef struct nn_split {
    int64_t per, n; /* items a chunk, items in all */
    int64_t rows, dim, t, heads, dh;
    float alpha, eps;
    const float *x, *x2, *x3, *x4, *x5;
    float *y, *y2, *y3;
    const int32_t *ids;
    /* gemm_strided_batched */
    int ta, tb;
    int64_t m, nn, k, sa, sb, sc;
    float beta;
} nn_split;

/* Items a chunk: at least per_min, and few enough chunks for one team run. */
static int64_t nn_per(int64_t n, int64_t per_min)
{
    int64_t per = per_min < 1 ? 1 : per_min;
    int64_t least = (n + IFD_TEAM_MAX_CHUNKS - 1) / IFD_TEAM_MAX_CHUNKS;
    return per > least ? per : least;
}

/* fn over the chunks of s->n items, s->per a chunk, on the team when there are two or more. */
static void nn_run(void *team, nn_split *s, ifd_team_fn fn)
{
    int64_t chunks = (s->n + s->per - 1) / s->per;
    if (chunks <= 1 || ifd_team_threads(team) == 1) {
        for (int64_t c = 0; c < chunks; c++)
            fn(s, c);
        return;
    }
    ifd_team_run(team, chunks, fn, s);
}

/* Columns a chunk of a pass over every row: 16 at least (a cache line of each row), about
 * IFD_NN_CHUNK_FLOATS floats. */
static int64_t nn_cols(int64_t rows)
{
    int64_t cols = (IFD_NN_CHUNK_FLOATS / (rows + 1) + 15) / 16 * 16;
    return cols < 16 ? 16 : cols;
}

/* Columns a chunk of a column sum (ifd_nn_col_sum, the layer norm's parameter gradients): 64 at
 * least, so that each row's run of a chunk spans whole cache lines and the hardware prefetches
 * it. */
static int64_t nn_sum_cols(int64_t rows)
{
    int64_t cols = nn_cols(rows);
    return cols < 64 ? 64 : cols;
}

static void nn_range(const nn_split *s, int64_t c, int64_t *lo, int64_t *hi)
{
    *lo = c * s->per;
    *hi = *lo + s->per < s->n ? *lo + s->per : s->n;
}

static void fill_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        s->y[i] = s->alpha;
}

static void cpu_fill(void *ctx, int64_t n, float value, float *x)
{
    nn_split s = {.n = n, .per = nn_per(n, 4 * IFD_NN_CHUNK_FLOATS), .alpha = value, .y = x};
    nn_run(ctx, &s, fill_chunk);
}

static void add_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    ifd_nn_axpy(hi - lo, s->alpha, s->x + lo, s->y + lo);
}

static void cpu_add(void *ctx, int64_t n, float alpha, const float *x, float *y)
{
    nn_split s = {
        .n = n, .per = nn_per(n, 4 * IFD_NN_CHUNK_FLOATS), .alpha = alpha, .x = x, .y = y};
    nn_run(ctx, &s, add_chunk);
}

static void bias_add_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    ifd_nn_bias_add_rows(hi - lo, s->dim, s->x, s->y + lo * s->dim);
}

static void cpu_bias_add(void *ctx, int64_t rows, int64_t cols, const float *bias, float *x)
{
    nn_split s = {.n = rows,
                  .per = nn_per(rows, 4 * IFD_NN_CHUNK_FLOATS / (cols + 1)),
                  .dim = cols,
                  .x = bias,
                  .y = x};
    nn_run(ctx, &s, bias_add_chunk);
}

static void col_sum_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    ifd_nn_col_sum(s->rows, s->dim, lo, hi, s->x, s->y);
}

/* Split by columns: each column's sum runs over the rows in order, as on one thread. */
static void cpu_col_sum(void *ctx, int64_t rows, int64_t cols, const float *x, float *out)
{
    nn_split s = {.n = cols,
                  .per = nn_per(cols, nn_sum_cols(rows)),
                  .rows = rows,
                  .dim = cols,
                  .x = x,
                  .y = out};
    nn_run(ctx, &s, col_sum_chunk);
}

/*
 * The cross-entropy in chunks of rows (the shape's alone, at most IFD_XENT_CHUNKS): each
 * chunk's loss summed in double over its rows in order, then the chunks' in order, so the
 * bits do not depend on the team. A shape of one chunk sums as one loop over the rows.
 */
#define IFD_XENT_CHUNKS 64

typedef struct xent_split {
    nn_split s;
    const int32_t *labels;
    float gscale;
    int32_t *cls;
    float *conf;
    double loss[IFD_XENT_CHUNKS];
    int64_t correct[IFD_XENT_CHUNKS];
} xent_split;

static void xent_chunk(void *arg, int64_t c)
{
    xent_split *x = arg;
    int64_t lo, hi, correct = 0;
    nn_range(&x->s, c, &lo, &hi);
    x->loss[c] = ifd_nn_softmax_xent_rows(lo, hi, x->s.dim, x->s.x, x->labels, x->gscale, x->s.y,
                                          &correct, x->cls, x->conf);
    x->correct[c] = correct;
}

static void cpu_softmax_xent_classify(void *ctx, int64_t rows, int64_t k, const float *logits,
                                      const int32_t *labels, float scale, float *dlogits,
                                      ifd_step_out *out, int32_t *cls, float *conf)
{
    xent_split x = {.s = {.n = rows, .dim = k, .x = logits, .y = dlogits},
                    .labels = labels,
                    .gscale = rows > 0 ? scale / (float)rows : 0.0f,
                    .cls = cls,
                    .conf = conf};
    int64_t per = nn_per(rows, IFD_NN_CHUNK_FLOATS / (k + 1));
    int64_t least = (rows + IFD_XENT_CHUNKS - 1) / IFD_XENT_CHUNKS;
    x.s.per = per > least ? per : least;
    nn_run(ctx, &x.s, xent_chunk);
    double loss = 0.0;
    int64_t correct = 0;
    for (int64_t c = 0; c * x.s.per < rows; c++) {
        loss += x.loss[c];
        correct += x.correct[c];
    }
    out->loss = rows > 0 ? (float)(scale * loss / (double)rows) : 0.0f;
    out->correct = (float)correct;
}

static void cpu_softmax_xent(void *ctx, int64_t rows, int64_t k, const float *logits,
                             const int32_t *labels, float scale, float *dlogits, ifd_step_out *out)
{
    cpu_softmax_xent_classify(ctx, rows, k, logits, labels, scale, dlogits, out, NULL, NULL);
}

static void gemm_batch_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        ifd_cpu_gemm_one(s->ta, s->tb, s->m, s->nn, s->k, s->alpha, s->x + i * s->sa,
                         s->x2 + i * s->sb, s->beta, s->y + i * s->sc);
}

/* Each product on one thread, as gemm's on a caller without a team (the same bits), the
 * products spread over the team. */
static void cpu_gemm_strided_batched(void *ctx, int trans_a, int trans_b, int64_t m, int64_t n,
                                     int64_t k, float alpha, const float *a, int64_t stride_a,
                                     const float *b, int64_t stride_b, float beta, float *c,
                                     int64_t stride_c, int64_t batch)
{
    double macs = (double)m * (double)n * (double)k;
    int64_t per =
        macs >= IFD_TEAM_GEMM_MACS / 16 ? 1 : (int64_t)(IFD_TEAM_GEMM_MACS / 16 / (macs + 1.0)) + 1;
    nn_split s = {.n = batch,
                  .per = nn_per(batch, per),
                  .ta = trans_a,
                  .tb = trans_b,
                  .m = m,
                  .nn = n,
                  .k = k,
                  .alpha = alpha,
                  .beta = beta,
                  .x = a,
                  .x2 = b,
                  .y = c,
                  .sa = stride_a,
                  .sb = stride_b,
                  .sc = stride_c};
    nn_run(ctx, &s, gemm_batch_chunk);
}

static void embedding_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    ifd_nn_embedding(hi - lo, s->dim, s->ids + lo, s->x, s->y + lo * s->dim);
}

static void cpu_embedding(void *ctx, int64_t rows, int64_t dim, const int32_t *ids,
                          const float *table, float *out)
{
    nn_split s = {.n = rows,
                  .per = nn_per(rows, 4 * IFD_NN_CHUNK_FLOATS / (dim + 1)),
                  .dim = dim,
                  .ids = ids,
                  .x = table,
                  .y = out};
    nn_run(ctx, &s, embedding_chunk);
}

static void embedding_grad_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    ifd_nn_embedding_grad_cols(s->rows, s->dim, lo, hi, s->ids, s->x, s->y);
}

/* Split by columns: each column's sums run over the rows in order, as on one thread. */
static void cpu_embedding_grad(void *ctx, int64_t rows, int64_t dim, const int32_t *ids,
                               const float *dout, float *dtable)
{
    nn_split s = {.n = dim,
                  .per = nn_per(dim, nn_cols(rows)),
                  .rows = rows,
                  .dim = dim,
                  .ids = ids,
                  .x = dout,
                  .y = dtable};
    nn_run(ctx, &s, embedding_grad_chunk);
}

static void layernorm_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    ifd_nn_layernorm(hi - lo, s->dim, s->x + lo * s->dim, s->x2, s->x3, s->eps, s->y + lo * s->dim,
                     s->y2 + lo, s->y3 + lo);
}

static void cpu_layernorm(void *ctx, int64_t rows, int64_t dim, const float *x, const float *gamma,
                          const float *beta, float eps, float *y, float *mean, float *rstd)
{
    nn_split s = {.n = rows,
                  .per = nn_per(rows, IFD_NN_CHUNK_FLOATS / (dim + 1)),
                  .dim = dim,
                  .x = x,
                  .x2 = gamma,
                  .x3 = beta,
                  .eps = eps,
                  .y = y,
                  .y2 = mean,
                  .y3 = rstd};
    nn_run(ctx, &s, layernorm_chunk);
}

static void layernorm_params_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    ifd_nn_layernorm_grad_params(s->rows, s->dim, lo, hi, s->x, s->x3, s->x4, s->x5, s->y2, s->y3);
}

static void layernorm_input_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    ifd_nn_layernorm_grad_input(lo, hi, s->dim, s->x, s->x2, s->x3, s->x4, s->x5, s->y);
}

/* Two passes: dgamma and dbeta by columns (each over the rows in order), then dx by rows. */
static void cpu_layernorm_grad(void *ctx, int64_t rows, int64_t dim, const float *x,
                               const float *gamma, const float *mean, const float *rstd,
                               const float *dy, float *dx, float *dgamma, float *dbeta)
{
    nn_split s = {.n = dim,
                  .per = nn_per(dim, nn_sum_cols(rows)),
                  .rows = rows,
                  .dim = dim,
                  .x = x,
                  .x2 = gamma,
                  .x3 = mean,
                  .x4 = rstd,
                  .x5 = dy,
                  .y = dx,
                  .y2 = dgamma,
                  .y3 = dbeta};
    nn_run(ctx, &s, layernorm_params_chunk);
    s.n = rows;
    s.per = nn_per(rows, IFD_NN_CHUNK_FLOATS / (dim + 1));
    nn_run(ctx, &s, layernorm_input_chunk);
}

static void gelu_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    if (s->x2)
        ifd_nn_gelu_grad(hi - lo, s->x + lo, s->x2 + lo, s->y + lo);
    else
        ifd_nn_gelu(hi - lo, s->x + lo, s->y + lo);
}

static void cpu_gelu(void *ctx, int64_t n, const float *x, float *y)
{
    nn_split s = {.n = n, .per = nn_per(n, IFD_NN_CHUNK_FLOATS), .x = x, .y = y};
    nn_run(ctx, &s, gelu_chunk);
}

static void cpu_gelu_grad(void *ctx, int64_t n, const float *x, const float *dy, float *dx)
{
    nn_split s = {.n = n, .per = nn_per(n, IFD_NN_CHUNK_FLOATS), .x = x, .x2 = dy, .y = dx};
    nn_run(ctx, &s, gelu_chunk);
}

/* Attention in (sequence, head) pairs: chunk c takes pairs [c per, (c + 1) per). */
static void attention_chunk(void *arg, int64_t c)
{
    const nn_split *s = arg;
    int64_t lo, hi;
    nn_range(s, c, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        int64_t b = i / s->heads, h = i % s->heads;
        if (s->x3) /* the backward: each pair its own t * t of work */
            ifd_nn_attention_grad_head(s->t, s->heads, s->dh, b, h, s->x, s->x2, s->x3, s->y,
                                       s->y2 + i * s->t * s->t);
        else
            ifd_nn_attention_head(s->t, s->heads, s->dh, b, h, s->x, s->y2, s->y);
    }
}

static int64_t attention_per(int64_t pairs, int64_t t, int64_t dh)
{
    double macs = 2.0 * (double)t * (double)t * (double)dh; /* a pair's forward */
    int64_t per = macs >= IFD_NN_CHUNK_FLOATS ? 1 : (int64_t)(IFD_NN_CHUNK_FLOATS / macs) + 1;
    return nn_per(pairs, per);
}

static void cpu_attention(void *ctx, int64_t batch, int64_t t, int64_t heads, int64_t dh,
                          const float *qkv, float *probs, float *out)
{
    nn_split s = {.n = batch * heads,
                  .per = attention_per(batch * heads, t, dh),
                  .t = t,
                  .heads = heads,
                  .dh = dh,
                  .x = qkv,
                  .y = out,
                  .y2 = probs};
    nn_run(ctx, &s, attention_chunk);
}

static void cpu_attention_grad(void *ctx, int64_t batch, int64_t t, int64_t heads, int64_t dh,
                               const float *qkv, const float *probs, const float *dout, float *dqkv,
                               float *work)
{
    nn_split s = {.n = batch * heads,
                  .per = attention_per(batch * heads, t, dh),
                  .t = t,
                  .heads = heads,
                  .dh = dh,
                  .x = qkv,
                  .x2 = probs,
                  .x3 = dout,
                  .y = dqkv,
                  .y2 = work};
    nn_run(ctx, &s, attention_chunk);
}

void ifd_cpu_ops_init(ifd_ops *ops, void *ctx)
{
    ops->ctx = ctx;
    ops->gemm = ifd_cpu_gemm;
    ops->bias_add = cpu_bias_add;
    ops->col_sum = cpu_col_sum;
    ops->relu = cpu_relu;
    ops->relu_grad = cpu_relu_grad;
    ops->softmax_xent = cpu_softmax_xent;
    ops->squared_error = cpu_squared_error;
    ops->softmax = cpu_softmax;
    ops->tanh = cpu_tanh;
    ops->tanh_grad = cpu_tanh_grad;
    ops->l2_decay = cpu_l2_decay;
    ops->classify = cpu_classify;
    ops->softmax_xent_classify = cpu_softmax_xent_classify;
    ops->copy = cpu_copy;
    ops->fill = cpu_fill;
    ops->add = cpu_add;
    ops->gemm_strided_batched = cpu_gemm_strided_batched;
    ops->embedding = cpu_embedding;
    ops->embedding_grad = cpu_embedding_grad;
    ops->layernorm = cpu_layernorm;
    ops->layernorm_grad = cpu_layernorm_grad;
    ops->gelu = cpu_gelu;
    ops->gelu_grad = cpu_gelu_grad;
    ops->attention = cpu_attention;
    ops->attention_grad = cpu_attention_grad;
    ops->gemm_bias = ifd_cpu_gemm_bias;
}
