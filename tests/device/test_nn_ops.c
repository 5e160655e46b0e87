/*
 * The transformer's host ops (device/nn_cpu.c) on random shapes and data: each forward against a
 * double-precision reference written here, each backward against the finite differences of that
 * reference (a random upstream gradient G, the loss sum(G * f(inputs))), and the embedding's
 * scatter-add with repeated ids against the reference's sums.
 */
#include "device/nn_cpu.h"
#include "tests/util/numbers.h"
#include "tests/util/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double *to_double(const float *x, int64_t n)
{
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    for (int64_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* |got - want| <= atol + rtol |want| for each element, naming the first that is not. */
static void close_to(const char *what, const float *got, const double *want, int64_t n, double rtol,
                     double atol)
{
    for (int64_t i = 0; i < n; i++)
        RASSERT(fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]),
                "%s[%lld]: %.8g, reference %.8g", what, (long long)i, (double)got[i], want[i]);
}

/* ---- references, double precision ---- */

static void ref_layernorm(int64_t rows, int64_t dim, const double *x, const double *g,
                          const double *b, double eps, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < dim; c++)
            m += x[r * dim + c];
        m /= (double)dim;
        for (int64_t c = 0; c < dim; c++)
            v += (x[r * dim + c] - m) * (x[r * dim + c] - m);
        v /= (double)dim;
        for (int64_t c = 0; c < dim; c++)
            y[r * dim + c] = (x[r * dim + c] - m) / sqrt(v + eps) * g[c] + b[c];
    }
}

static void ref_gelu(int64_t n, const double *x, double *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
}

static void ref_attention(int64_t batch, int64_t t, int64_t heads, int64_t dh, const double *qkv,
                          double *out)
{
    int64_t c = heads * dh, ld = 3 * c;
    double *s = malloc((size_t)t * sizeof *s);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < t; i++) {
                const double *q = qkv + (b * t + i) * ld + h * dh;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = qkv + (b * t + j) * ld + c + h * dh;
                    s[j] = 0;
                    for (int64_t d = 0; d < dh; d++)
                        s[j] += q[d] * k[d];
                    s[j] /= sqrt((double)dh);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int64_t j = 0; j <= i; j++)
                    sum += (s[j] = exp(s[j] - mx));
                double *o = out + (b * t + i) * c + h * dh;
                for (int64_t d = 0; d < dh; d++) {
                    o[d] = 0;
                    for (int64_t j = 0; j <= i; j++)
                        o[d] += s[j] / sum * qkv[(b * t + j) * ld + 2 * c + h * dh + d];
                }
            }
    free(s);
}

/* The finite-difference gradient of sum(G * f(x)) at coordinate i, f a reference forward of
 * nin inputs to nout outputs (closure: fn(ctx, x, y)). */
typedef void (*ref_fn)(void *ctx, const double *x, double *y);

static double fd_grad(ref_fn f, void *ctx, double *x, int64_t i, const double *g, int64_t nout)
{
    double *y = malloc((size_t)nout * sizeof *y), h = 1e-5 * (1.0 + fabs(x[i])), lp = 0, lm = 0;
    double x0 = x[i];
    x[i] = x0 + h;
    f(ctx, x, y);
    for (int64_t j = 0; j < nout; j++)
        lp += g[j] * y[j];
    x[i] = x0 - h;
    f(ctx, x, y);
    for (int64_t j = 0; j < nout; j++)
        lm += g[j] * y[j];
    x[i] = x0;
    free(y);
    return (lp - lm) / (2 * h);
}

/* Checks up to most random coordinates (all when most covers them) of an analytic gradient
 * against fd. */
static void grad_check_n(const char *what, ref_fn f, void *ctx, double *x, int64_t nin,
                         const double *g, int64_t nout, const float *analytic, ifd_rng *rng,
                         int64_t most)
{
    int64_t checks = nin < most ? nin : most;
    for (int64_t k = 0; k < checks; k++) {
        int64_t i = nin < most ? k : (int64_t)ifd_rng_below(rng, (uint64_t)nin);
        double want = fd_grad(f, ctx, x, i, g, nout);
        RASSERT(fabs(analytic[i] - want) <= 2e-3 + 2e-3 * fabs(want),
                "%s: gradient %lld: %.7g, finite differences %.7g", what, (long long)i,
                (double)analytic[i], want);
    }
}

static void grad_check(const char *what, ref_fn f, void *ctx, double *x, int64_t nin,
                       const double *g, int64_t nout, const float *analytic, ifd_rng *rng)
{
    grad_check_n(what, f, ctx, x, nin, g, nout, analytic, rng, 40);
}

/* ---- embedding ---- */

START_TEST(embedding_and_its_scatter_add)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t rows = rand_between(&rng, 1, 200), dim = rand_between(&rng, 1, 40);
    int64_t vocab = rand_between(&rng, 1, 12); /* few ids: many repeats */
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    for (int64_t r = 0; r < rows; r++)
        ids[r] = (int32_t)ifd_rng_below(&rng, (uint64_t)vocab);
    float *table = tu_frand_scaled(&rng, vocab * dim, 1.0),
          *out = tu_frand_scaled(&rng, rows * dim, 1.0);
    ifd_nn_embedding(rows, dim, ids, table, out);
    for (int64_t r = 0; r < rows; r++)
        ck_assert(memcmp(out + r * dim, table + ids[r] * dim, (size_t)dim * 4) == 0);
    float *dout = tu_frand_scaled(&rng, rows * dim, 1.0),
          *dtable = tu_frand_scaled(&rng, vocab * dim, 1.0);
    double *want = to_double(dtable, vocab * dim);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < dim; c++)
            want[ids[r] * dim + c] += dout[r * dim + c];
    float *again = malloc((size_t)(vocab * dim) * 4);
    memcpy(again, dtable, (size_t)(vocab * dim) * 4);
    ifd_nn_embedding_grad(rows, dim, ids, dout, dtable);
    close_to("dtable", dtable, want, vocab * dim, 1e-5, 1e-5);
    ifd_nn_embedding_grad(rows, dim, ids, dout, again); /* the same bits again */
    ck_assert(memcmp(again, dtable, (size_t)(vocab * dim) * 4) == 0);
    free(ids), free(table), free(out), free(dout), free(dtable), free(want), free(again);
}
END_TEST

/* ---- layer norm ---- */

typedef struct ln_ctx {
    int64_t rows, dim;
    int which; /* the input the closure varies: 0 x, 1 gamma, 2 beta */
    const double *x, *g, *b;
} ln_ctx;

static void ln_ref(void *arg, const double *v, double *y)
{
    const ln_ctx *c = arg;
    ref_layernorm(c->rows, c->dim, c->which == 0 ? v : c->x, c->which == 1 ? v : c->g,
                  c->which == 2 ? v : c->b, 1e-5, y);
}

START_TEST(layernorm_forward_and_gradients)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t rows = rand_between(&rng, 1, 9), dim = rand_between(&rng, 2, 33);
    int64_t n = rows * dim;
    float *x = tu_frand_scaled(&rng, n, 2.0), *g = tu_frand_scaled(&rng, dim, 1.5),
          *b = tu_frand_scaled(&rng, dim, 1.0);
    for (int64_t i = 0; i < n; i++)
        x[i] += (float)(i % dim) * 0.1f; /* a mean away from 0 */
    float *y = malloc((size_t)n * 4), *mean = malloc((size_t)rows * 4),
          *rstd = malloc((size_t)rows * 4);
    ifd_nn_layernorm(rows, dim, x, g, b, 1e-5f, y, mean, rstd);
    double *xd = to_double(x, n), *gd = to_double(g, dim), *bd = to_double(b, dim);
    double *yd = malloc((size_t)n * sizeof *yd);
    ref_layernorm(rows, dim, xd, gd, bd, 1e-5, yd);
    close_to("layernorm y", y, yd, n, 1e-5, 1e-5);
    float *dy = tu_frand_scaled(&rng, n, 1.0), *dx = malloc((size_t)n * 4);
    float *dg = calloc((size_t)dim, 4), *db = calloc((size_t)dim, 4);
    ifd_nn_layernorm_grad(rows, dim, x, g, mean, rstd, dy, dx, dg, db);
    double *gy = to_double(dy, n);
    ln_ctx c = {rows, dim, 0, xd, gd, bd};
    grad_check("layernorm dx", ln_ref, &c, xd, n, gy, n, dx, &rng);
    c.which = 1;
    grad_check("layernorm dgamma", ln_ref, &c, gd, dim, gy, n, dg, &rng);
    c.which = 2;
    grad_check("layernorm dbeta", ln_ref, &c, bd, dim, gy, n, db, &rng);
    free(x), free(g), free(b), free(y), free(mean), free(rstd), free(xd), free(gd), free(bd);
    free(yd), free(dy), free(dx), free(dg), free(db), free(gy);
}
END_TEST

/* ---- GELU ---- */

static void gelu_ref(void *arg, const double *x, double *y)
{
    ref_gelu(*(const int64_t *)arg, x, y);
}

START_TEST(gelu_forward_and_gradient)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t n = rand_between(&rng, 1, 300);
    float *x = tu_frand_scaled(&rng, n, 5.0), *y = malloc((size_t)n * 4),
          *dy = tu_frand_scaled(&rng, n, 1.0);
    float *dx = malloc((size_t)n * 4);
    ifd_nn_gelu(n, x, y);
    double *xd = to_double(x, n), *yd = malloc((size_t)n * sizeof *yd), *gd = to_double(dy, n);
    ref_gelu(n, xd, yd);
    close_to("gelu", y, yd, n, 1e-5, 1e-6);
    ifd_nn_gelu_grad(n, x, dy, dx);
    grad_check("gelu dx", gelu_ref, &n, xd, n, gd, n, dx, &rng);
    /* the loops the CPU runs (AVX-512 or AVX2 where it has them) give the baseline's bits */
    float *yb = malloc((size_t)n * 4), *dxb = malloc((size_t)n * 4);
    ifd_nn_gelu_baseline(n, x, yb);
    ifd_nn_gelu_grad_baseline(n, x, dy, dxb);
    for (int64_t i = 0; i < n; i++)
        RASSERT(memcmp(&y[i], &yb[i], 4) == 0 && memcmp(&dx[i], &dxb[i], 4) == 0,
                "gelu at x = %.9g: %.9g and %.9g, the baseline ISA's %.9g and %.9g", (double)x[i],
                (double)y[i], (double)dx[i], (double)yb[i], (double)dxb[i]);
    free(yb), free(dxb);
    ifd_nn_gelu(n, x, x); /* in place */
    ck_assert(memcmp(x, y, (size_t)n * 4) == 0);
    free(x), free(y), free(dy), free(dx), free(xd), free(yd), free(gd);
}
END_TEST

/* ---- causal self-attention ---- */

typedef struct att_ctx {
    int64_t batch, t, heads, dh;
} att_ctx;

static void att_ref(void *arg, const double *qkv, double *out)
{
    const att_ctx *a = arg;
    ref_attention(a->batch, a->t, a->heads, a->dh, qkv, out);
}

/* Short sequences (_i 0 to 7: 40 random coordinates of the gradient) and, from _i 8, sequences
 * of several of the op's row blocks (33 to 100 positions, every coordinate checked: each
 * block's products take the columns up to its diagonal only). */
START_TEST(attention_forward_and_gradient)
{
    ifd_rng rng;
    seed_rng(&rng);
    int longer = _i >= 8;
    att_ctx a = {rand_between(&rng, 1, longer ? 2 : 3),
                 longer ? rand_between(&rng, 33, 100) : rand_between(&rng, 1, 9),
                 rand_between(&rng, 1, longer ? 2 : 3), rand_between(&rng, 1, longer ? 3 : 8)};
    int64_t c = a.heads * a.dh, nin = a.batch * a.t * 3 * c, nout = a.batch * a.t * c;
    float *qkv = tu_frand_scaled(&rng, nin, 1.5), *out = malloc((size_t)nout * 4);
    float *probs = malloc((size_t)(a.batch * a.heads * a.t * a.t) * 4);
    ifd_nn_attention(a.batch, a.t, a.heads, a.dh, qkv, probs, out);
    double *qd = to_double(qkv, nin), *od = malloc((size_t)nout * sizeof *od);
    att_ref(&a, qd, od);
    close_to("attention out", out, od, nout, 1e-5, 1e-5);
    for (int64_t bh = 0; bh < a.batch * a.heads; bh++) /* causal: nothing above the diagonal */
        for (int64_t i = 0; i < a.t; i++)
            for (int64_t j = i + 1; j < a.t; j++)
                ck_assert(probs[(bh * a.t + i) * a.t + j] == 0.0f);
    float *dout = tu_frand_scaled(&rng, nout, 1.0), *dqkv = malloc((size_t)nin * 4);
    float *work = malloc((size_t)(a.t * a.t) * 4);
    ifd_nn_attention_grad(a.batch, a.t, a.heads, a.dh, qkv, probs, dout, dqkv, work);
    double *gd = to_double(dout, nout);
    grad_check_n("attention dqkv", att_ref, &a, qd, nin, gd, nout, dqkv, &rng, longer ? nin : 40);
    free(qkv), free(out), free(probs), free(qd), free(od), free(dout), free(dqkv), free(work);
    free(gd);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("nn_ops");
    TCase *tc = tu_tcase(s, "ops", 60);
    tcase_add_loop_test(tc, embedding_and_its_scatter_add, 0, 8);
    tcase_add_loop_test(tc, layernorm_forward_and_gradients, 0, 8);
    tcase_add_loop_test(tc, gelu_forward_and_gradient, 0, 8);
    tcase_add_loop_test(tc, attention_forward_and_gradient, 0, 12);
    return tu_run_suite(s);
}
