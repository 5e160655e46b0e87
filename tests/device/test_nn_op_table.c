/*
 * The transformer's ops through the cpu backend's op table (ifd_cpu_ops_init), on random shapes
 * and data, with no team and with a team of random size: fill writes its value; the others give
 * the bits of the one-thread functions of device/nn_cpu.c (which test_nn_ops checks against
 * double-precision references and finite differences); gemm_strided_batched gives the bits of a
 * loop of gemm (and is near a double-precision product), add is near its double-precision sum;
 * bias_add, col_sum and the cross-entropy (split over the team too) against plain loops here.
 */
#include "device/cpu/team.h"
#include "device/math.h"
#include "device/nn_cpu.h"
#include "device/step.h"
#include "tests/util/numbers.h"
#include "tests/util/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float *copyf(const float *x, int64_t n)
{
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

static void same_bits(const char *what, const float *got, const float *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        RASSERT(memcmp(got + i, want + i, sizeof *got) == 0, "%s[%lld]: %.9g, expected %.9g", what,
                (long long)i, (double)got[i], (double)want[i]);
}

/* The op tables under test: [0] with no team, [1] with a team of 2 to 4 threads. */
typedef struct tables {
    ifd_team *team;
    ifd_ops ops[2];
} tables;

static void tables_init(tables *t, ifd_rng *rng)
{
    ck_assert_int_eq(ifd_team_create(&t->team, (int)rand_between(rng, 2, 4), "test-nn"), IFD_OK);
    ifd_cpu_ops_init(&t->ops[0], NULL);
    ifd_cpu_ops_init(&t->ops[1], t->team);
}

START_TEST(fill_add_and_gelu)
{
    ifd_rng rng;
    seed_rng(&rng);
    tables t;
    tables_init(&t, &rng);
    int64_t n = rand_between(&rng, 1, 200000);
    float alpha = (float)(ifd_rng_uniform(&rng) * 4.0 - 2.0);
    float *x = tu_frand_scaled(&rng, n, 4.0), *y0 = tu_frand_scaled(&rng, n, 4.0),
          *dy = tu_frand_scaled(&rng, n, 1.0);
    float *want = malloc((size_t)n * 4), *wantg = malloc((size_t)n * 4);
    ifd_nn_gelu(n, x, want);
    ifd_nn_gelu_grad(n, x, dy, wantg);
    for (int i = 0; i < 2; i++) {
        float *y = copyf(y0, n), *g = malloc((size_t)n * 4), *dx = copyf(dy, n);
        t.ops[i].add(t.ops[i].ctx, n, alpha, x, y);
        for (int64_t j = 0; j < n; j++)
            RASSERT(fabs(y[j] - ((double)y0[j] + (double)alpha * x[j])) <=
                        1e-6 * (1.0 + fabs(y0[j]) + fabs(alpha * x[j])),
                    "add[%lld]", (long long)j);
        t.ops[i].gelu(t.ops[i].ctx, n, x, g);
        same_bits("gelu", g, want, n);
        float value = (float)(ifd_rng_uniform(&rng) * 2.0 - 1.0);
        t.ops[i].fill(t.ops[i].ctx, n, value, dx);
        for (int64_t j = 0; j < n; j++)
            RASSERT(dx[j] == value, "fill[%lld]: %g, not %g", (long long)j, (double)dx[j],
                    (double)value);
        memcpy(dx, dy, (size_t)n * sizeof *dx);
        t.ops[i].gelu_grad(t.ops[i].ctx, n, x, dx, dx); /* dx may be dy */
        same_bits("gelu_grad", dx, wantg, n);
        t.ops[i].gelu(t.ops[i].ctx, n, g, g); /* y may be x */
        free(y), free(g), free(dx);
    }
    float *y1 = copyf(y0, n), *y2 = copyf(y0, n), *y3 = copyf(y0, n);
    t.ops[0].add(NULL, n, alpha, x, y1);
    t.ops[1].add(t.team, n, alpha, x, y2);
    same_bits("add with a team", y2, y1, n);
    for (int64_t j = 0; j < n; j++) /* the plain loop's bits (the op's AVX builds: no FMA) */
        y3[j] += alpha * x[j];
    same_bits("add against the plain loop", y1, y3, n);
    free(x), free(y0), free(dy), free(want), free(wantg), free(y1), free(y2), free(y3);
    ifd_team_destroy(t.team);
}
END_TEST

/* One random product shape of a batch, with gaps between the matrices (or B shared: stride 0). */
START_TEST(gemm_strided_batched_is_a_loop_of_gemm)
{
    ifd_rng rng;
    seed_rng(&rng);
    tables t;
    tables_init(&t, &rng);
    int ta = (int)ifd_rng_below(&rng, 2), tb = (int)ifd_rng_below(&rng, 2);
    int64_t m = rand_between(&rng, 1, 70), n = rand_between(&rng, 1, 70),
            k = rand_between(&rng, 1, 70), batch = rand_between(&rng, 1, 40);
    int64_t sa = m * k + rand_between(&rng, 0, 5), sc = m * n + rand_between(&rng, 0, 5);
    int64_t sb = ifd_rng_below(&rng, 4) == 0 ? 0 : k * n + rand_between(&rng, 0, 5);
    float alpha = (float)(ifd_rng_uniform(&rng) * 2.0 - 1.0);
    float beta = ifd_rng_below(&rng, 2) ? 0.0f : 0.5f;
    int64_t na = sa * batch, nb = (sb ? sb * batch : k * n), nc = sc * batch;
    float *a = tu_frand_scaled(&rng, na, 1.0), *b = tu_frand_scaled(&rng, nb, 1.0),
          *c0 = tu_frand_scaled(&rng, nc, 1.0);
    float *want = copyf(c0, nc);
    for (int64_t i = 0; i < batch; i++)
        t.ops[0].gemm(NULL, ta, tb, m, n, k, alpha, a + i * sa, b + i * sb, beta, want + i * sc);
    for (int64_t i = 0; i < batch; i++) /* near the double-precision product */
        for (int64_t r = 0; r < m; r++)
            for (int64_t col = 0; col < n; col++) {
                double s = 0;
                for (int64_t j = 0; j < k; j++)
                    s += (double)a[i * sa + (ta ? j * m + r : r * k + j)] *
                         b[i * sb + (tb ? col * k + j : j * n + col)];
                double w = alpha * s + beta * (double)c0[i * sc + r * n + col];
                RASSERT(fabs(want[i * sc + r * n + col] - w) <= 1e-5 * (1.0 + (double)k),
                        "product %lld [%lld,%lld]", (long long)i, (long long)r, (long long)col);
            }
    for (int i = 0; i < 2; i++) {
        float *c = copyf(c0, nc);
        t.ops[i].gemm_strided_batched(t.ops[i].ctx, ta, tb, m, n, k, alpha, a, sa, b, sb, beta, c,
                                      sc, batch);
        same_bits(i ? "batched with a team" : "batched", c, want, nc); /* the gaps untouched too */
        free(c);
    }
    free(a), free(b), free(c0), free(want);
    ifd_team_destroy(t.team);
}
END_TEST

START_TEST(embedding_and_layernorm)
{
    ifd_rng rng;
    seed_rng(&rng);
    tables t;
    tables_init(&t, &rng);
    int64_t rows = rand_between(&rng, 1, 700), dim = rand_between(&rng, 1, 130);
    int64_t vocab = rand_between(&rng, 1, 20);
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    for (int64_t r = 0; r < rows; r++)
        ids[r] = (int32_t)ifd_rng_below(&rng, (uint64_t)vocab);
    int64_t n = rows * dim;
    float *table = tu_frand_scaled(&rng, vocab * dim, 1.0), *dout = tu_frand_scaled(&rng, n, 1.0);
    float *dt0 = tu_frand_scaled(&rng, vocab * dim, 1.0), *x = tu_frand_scaled(&rng, n, 2.0);
    float *g = tu_frand_scaled(&rng, dim, 1.5), *b = tu_frand_scaled(&rng, dim, 1.0),
          *dy = tu_frand_scaled(&rng, n, 1.0);
    float *dg0 = tu_frand_scaled(&rng, dim, 1.0), *db0 = tu_frand_scaled(&rng, dim, 1.0);
    /* the one-thread functions' bits */
    float *emb = malloc((size_t)n * 4), *dt = copyf(dt0, vocab * dim), *y = malloc((size_t)n * 4);
    float *mean = malloc((size_t)rows * 4), *rstd = malloc((size_t)rows * 4);
    float *dx = malloc((size_t)n * 4), *dg = copyf(dg0, dim), *db = copyf(db0, dim);
    ifd_nn_embedding(rows, dim, ids, table, emb);
    ifd_nn_embedding_grad(rows, dim, ids, dout, dt);
    ifd_nn_layernorm(rows, dim, x, g, b, 1e-5f, y, mean, rstd);
    ifd_nn_layernorm_grad(rows, dim, x, g, mean, rstd, dy, dx, dg, db);
    for (int i = 0; i < 2; i++) {
        const ifd_ops *o = &t.ops[i];
        float *emb2 = malloc((size_t)n * 4), *dt2 = copyf(dt0, vocab * dim);
        float *y2 = copyf(x, n), *mean2 = malloc((size_t)rows * 4),
              *rstd2 = malloc((size_t)rows * 4);
        float *dx2 = copyf(dy, n), *dg2 = copyf(dg0, dim), *db2 = copyf(db0, dim);
        o->embedding(o->ctx, rows, dim, ids, table, emb2);
        same_bits("embedding", emb2, emb, n);
        o->embedding_grad(o->ctx, rows, dim, ids, dout, dt2);
        same_bits("embedding_grad", dt2, dt, vocab * dim);
        o->layernorm(o->ctx, rows, dim, y2, g, b, 1e-5f, y2, mean2, rstd2); /* y may be x */
        same_bits("layernorm", y2, y, n);
        same_bits("layernorm mean", mean2, mean, rows);
        same_bits("layernorm rstd", rstd2, rstd, rows);
        o->layernorm_grad(o->ctx, rows, dim, x, g, mean, rstd, dx2, dx2, dg2, db2); /* dx = dy */
        same_bits("layernorm dx", dx2, dx, n);
        same_bits("layernorm dgamma", dg2, dg, dim);
        same_bits("layernorm dbeta", db2, db, dim);
        free(emb2), free(dt2), free(y2), free(mean2), free(rstd2), free(dx2), free(dg2), free(db2);
    }
    free(ids), free(table), free(dout), free(dt0), free(x), free(g), free(b), free(dy), free(dg0);
    free(db0), free(emb), free(dt), free(y), free(mean), free(rstd), free(dx), free(dg), free(db);
    ifd_team_destroy(t.team);
}
END_TEST

/* The layer norm's parameter gradients over columns [c0, c1) (in tiles of up to 256 columns)
 * against the plain loop here, rows outer: the same bits, for ranges that start and end
 * anywhere, of one tile and of several. */
START_TEST(layernorm_param_grads_are_row_order_sums)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t rows = rand_between(&rng, 1, 300), dim = rand_between(&rng, 1, _i % 2 ? 100 : 700);
    int64_t c0 = rand_between(&rng, 0, dim - 1), c1 = rand_between(&rng, c0 + 1, dim);
    int64_t n = rows * dim;
    float *x = tu_frand_scaled(&rng, n, 2.0), *dy = tu_frand_scaled(&rng, n, 1.0);
    float *mean = tu_frand_scaled(&rng, rows, 0.5), *rstd = tu_frand_scaled(&rng, rows, 2.0);
    float *dg0 = tu_frand_scaled(&rng, dim, 1.0), *db0 = tu_frand_scaled(&rng, dim, 1.0);
    float *dg = copyf(dg0, dim), *db = copyf(db0, dim), *want_g = copyf(dg0, dim),
          *want_b = copyf(db0, dim);
    ifd_nn_layernorm_grad_params(rows, dim, c0, c1, x, mean, rstd, dy, dg, db);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = c0; c < c1; c++) {
            float xhat = (x[r * dim + c] - mean[r]) * rstd[r];
            want_g[c] += dy[r * dim + c] * xhat;
            want_b[c] += dy[r * dim + c];
        }
    same_bits("dgamma", dg, want_g, dim);
    same_bits("dbeta", db, want_b, dim);
    free(x), free(dy), free(mean), free(rstd), free(dg0), free(db0), free(dg), free(db);
    free(want_g), free(want_b);
}
END_TEST

/* bias_add and col_sum (split by rows and by columns over the team) give the plain loops' bits
 * here; softmax_xent (in chunks of rows) gives each row's dlogits as ifd_nn_softmax_xent_rows
 * over all rows at once, near device/math.h's one-row function, the same loss bits with and
 * without a team, near the double sum of the rows' losses, and the count of rows whose argmax is
 * the label. Shapes of one chunk and of many. */
START_TEST(bias_col_sum_and_xent)
{
    ifd_rng rng;
    seed_rng(&rng);
    tables t;
    tables_init(&t, &rng);
    int64_t rows = rand_between(&rng, 1, _i % 2 ? 40 : 3000), cols = rand_between(&rng, 1, 700);
    int64_t n = rows * cols;
    float *x = tu_frand_scaled(&rng, n, 3.0), *bias = tu_frand_scaled(&rng, cols, 1.0);
    int32_t *labels = malloc((size_t)rows * sizeof *labels);
    for (int64_t r = 0; r < rows; r++)
        labels[r] = (int32_t)ifd_rng_below(&rng, (uint64_t)cols);
    float *want_b = copyf(x, n), *want_s = calloc((size_t)cols, 4), *want_d = malloc((size_t)n * 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            want_b[r * cols + c] += bias[c];
            want_s[c] += x[r * cols + c];
        }
    float scale = (float)tu_urand(&rng, 0.5, 2.0), gscale = scale / (float)rows;
    double want_loss = 0.0;
    int64_t want_correct = 0, nn_correct = 0;
    float *row_d = malloc((size_t)cols * 4);
    for (int64_t r = 0; r < rows; r++) {
        int ok;
        want_loss += ifd_math_softmax_xent_row(x + r * cols, cols, labels[r], gscale, row_d, &ok);
        want_correct += ok;
        for (int64_t c = 0; c < cols; c++)
            want_d[r * cols + c] = row_d[c];
    }
    free(row_d);
    want_loss = scale * want_loss / (double)rows;
    float *math_d = copyf(want_d, n);
    ifd_nn_softmax_xent_rows(0, rows, cols, x, labels, gscale, want_d, &nn_correct, NULL, NULL);
    RASSERT(nn_correct == want_correct, "correct %lld, the rows' %lld", (long long)nn_correct,
            (long long)want_correct);
    for (int64_t i = 0; i < n; i++)
        RASSERT(fabsf(want_d[i] - math_d[i]) <= 1e-6f * gscale + 1e-6f * fabsf(math_d[i]),
                "dlogits[%lld] %.9g, device/math.h's %.9g", (long long)i, (double)want_d[i],
                (double)math_d[i]);
    free(math_d);
    ifd_step_out o[2];
    for (int i = 0; i < 2; i++) {
        const ifd_ops *op = &t.ops[i];
        float *b = copyf(x, n), *sum = tu_frand_scaled(&rng, cols, 1.0), *d = malloc((size_t)n * 4);
        op->bias_add(op->ctx, rows, cols, bias, b);
        same_bits("bias_add", b, want_b, n);
        op->col_sum(op->ctx, rows, cols, x, sum);
        same_bits("col_sum", sum, want_s, cols);
        o[i] = (ifd_step_out){0};
        op->softmax_xent(op->ctx, rows, cols, x, labels, scale, d, &o[i]);
        same_bits("softmax_xent dlogits", d, want_d, n);
        RASSERT(fabs(o[i].loss - want_loss) <= 1e-6 * fabs(want_loss) + 1e-7 &&
                    o[i].correct == (float)want_correct,
                "softmax_xent of %lld x %lld: loss %.9g, correct %g; the rows' %.9g, %lld",
                (long long)rows, (long long)cols, (double)o[i].loss, (double)o[i].correct,
                want_loss, (long long)want_correct);
        free(b), free(sum), free(d);
    }
    RASSERT(memcmp(&o[0].loss, &o[1].loss, sizeof o[0].loss) == 0,
            "softmax_xent's loss %.9g with a team, %.9g without", (double)o[1].loss,
            (double)o[0].loss);
    free(x), free(bias), free(labels), free(want_b), free(want_s), free(want_d);
    ifd_team_destroy(t.team);
}
END_TEST

START_TEST(attention_forward_and_backward)
{
    ifd_rng rng;
    seed_rng(&rng);
    tables t;
    tables_init(&t, &rng);
    int64_t batch = rand_between(&rng, 1, 5), tt = rand_between(&rng, 1, 40),
            heads = rand_between(&rng, 1, 4), dh = rand_between(&rng, 1, 24);
    int64_t c = heads * dh, nin = batch * tt * 3 * c, nout = batch * tt * c;
    int64_t np = batch * heads * tt * tt;
    float *qkv = tu_frand_scaled(&rng, nin, 1.5), *dout = tu_frand_scaled(&rng, nout, 1.0);
    float *out = malloc((size_t)nout * 4), *probs = malloc((size_t)np * 4);
    float *dqkv = malloc((size_t)nin * 4), *work = malloc((size_t)(tt * tt) * 4);
    ifd_nn_attention(batch, tt, heads, dh, qkv, probs, out);
    ifd_nn_attention_grad(batch, tt, heads, dh, qkv, probs, dout, dqkv, work);
    for (int i = 0; i < 2; i++) {
        const ifd_ops *o = &t.ops[i];
        float *out2 = malloc((size_t)nout * 4), *probs2 = malloc((size_t)np * 4);
        float *dqkv2 = malloc((size_t)nin * 4), *work2 = malloc((size_t)np * 4);
        o->attention(o->ctx, batch, tt, heads, dh, qkv, probs2, out2);
        same_bits("attention out", out2, out, nout);
        same_bits("attention probs", probs2, probs, np);
        o->attention_grad(o->ctx, batch, tt, heads, dh, qkv, probs2, dout, dqkv2, work2);
        same_bits("attention dqkv", dqkv2, dqkv, nin);
        free(out2), free(probs2), free(dqkv2), free(work2);
    }
    free(qkv), free(dout), free(out), free(probs), free(dqkv), free(work);
    ifd_team_destroy(t.team);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("nn_op_table");
    TCase *tc = tu_tcase(s, "ops", 60);
    tcase_add_loop_test(tc, fill_add_and_gelu, 0, 6);
    tcase_add_loop_test(tc, gemm_strided_batched_is_a_loop_of_gemm, 0, 10);
    tcase_add_loop_test(tc, embedding_and_layernorm, 0, 8);
    tcase_add_loop_test(tc, layernorm_param_grads_are_row_order_sums, 0, 8);
    tcase_add_loop_test(tc, bias_col_sum_and_xent, 0, 8);
    tcase_add_loop_test(tc, attention_forward_and_backward, 0, 8);
    return tu_run_suite(s);
}
