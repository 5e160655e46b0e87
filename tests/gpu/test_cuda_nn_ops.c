/*
 * The cuda backend's transformer ops (device/cuda/nn_kernels.cu, ops.c) against the host's
 * (device/nn_cpu.c, itself checked against double-precision references and finite differences in
 * tests/device/test_nn_ops.c), called directly through ifd_cuda_opset on random shapes and data.
 *
 * Tolerances: |cuda - cpu| <= REL_TOL * max |cpu| over the tensor, for the ops whose sums or
 * library functions (erff, expf, cuBLAS's blocking) run in another order than the host's; the
 * strided batched product, whose host side is a double-precision loop here, within REL_TOL of the
 * sum of its terms' magnitudes. Bit for bit: fill, add and embedding (no sum), embedding_grad (the
 * host's additions in the host's order, see nn_kernels.cu), and every op's second run on the same
 * inputs (no float atomics); gemm_bias against a double loop. Exits 77 (CTest: skipped) where no
 * GPU is usable.
 */
#include "device/cuda/opset.h"
#include "device/nn_cpu.h"
#include "tests/gpu/gpu_probe.h"
#include "tests/util/testutil.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REL_TOL 1e-5

static ifd_cuda_opset *g_set;
static const ifd_ops *g_ops;

static void open_set(void)
{
    ifd_cuda_opset_close(g_set); /* one a failed test left open */
    ifd_error err;
    ifd_error_clear(&err);
    RC_OK(ifd_cuda_opset_open(0, &g_set, &err), err);
    g_ops = ifd_cuda_opset_ops(g_set);
}

static void close_set(void)
{
    ifd_cuda_opset_close(g_set);
    g_set = NULL;
}

static void sync_ok(const char *what)
{
    ifd_error err;
    ifd_error_clear(&err);
    int rc = ifd_cuda_opset_sync(g_set, &err);
    RASSERT(rc == IFD_OK, "%s: %s: %s", what, ifd_errname(rc), ifd_error_text(&err));
}

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        RASSERT(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                       \
    } while (0)

/* Device copies of host arrays, and back. */
static void *dev_put(const void *h, int64_t bytes)
{
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, (size_t)(bytes > 0 ? bytes : 4)));
    if (bytes > 0)
        CUDA_OK(cudaMemcpy(d, h, (size_t)bytes, cudaMemcpyHostToDevice));
    return d;
}

static void *dev_alloc(int64_t bytes)
{
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, (size_t)(bytes > 0 ? bytes : 4)));
    return d;
}

static void dev_get(void *h, const void *d, int64_t bytes)
{
    if (bytes > 0)
        CUDA_OK(cudaMemcpy(h, d, (size_t)bytes, cudaMemcpyDeviceToHost));
}

static float *randf(ifd_rng *rng, int64_t n, double scale)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((ifd_rng_uniform(rng) * 2.0 - 1.0) * scale);
    return x;
}

/* The cuda result against the cpu one: |got - want| <= REL_TOL * max |want|, naming the first
 * element that is not. */
static void close_to_cpu(const char *what, const float *got, const float *want, int64_t n)
{
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        RASSERT(fabs((double)got[i] - want[i]) <= REL_TOL * mx + 1e-30,
                "%s[%lld]: %.9g on cuda, %.9g on cpu (max |cpu| %.6g)", what, (long long)i,
                (double)got[i], (double)want[i], mx);
}

static void bits_equal(const char *what, const void *a, const void *b, int64_t n)
{
    const float *x = a, *y = b;
    for (int64_t i = 0; i < n; i++)
        RASSERT(memcmp(&x[i], &y[i], sizeof(float)) == 0, "%s[%lld]: %.9g and %.9g", what,
                (long long)i, (double)x[i], (double)y[i]);
}

/* x[lo, hi) = value, the floats around it untouched. */
START_TEST(fill_writes_its_range)
{
    ifd_rng rng;
    seed_rng(&rng);
    open_set();
    int64_t n = rand_between(&rng, 1, 100000), lo = rand_between(&rng, 0, n - 1);
    int64_t hi = rand_between(&rng, lo, n);
    float value = (float)(ifd_rng_uniform(&rng) * 4.0 - 2.0);
    float *x = randf(&rng, n, 3.0), *got = malloc((size_t)n * 4);
    float *dx = dev_put(x, n * 4);
    g_ops->fill(g_ops->ctx, hi - lo, value, dx + lo);
    sync_ok("fill");
    dev_get(got, dx, n * 4);
    for (int64_t i = lo; i < hi; i++)
        x[i] = value;
    bits_equal("fill", got, x, n);
    cudaFree(dx);
    free(x);
    free(got);
    close_set();
}
END_TEST

/* y += alpha x: the same bits as the host (one product and one sum an element, no FMA). */
START_TEST(add_matches_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    open_set();
    int64_t n = rand_between(&rng, 1, 100000);
    float alpha = (float)(ifd_rng_uniform(&rng) * 4.0 - 2.0);
    float *x = randf(&rng, n, 3.0), *y = randf(&rng, n, 3.0), *got = malloc((size_t)n * 4);
    float *dx = dev_put(x, n * 4), *dy = dev_put(y, n * 4);
    g_ops->add(g_ops->ctx, n, alpha, dx, dy);
    sync_ok("add");
    dev_get(got, dy, n * 4);
    for (int64_t i = 0; i < n; i++) {
        volatile float p = alpha * x[i]; /* rounded, whatever the compiler's contraction */
        y[i] = y[i] + p;
    }
    bits_equal("add", got, y, n);
    cudaFree(dx);
    cudaFree(dy);
    free(x);
    free(y);
    free(got);
    close_set();
}
END_TEST

/* Batches of products with random transposes, alpha, beta and strides with gaps between the
 * matrices: each C_i against a double loop, and the gaps of C untouched. */
START_TEST(gemm_strided_batched_matches_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    open_set();
    for (int iter = 0; iter < 8; iter++) {
        int ta = (int)rand_between(&rng, 0, 1), tb = (int)rand_between(&rng, 0, 1);
        int64_t m = rand_between(&rng, 1, 40), n = rand_between(&rng, 1, 40);
        int64_t k = rand_between(&rng, 1, 64), batch = rand_between(&rng, 1, 7);
        int64_t sa = m * k + rand_between(&rng, 0, 9), sb = k * n + rand_between(&rng, 0, 9);
        int64_t sc = m * n + rand_between(&rng, 0, 9);
        float alpha = (float)(ifd_rng_uniform(&rng) * 2.0 - 1.0);
        float beta = iter % 2 ? 0.0f : (float)(ifd_rng_uniform(&rng) * 2.0 - 1.0);
        float *a = randf(&rng, sa * batch, 1.0), *b = randf(&rng, sb * batch, 1.0);
        float *c = randf(&rng, sc * batch, 1.0), *got = malloc((size_t)(sc * batch) * 4);
        float *da = dev_put(a, sa * batch * 4), *db = dev_put(b, sb * batch * 4);
        float *dc = dev_put(c, sc * batch * 4);
        g_ops->gemm_strided_batched(g_ops->ctx, ta, tb, m, n, k, alpha, da, sa, db, sb, beta, dc,
                                    sc, batch);
        sync_ok("gemm_strided_batched");
        dev_get(got, dc, sc * batch * 4);
        for (int64_t i = 0; i < batch; i++)
            for (int64_t r = 0; r < sc; r++) {
                int64_t row = r / n, col = r % n;
                double want = c[i * sc + r], mag = fabs(beta * want);
                if (row >= m) { /* a gap between two matrices: untouched */
                    RASSERT(memcmp(&got[i * sc + r], &c[i * sc + r], 4) == 0,
                            "C's gap after matrix %lld written: [%lld] %.9g, was %.9g",
                            (long long)i, (long long)r, (double)got[i * sc + r], want);
                    continue;
                }
                double s = 0.0, sabs = 0.0;
                for (int64_t p = 0; p < k; p++) {
                    double av = a[i * sa + (ta ? p * m + row : row * k + p)];
                    double bv = b[i * sb + (tb ? col * k + p : p * n + col)];
                    s += av * bv;
                    sabs += fabs(av * bv);
                }
                want = alpha * s + beta * want;
                mag = fabs(alpha) * sabs + mag;
                RASSERT(fabs(got[i * sc + r] - want) <= REL_TOL * mag + 1e-30,
                        "ta=%d tb=%d m=%lld n=%lld k=%lld batch=%lld strides %lld %lld %lld: "
                        "C_%lld[%lld] %.9g on cuda, %.9g expected",
                        ta, tb, (long long)m, (long long)n, (long long)k, (long long)batch,
                        (long long)sa, (long long)sb, (long long)sc, (long long)i, (long long)r,
                        (double)got[i * sc + r], want);
            }
        cudaFree(da);
        cudaFree(db);
        cudaFree(dc);
        free(a);
        free(b);
        free(c);
        free(got);
    }
    close_set();
}
END_TEST

/* gemm_bias (ABI 5): C = A B + bias, plus res (a separate array, or C itself), against a double
 * loop; C's start is res + bias, so an unused res or bias shows. */
START_TEST(gemm_bias_matches_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    open_set();
    for (int iter = 0; iter < 6; iter++) {
        int way = iter % 3; /* 0: no res, 1: res apart, 2: res is C */
        int64_t m = rand_between(&rng, 1, 300), n = rand_between(&rng, 1, 300);
        int64_t k = rand_between(&rng, 1, 200);
        float *a = randf(&rng, m * k, 1.0), *b = randf(&rng, k * n, 1.0);
        float *bias = randf(&rng, n, 1.0), *res = randf(&rng, m * n, 1.0);
        float *got = malloc((size_t)(m * n) * 4);
        float *da = dev_put(a, m * k * 4), *db = dev_put(b, k * n * 4),
              *dbias = dev_put(bias, n * 4);
        float *dres = dev_put(res, m * n * 4), *dc = way == 2 ? dres : dev_alloc(m * n * 4);
        g_ops->gemm_bias(g_ops->ctx, m, n, k, da, db, dbias, way ? dres : NULL, dc);
        sync_ok("gemm_bias");
        dev_get(got, dc, m * n * 4);
        for (int64_t r = 0; r < m * n; r++) {
            int64_t row = r / n, col = r % n;
            double s = (way ? (double)res[r] : 0.0) + bias[col];
            double mag = fabs(s);
            for (int64_t p = 0; p < k; p++) {
                s += (double)a[row * k + p] * b[p * n + col];
                mag += fabs((double)a[row * k + p] * b[p * n + col]);
            }
            RASSERT(fabs(got[r] - s) <= REL_TOL * mag + 1e-30,
                    "m=%lld n=%lld k=%lld res %d: C[%lld] %.9g on cuda, %.9g expected",
                    (long long)m, (long long)n, (long long)k, way, (long long)r, (double)got[r], s);
        }
        cudaFree(da);
        cudaFree(db);
        cudaFree(dbias);
        cudaFree(dres);
        if (way != 2)
            cudaFree(dc);
        free(a);
        free(b);
        free(bias);
        free(res);
        free(got);
    }
    close_set();
}
END_TEST

/* A dimension over INT_MAX: the product is refused (cuBLAS takes int), and the sync says so. */
START_TEST(gemm_strided_batched_refuses_huge)
{
    open_set();
    g_ops->gemm_strided_batched(g_ops->ctx, 0, 0, (int64_t)INT_MAX + 1, 1, 1, 1.0f, NULL, 0, NULL,
                                0, 0.0f, NULL, 0, 1);
    ifd_error err;
    ifd_error_clear(&err);
    ck_assert_int_eq(ifd_cuda_opset_sync(g_set, &err), IFD_EINVAL);
    ck_assert_msg(strstr(ifd_error_text(&err), "cublasSgemmStridedBatched") &&
                      strstr(ifd_error_text(&err), "INT_MAX"),
                  "%s", ifd_error_text(&err));
    sync_ok("the next sync"); /* the failure was reported once */
    close_set();
}
END_TEST

/* The lookup (a copy, so the same bits) and the scatter-add: the host's bits (the same additions
 * in the same order), twice the same; _i picks few ids (long runs of repeats, one row of dtable
 * taking them all when vocab is 1), many, or enough rows that the kernel's blocks stride. */
START_TEST(embedding_and_grad_match_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    open_set();
    int64_t rows, vocab, dim;
    if (_i == 0) {
        rows = rand_between(&rng, 1, 3000), vocab = rand_between(&rng, 1, 5);
        dim = rand_between(&rng, 1, 300);
    } else if (_i == 1) {
        rows = rand_between(&rng, 1, 3000), vocab = rand_between(&rng, 100, 5000);
        dim = rand_between(&rng, 1, 300);
    } else {
        rows = rand_between(&rng, 66000, 70000), vocab = rand_between(&rng, 2, 300);
        dim = rand_between(&rng, 1, 8);
    }
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    for (int64_t r = 0; r < rows; r++)
        ids[r] = (int32_t)ifd_rng_below(&rng, (uint64_t)vocab);
    float *table = randf(&rng, vocab * dim, 1.0), *dout = randf(&rng, rows * dim, 1.0);
    float *dtable = randf(&rng, vocab * dim, 1.0);
    float *out = malloc((size_t)(rows * dim) * 4), *want = malloc((size_t)(rows * dim) * 4);
    float *g1 = malloc((size_t)(vocab * dim) * 4), *g2 = malloc((size_t)(vocab * dim) * 4);
    int32_t *d_ids = dev_put(ids, rows * 4);
    float *d_table = dev_put(table, vocab * dim * 4), *d_out = dev_alloc(rows * dim * 4);
    float *d_dout = dev_put(dout, rows * dim * 4);
    float *d_dt1 = dev_put(dtable, vocab * dim * 4), *d_dt2 = dev_put(dtable, vocab * dim * 4);

    g_ops->embedding(g_ops->ctx, rows, dim, d_ids, d_table, d_out);
    g_ops->embedding_grad(g_ops->ctx, rows, dim, d_ids, d_dout, d_dt1);
    g_ops->embedding_grad(g_ops->ctx, rows, dim, d_ids, d_dout, d_dt2);
    sync_ok("embedding, embedding_grad");
    dev_get(out, d_out, rows * dim * 4);
    dev_get(g1, d_dt1, vocab * dim * 4);
    dev_get(g2, d_dt2, vocab * dim * 4);
    ifd_nn_embedding(rows, dim, ids, table, want);
    bits_equal("embedding", out, want, rows * dim);
    ifd_nn_embedding_grad(rows, dim, ids, dout, dtable);
    bits_equal("embedding_grad: two cuda runs", g1, g2, vocab * dim);
    bits_equal("embedding_grad against the host", g1, dtable, vocab * dim);

    cudaFree(d_ids);
    cudaFree(d_table);
    cudaFree(d_out);
    cudaFree(d_dout);
    cudaFree(d_dt1);
    cudaFree(d_dt2);
    free(ids);
    free(table);
    free(dout);
    free(dtable);
    free(out);
    free(want);
    free(g1);
    free(g2);
    close_set();
}
END_TEST

/* Forward (y, mean, rstd) and backward (dx written, dgamma and dbeta added to) against the host;
 * _i picks y = x and dx = dy (in place) or separate buffers; the backward twice the same bits. */
START_TEST(layernorm_matches_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    open_set();
    int in_place = _i % 2;
    int64_t rows = rand_between(&rng, 1, 256), dim = rand_between(&rng, 1, 300), n = rows * dim;
    float eps = (float)(1e-5 * rand_between(&rng, 1, 100));
    float *x = randf(&rng, n, 2.0), *g = randf(&rng, dim, 1.5), *b = randf(&rng, dim, 1.0);
    float *dy = randf(&rng, n, 1.0), *dg = randf(&rng, dim, 1.0), *db = randf(&rng, dim, 1.0);
    for (int64_t i = 0; i < n; i++) /* an offset, so that the mean matters */
        x[i] += 0.5f;
    float *y = malloc((size_t)n * 4), *mean = malloc((size_t)rows * 4);
    float *rstd = malloc((size_t)rows * 4), *dx = malloc((size_t)n * 4);
    float *got = malloc((size_t)n * 4), *got_m = malloc((size_t)rows * 4);
    float *got_r = malloc((size_t)rows * 4), *got_dg = malloc((size_t)dim * 4);
    float *got_db = malloc((size_t)dim * 4), *again = malloc((size_t)n * 4);

    float *d_x = dev_put(x, n * 4), *d_g = dev_put(g, dim * 4), *d_b = dev_put(b, dim * 4);
    float *d_y = in_place ? d_x : dev_put(x, n * 4);
    float *d_m = dev_put(x, rows * 4), *d_r = dev_put(x, rows * 4);
    g_ops->layernorm(g_ops->ctx, rows, dim, d_x, d_g, d_b, eps, d_y, d_m, d_r);
    sync_ok("layernorm");
    dev_get(got, d_y, n * 4);
    dev_get(got_m, d_m, rows * 4);
    dev_get(got_r, d_r, rows * 4);
    ifd_nn_layernorm(rows, dim, x, g, b, eps, y, mean, rstd);
    close_to_cpu("layernorm y", got, y, n);
    close_to_cpu("layernorm mean", got_m, mean, rows);
    close_to_cpu("layernorm rstd", got_r, rstd, rows);

    /* the backward from the host's x, mean and rstd, so that only the backward is compared */
    float *d_x2 = dev_put(x, n * 4), *d_m2 = dev_put(mean, rows * 4),
          *d_r2 = dev_put(rstd, rows * 4);
    for (int rep = 0; rep < 2; rep++) {
        float *d_dy = dev_put(dy, n * 4), *d_dx = in_place ? d_dy : dev_put(dx, n * 4);
        float *d_dg = dev_put(dg, dim * 4), *d_db = dev_put(db, dim * 4);
        g_ops->layernorm_grad(g_ops->ctx, rows, dim, d_x2, d_g, d_m2, d_r2, d_dy, d_dx, d_dg, d_db);
        sync_ok("layernorm_grad");
        if (rep == 0) {
            dev_get(got, d_dx, n * 4);
            dev_get(got_dg, d_dg, dim * 4);
            dev_get(got_db, d_db, dim * 4);
        } else {
            dev_get(again, d_dx, n * 4);
            bits_equal("layernorm_grad dx: two cuda runs", again, got, n);
            dev_get(again, d_dg, dim * 4);
            bits_equal("layernorm_grad dgamma: two cuda runs", again, got_dg, dim);
            dev_get(again, d_db, dim * 4);
            bits_equal("layernorm_grad dbeta: two cuda runs", again, got_db, dim);
        }
        if (!in_place)
            cudaFree(d_dx);
        cudaFree(d_dy);
        cudaFree(d_dg);
        cudaFree(d_db);
    }
    ifd_nn_layernorm_grad(rows, dim, x, g, mean, rstd, dy, dx, dg, db);
    close_to_cpu("layernorm_grad dx", got, dx, n);
    close_to_cpu("layernorm_grad dgamma", got_dg, dg, dim);
    close_to_cpu("layernorm_grad dbeta", got_db, db, dim);

    if (!in_place)
        cudaFree(d_y);
    float *frees[] = {d_x, d_g, d_b, d_m, d_r, d_x2, d_m2, d_r2};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; i++)
        cudaFree(frees[i]);
    float *hfrees[] = {x,    g,  b,   dy,    dg,    db,     y,      mean,
                       rstd, dx, got, got_m, got_r, got_dg, got_db, again};
    for (size_t i = 0; i < sizeof hfrees / sizeof *hfrees; i++)
        free(hfrees[i]);
    close_set();
}
END_TEST

/* GELU and its gradient against the host, in place (_i 1) or not. */
START_TEST(gelu_matches_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    open_set();
    int in_place = _i % 2;
    int64_t n = rand_between(&rng, 1, 100000);
    float *x = randf(&rng, n, 4.0), *dy = randf(&rng, n, 1.0), *y = malloc((size_t)n * 4);
    float *dx = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    float *d_x = dev_put(x, n * 4), *d_y = dev_put(x, n * 4); /* in place: gelu(d_y) into d_y */
    g_ops->gelu(g_ops->ctx, n, in_place ? d_y : d_x, d_y);
    sync_ok("gelu");
    dev_get(got, d_y, n * 4);
    ifd_nn_gelu(n, x, y);
    close_to_cpu("gelu", got, y, n);
    float *d_dy = dev_put(dy, n * 4), *d_dx = in_place ? d_dy : dev_put(dy, n * 4);
    g_ops->gelu_grad(g_ops->ctx, n, d_x, d_dy, d_dx);
    sync_ok("gelu_grad");
    dev_get(got, d_dx, n * 4);
    ifd_nn_gelu_grad(n, x, dy, dx);
    close_to_cpu("gelu_grad", got, dx, n);
    cudaFree(d_x);
    cudaFree(d_y);
    cudaFree(d_dy);
    if (!in_place)
        cudaFree(d_dx);
    free(x);
    free(dy);
    free(y);
    free(dx);
    free(got);
    close_set();
}
END_TEST

/* Causal attention forward (probs, out) and backward (dqkv) against the host. Even _i: no more
 * heads than sequences, odd: more (the two ways ops.c batches the products); t above and
 * below a warp's 32 lanes. probs is exactly 0 above the diagonal; the backward twice the same
 * bits. */
START_TEST(attention_matches_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    open_set();
    int64_t heads = rand_between(&rng, 1, 4), dh = rand_between(&rng, 1, 24);
    int64_t batch = _i % 2 ? rand_between(&rng, 1, heads) : rand_between(&rng, heads, 5);
    if (_i % 2 && batch == heads)
        heads++;
    int64_t t = rand_between(&rng, 1, _i < 2 ? 31 : 80), c = heads * dh;
    int64_t nq = batch * t * 3 * c, no = batch * t * c, np = batch * heads * t * t;
    float *qkv = randf(&rng, nq, 1.5), *dout = randf(&rng, no, 1.0);
    float *probs = malloc((size_t)np * 4), *out = malloc((size_t)no * 4);
    float *dqkv = malloc((size_t)nq * 4), *work = malloc((size_t)(t * t) * 4);
    float *got_p = malloc((size_t)np * 4), *got_o = malloc((size_t)no * 4);
    float *got_d = malloc((size_t)nq * 4), *again = malloc((size_t)nq * 4);
    float *d_qkv = dev_put(qkv, nq * 4), *d_dout = dev_put(dout, no * 4);
    float *d_p = dev_alloc(np * 4), *d_o = dev_alloc(no * 4), *d_dq = dev_alloc(nq * 4);
    float *d_w = dev_alloc(np * 4);
    CUDA_OK(cudaMemset(d_p, 0xff, (size_t)np * 4)); /* NaN: every element must be written */
    CUDA_OK(cudaMemset(d_dq, 0xff, (size_t)nq * 4));

    g_ops->attention(g_ops->ctx, batch, t, heads, dh, d_qkv, d_p, d_o);
    sync_ok("attention");
    dev_get(got_p, d_p, np * 4);
    dev_get(got_o, d_o, no * 4);
    ifd_nn_attention(batch, t, heads, dh, qkv, probs, out);
    char what[128];
    snprintf(what, sizeof what, "attention B=%lld T=%lld H=%lld dh=%lld probs", (long long)batch,
             (long long)t, (long long)heads, (long long)dh);
    close_to_cpu(what, got_p, probs, np);
    for (int64_t s = 0; s < batch * heads; s++)
        for (int64_t i = 0; i < t; i++)
            for (int64_t j = i + 1; j < t; j++)
                RASSERT(got_p[(s * t + i) * t + j] == 0.0f,
                        "%s: [%lld, %lld, %lld] is %g above the "
                        "diagonal",
                        what, (long long)s, (long long)i, (long long)j,
                        (double)got_p[(s * t + i) * t + j]);
    snprintf(what, sizeof what, "attention B=%lld T=%lld H=%lld dh=%lld out", (long long)batch,
             (long long)t, (long long)heads, (long long)dh);
    close_to_cpu(what, got_o, out, no);

    /* the backward from the host's probs */
    CUDA_OK(cudaMemcpy(d_p, probs, (size_t)np * 4, cudaMemcpyHostToDevice));
    for (int rep = 0; rep < 2; rep++) {
        g_ops->attention_grad(g_ops->ctx, batch, t, heads, dh, d_qkv, d_p, d_dout, d_dq, d_w);
        sync_ok("attention_grad");
        dev_get(rep ? again : got_d, d_dq, nq * 4);
    }
    bits_equal("attention_grad: two cuda runs", again, got_d, nq);
    ifd_nn_attention_grad(batch, t, heads, dh, qkv, probs, dout, dqkv, work);
    snprintf(what, sizeof what, "attention_grad B=%lld T=%lld H=%lld dh=%lld dqkv",
             (long long)batch, (long long)t, (long long)heads, (long long)dh);
    close_to_cpu(what, got_d, dqkv, nq);

    float *frees[] = {d_qkv, d_dout, d_p, d_o, d_dq, d_w};
    for (size_t i = 0; i < sizeof frees / sizeof *frees; i++)
        cudaFree(frees[i]);
    float *hfrees[] = {qkv, dout, probs, out, dqkv, work, got_p, got_o, got_d, again};
    for (size_t i = 0; i < sizeof hfrees / sizeof *hfrees; i++)
        free(hfrees[i]);
    close_set();
}
END_TEST

int main(void)
{
    char why[256];
    int gpus = gpu_probe(why, sizeof why);
    if (gpus == 0) {
        printf("test_cuda_nn_ops: no usable GPU (%s): skipped\n", why);
        return 77;
    }
    Suite *s = suite_create("cuda_nn_ops");
    TCase *tc = tu_tcase(s, "ops", 120);
    tcase_add_test(tc, fill_writes_its_range);
    tcase_add_test(tc, add_matches_host);
    tcase_add_test(tc, gemm_strided_batched_matches_host);
    tcase_add_test(tc, gemm_strided_batched_refuses_huge);
    tcase_add_test(tc, gemm_bias_matches_host);
    tcase_add_loop_test(tc, embedding_and_grad_match_host, 0, 3);
    tcase_add_loop_test(tc, layernorm_matches_host, 0, 4);
    tcase_add_loop_test(tc, gelu_matches_host, 0, 2);
    tcase_add_loop_test(tc, attention_matches_host, 0, 4);
    /* One process, unlike tu_run_suite's fork a test: CUDA initialises once, not 17 times (each
     * can take seconds on a GPU without persistence mode). A failed check still ends only its
     * own test; the test's device memory then leaks, which the failure makes moot. */
    return tu_run_suite_as(s, CK_NOFORK);
}
