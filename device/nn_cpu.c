/* The transformer's ops on the host (device/nn_cpu.h): ifd_cpu_gemm_small (libxsmm or OpenBLAS)
 * for the attention's products, plain loops for the rest, every sum in a fixed order. */
#include "device/nn_cpu.h"

#include "device/ops_gemm_cpu.h"

#include <math.h>
#include <string.h>

/* Inlined into the IFD_NN_WIDE callers (a helper left out of line is built for the baseline
 * ISA only). */
#if defined(__GNUC__)
#define NN_INLINE static inline __attribute__((always_inline))
#else
#define NN_INLINE static inline
#endif

/* l[q] += e[j] for j = q mod 16, in order, j < n (a multiple of 16). */
NN_INLINE void lanes16_add(float *l, const float *e, int64_t n)
{
    for (int64_t j = 0; j + 16 <= n; j += 16)
        for (int q = 0; q < 16; q++)
            l[q] += e[j + q];
}

/* The sum of 16 lanes in a fixed tree, in float (halves added lane by lane: vector adds), then in
 * double. */
NN_INLINE double lanes16_total(float *l)
{
    for (int q = 0; q < 8; q++)
        l[q] += l[q + 8];
    for (int q = 0; q < 4; q++)
        l[q] += l[q + 4];
    for (int q = 0; q < 2; q++)
        l[q] += l[q + 2];
    return (double)(l[0] + l[1]);
}

/*
 * sum_j a[j] (lane_sum), sum_j a[j] b[j] (lane_dot) and sum_j (a[j] - m)^2 (lane_sqdev) over
 * j < n: the first n - n mod 16 terms in 16 float lanes (j mod 16), the lanes then in a fixed
 * tree (lanes16_total), then the rest in order in double: a fixed order that vectorizes (one
 * chain of dependent adds was most of the softmax's and the layer norm's time; four double lanes
 * still ran two at a time). One plain loop each: GCC vectorizes these, not one loop with the
 * three cases in it.
 */
NN_INLINE double lane_sum(const float *a, int64_t n)
{
    float l[16] = {0.0f};
    int64_t full = n / 16 * 16;
    lanes16_add(l, a, full);
    double s = lanes16_total(l);
    for (int64_t j = full; j < n; j++)
        s += (double)a[j];
    return s;
}

NN_INLINE double lane_dot(const float *a, const float *b, int64_t n)
{
    float l[16] = {0.0f};
    int64_t full = n / 16 * 16;
    for (int64_t j = 0; j < full; j += 16)
        for (int q = 0; q < 16; q++)
            l[q] += a[j + q] * b[j + q];
    double s = lanes16_total(l);
    for (int64_t j = full; j < n; j++)
        s += (double)(a[j] * b[j]);
    return s;
}

NN_INLINE double lane_sqdev(const float *a, float m, int64_t n)
{
    float l[16] = {0.0f};
    int64_t full = n / 16 * 16;
    for (int64_t j = 0; j < full; j += 16)
        for (int q = 0; q < 16; q++)
            l[q] += (a[j + q] - m) * (a[j + q] - m);
    double s = lanes16_total(l);
    for (int64_t j = full; j < n; j++)
        s += (double)((a[j] - m) * (a[j] - m));
    return s;
}

IFD_NN_WIDE void ifd_nn_bias_add_rows(int64_t rows, int64_t dim, const float *bias, float *x)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < dim; j++)
            x[r * dim + j] += bias[j];
}

IFD_NN_WIDE void ifd_nn_bias_fill_rows(int64_t rows, int64_t dim, const float *bias,
                                       const float *res, float *y)
{
    if (res == NULL) {
        for (int64_t r = 0; r < rows; r++)
            memcpy(y + r * dim, bias, (size_t)dim * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < dim; j++)
            y[r * dim + j] = res[r * dim + j] + bias[j];
}

IFD_NN_WIDE void ifd_nn_axpy(int64_t n, float alpha, const float *x, float *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

void ifd_nn_embedding(int64_t rows, int64_t dim, const int32_t *ids, const float *table, float *out)
{
    for (int64_t r = 0; r < rows; r++)
        memcpy(out + r * dim, table + (int64_t)ids[r] * dim, (size_t)dim * sizeof(float));
}

void ifd_nn_embedding_grad_cols(int64_t rows, int64_t dim, int64_t c0, int64_t c1,
                                const int32_t *ids, const float *dout, float *dtable)
{
    for (int64_t r = 0; r < rows; r++) {
        float *d = dtable + (int64_t)ids[r] * dim;
        const float *g = dout + r * dim;
        for (int64_t c = c0; c < c1; c++)
            d[c] += g[c];
    }
}

void ifd_nn_embedding_grad(int64_t rows, int64_t dim, const int32_t *ids, const float *dout,
                           float *dtable)
{
    ifd_nn_embedding_grad_cols(rows, dim, 0, dim, ids, dout, dtable);
}

/* The layer norm's sums run in 16 float lanes, then a fixed tree (lane_sum, lane_sqdev). */
IFD_NN_WIDE void ifd_nn_layernorm(int64_t rows, int64_t dim, const float *x, const float *gamma,
                                  const float *beta, float eps, float *y, float *mean, float *rstd)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float m = (float)(lane_sum(xr, dim) / (double)dim);
        double v = lane_sqdev(xr, m, dim);
        float rs = (float)(1.0 / sqrt(v / (double)dim + (double)eps));
        float *yr = y + r * dim;
        for (int64_t c = 0; c < dim; c++)
            yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
        mean[r] = m;
        rstd[r] = rs;
    }
}

/*
 * Sums over the rows per column (the layer norm's parameter gradients, col_sum), a tile of up
 * to NN_COL_TILE columns at a time: the tile's sums in a local array (in L1, private to the
 * thread: a team's chunks never share a cache line of dgamma while they sum), the rows read in
 * order as contiguous runs of the tile's width, the inner loop over the columns vectorized. Each
 * column's sum runs over the rows in order from its first value, as the plain loop's: the same
 * bits. (Kept in memory, dgamma and dbeta were stored and reloaded on every row, and the team's
 * 16-column chunks shared cache lines: 8 % of a charlm step.)
 */
#define NN_COL_TILE 256

IFD_NN_WIDE void ifd_nn_layernorm_grad_params(int64_t rows, int64_t dim, int64_t c0, int64_t c1,
                                              const float *x, const float *mean, const float *rstd,
                                              const float *dy, float *dgamma, float *dbeta)
{
    float g[NN_COL_TILE], b[NN_COL_TILE];
    for (int64_t t0 = c0; t0 < c1; t0 += NN_COL_TILE) {
        int64_t w = c1 - t0 < NN_COL_TILE ? c1 - t0 : NN_COL_TILE;
        memcpy(g, dgamma + t0, (size_t)w * sizeof(float));
        memcpy(b, dbeta + t0, (size_t)w * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * dim + t0, *dyr = dy + r * dim + t0;
            float m = mean[r], rs = rstd[r];
            for (int64_t j = 0; j < w; j++) {
                float xhat = (xr[j] - m) * rs;
                g[j] += dyr[j] * xhat;
                b[j] += dyr[j];
            }
        }
        memcpy(dgamma + t0, g, (size_t)w * sizeof(float));
        memcpy(dbeta + t0, b, (size_t)w * sizeof(float));
    }
}

IFD_NN_WIDE void ifd_nn_col_sum(int64_t rows, int64_t dim, int64_t c0, int64_t c1, const float *x,
                                float *out)
{
    float acc[NN_COL_TILE];
    for (int64_t t0 = c0; t0 < c1; t0 += NN_COL_TILE) {
        int64_t w = c1 - t0 < NN_COL_TILE ? c1 - t0 : NN_COL_TILE;
        for (int64_t j = 0; j < w; j++)
            acc[j] = 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * dim + t0;
            for (int64_t j = 0; j < w; j++)
                acc[j] += xr[j];
        }
        memcpy(out + t0, acc, (size_t)w * sizeof(float));
    }
}

IFD_NN_WIDE void ifd_nn_layernorm_grad_input(int64_t r0, int64_t r1, int64_t dim, const float *x,
                                             const float *gamma, const float *mean,
                                             const float *rstd, const float *dy, float *dx)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        float m = mean[r], rs = rstd[r];
        /* of dxhat and of dxhat * xhat over the row, in 16 float lanes, then lanes16_total */
        float lg[16] = {0.0f}, lgx[16] = {0.0f};
        int64_t c = 0, full = dim / 16 * 16;
        for (; c < full; c += 16) /* two loops of one sum each: both vectorize */
            for (int k = 0; k < 16; k++)
                lg[k] += dyr[c + k] * gamma[c + k];
        for (c = 0; c < full; c += 16)
            for (int k = 0; k < 16; k++)
                lgx[k] += dyr[c + k] * gamma[c + k] * ((xr[c + k] - m) * rs);
        double sum_g = lanes16_total(lg), sum_gx = lanes16_total(lgx);
        for (; c < dim; c++) {
            float g = dyr[c] * gamma[c];
            sum_g += (double)g;
            sum_gx += (double)(g * ((xr[c] - m) * rs));
        }
        float mg = (float)(sum_g / (double)dim), mgx = (float)(sum_gx / (double)dim);
        float *dxr = dx + r * dim;
        for (c = 0; c < dim; c++) {
            float xhat = (xr[c] - m) * rs;
            dxr[c] = rs * (dyr[c] * gamma[c] - mg - xhat * mgx);
        }
    }
}

void ifd_nn_layernorm_grad(int64_t rows, int64_t dim, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta)
{
    /* the parameters' gradients first: dx may be dy */
    ifd_nn_layernorm_grad_params(rows, dim, 0, dim, x, mean, rstd, dy, dgamma, dbeta);
    ifd_nn_layernorm_grad_input(0, rows, dim, x, gamma, mean, rstd, dy, dx);
}

#define IFD_SQRT1_2 0.70710678118654752440f
#define IFD_1_SQRT2PI 0.39894228040143267794f

/*
 * erf and exp for GELU (gelu_erf, gelu_exp_neg below) and exp for the softmaxes (nn_exp_neg),
 * written out so that the compiler vectorizes the loops (libm's erff and expf are calls it
 * cannot vectorize; with them GELU and its gradient took 16 % of a charlm step). erf: the
 * rational approximation of Eigen and XLA (odd degree 13 over even degree 8, x clamped to
 * [-4, 4], where erf is +-1 in float), within 4.5e-7 of erf. exp(t), t <= 0: 2^n e^r with r in
 * [-ln2/2, ln2/2] (round-to-nearest by the 1.5 * 2^23 trick: no libm call), Cephes' degree-6
 * polynomial for e^r, 0 below -87. This file is built with -fno-trapping-math (CMakeLists.txt),
 * which lets the clamps be vector selects; the results are the same bits either way.
 */
/* 2^n for an integral n in [-126, 127]: exp's scale, written into a float's exponent bits. */
NN_INLINE float pow2i(float n)
{
    union {
        uint32_t u;
        float f;
    } s;
    s.u = (uint32_t)((int32_t)n + 127) << 23;
    return s.f;
}

static inline float nn_exp_neg(float t)
{
    t = t < -87.0f ? -87.0f : t;
    float n = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = t - n * 0.693145751953125f;
    r = r - n * 1.42860682030941723212e-6f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * pow2i(n);
}

/*
 * GELU's erf and exp, the polynomials above evaluated by fmaf (Horner steps, and exp's range
 * reduction): one instruction a step where the CPU has FMA (ifd_nn_gelu), 25 % less time
 * than a multiply and an add (GELU and its gradient were 5.7 % of a charlm32 step), and one
 * rounding a step, the same on every machine. The cross-entropy and the softmax keep
 * nn_exp_neg (their bits unchanged).
 */
NN_INLINE float gelu_erf(float x)
{
    x = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
    float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = fmaf(p, x2, 2.77068142495902e-08f);
    p = fmaf(p, x2, -2.10102402082508e-06f);
    p = fmaf(p, x2, -5.69250639462346e-05f);
    p = fmaf(p, x2, -7.34990630326855e-04f);
    p = fmaf(p, x2, -2.95459980854025e-03f);
    p = fmaf(p, x2, -1.60960333262415e-02f);
    float q = -1.45660718464996e-05f;
    q = fmaf(q, x2, -2.13374055278905e-04f);
    q = fmaf(q, x2, -1.68282697438203e-03f);
    q = fmaf(q, x2, -7.37332916720468e-03f);
    q = fmaf(q, x2, -1.42647390514189e-02f);
    return x * p / q;
}

NN_INLINE float gelu_exp_neg(float t)
{
    t = t < -87.0f ? -87.0f : t;
    float n = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = fmaf(-n, 0.693145751953125f, t);
    r = fmaf(-n, 1.42860682030941723212e-6f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r + 1.0f);
    return p * pow2i(n);
}

NN_INLINE void gelu_loop(int64_t n, const float *x, float *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = 0.5f * x[i] * (1.0f + gelu_erf(x[i] * IFD_SQRT1_2));
}

NN_INLINE void gelu_grad_loop(int64_t n, const float *x, const float *dy, float *dx)
{
    for (int64_t i = 0; i < n; i++) {
        float cdf = 0.5f * (1.0f + gelu_erf(x[i] * IFD_SQRT1_2));
        float pdf = IFD_1_SQRT2PI * gelu_exp_neg(-0.5f * x[i] * x[i]);
        dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
}

/* The FMA builds of the two loops and the CPU's choice among them, made at each call
 * (__builtin_cpu_supports reads a word): not by a target_clones resolver, which the sanitizers'
 * runtime does not allow (IFD_NN_WIDE), so their builds run FMA lanes too. */
#if defined(__x86_64__) && defined(__GNUC__) && (!defined(__clang__) || __clang_major__ >= 14)
#define NN_GELU_FMA 1
__attribute__((target("avx512f,fma"))) static void gelu_512(int64_t n, const float *x, float *y)
{
    gelu_loop(n, x, y);
}

__attribute__((target("avx2,fma"))) static void gelu_256(int64_t n, const float *x, float *y)
{
    gelu_loop(n, x, y);
}

__attribute__((target("avx512f,fma"))) static void gelu_grad_512(int64_t n, const float *x,
                                                                 const float *dy, float *dx)
{
    gelu_grad_loop(n, x, dy, dx);
}

__attribute__((target("avx2,fma"))) static void gelu_grad_256(int64_t n, const float *x,
                                                              const float *dy, float *dx)
{
    gelu_grad_loop(n, x, dy, dx);
}

/* 2: AVX-512 with FMA, 1: AVX2 with FMA, 0: neither */
static int gelu_lanes(void)
{
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"))
        return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

void ifd_nn_gelu(int64_t n, const float *x, float *y)
{
#ifdef NN_GELU_FMA
    int lanes = gelu_lanes();
    if (lanes == 2) {
        gelu_512(n, x, y);
        return;
    }
    if (lanes == 1) {
        gelu_256(n, x, y);
        return;
    }
#endif
    gelu_loop(n, x, y);
}

void ifd_nn_gelu_grad(int64_t n, const float *x, const float *dy, float *dx)
{
#ifdef NN_GELU_FMA
    int lanes = gelu_lanes();
    if (lanes == 2) {
        gelu_grad_512(n, x, dy, dx);
        return;
    }
    if (lanes == 1) {
        gelu_grad_256(n, x, dy, dx);
        return;
    }
#endif
    gelu_grad_loop(n, x, dy, dx);
}

void ifd_nn_gelu_baseline(int64_t n, const float *x, float *y)
{
    gelu_loop(n, x, y);
}

void ifd_nn_gelu_grad_baseline(int64_t n, const float *x, const float *dy, float *dx)
{
    gelu_grad_loop(n, x, dy, dx);
}

static void gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    ifd_cpu_gemm_small(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* rows x cols of x (rows ld apart) times s. */
static void scale_rows(int64_t rows, int64_t cols, float s, float *x, int64_t ld)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            x[i * ld + j] *= s;
}

/* C = op(A) M^T for one head's block, M (m_rows x dh, ld apart) given as mt = M^T [dh, t] when
 * the thread's scratch held it (a plain product: a transposed B would be a slower kernel, or
 * none in libxsmm), else as M itself. */
static void gemm_bt(int64_t r, int64_t cols, int64_t dh, const float *a, int64_t lda,
                    const float *m, int64_t ld, const float *mt, int64_t t, float *c, int64_t ldc)
{
    if (mt)
        gemm(0, 0, r, cols, dh, 1.0f, a, lda, mt, t, 0.0f, c, ldc);
    else
        gemm(0, 1, r, cols, dh, 1.0f, a, lda, m, ld, 0.0f, c, ldc);
}

/* M^T of one head's [t, dh] block (rows ld apart) in the thread's scratch; NULL without it. */
static const float *head_transposed(int64_t t, int64_t dh, const float *m, int64_t ld)
{
    float *mt = ifd_cpu_scratch((size_t)(t * dh));
    if (mt)
        ifd_cpu_transpose(t, dh, m, ld, mt);
    return mt;
}

/* The largest of s[0..n), n >= 1, in 16 lanes (j mod 16) then across them: the same value as
 * one pass in order for any floats but NaN (one chain of dependent compares was half of the
 * softmax's time). */
static inline float row_max(const float *s, int64_t n)
{
    float l[16];
    for (int k = 0; k < 16; k++)
        l[k] = s[0];
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int k = 0; k < 16; k++)
            l[k] = s[j + k] > l[k] ? s[j + k] : l[k];
    float mx = l[0];
    for (int k = 1; k < 16; k++)
        mx = l[k] > mx ? l[k] : mx;
    for (; j < n; j++)
        mx = s[j] > mx ? s[j] : mx;
    return mx;
}

/* The first index of the largest of s[0..n) (n >= 1), *mx its value: the max in lanes, then
 * the first index that holds it: the serial loop's answer (index 0 when s[0] is NaN, whose
 * compares are false). */
static inline int64_t row_argmax(const float *s, int64_t n, float *mx)
{
    float m = row_max(s, n);
    *mx = m;
    if (m != m)
        return 0;
    int64_t j = 0;
    while (j < n - 1 && s[j] != m)
        j++;
    return j;
}

/* e[j] = exp(z[j] - mx), j < n (z[j] <= mx). */
NN_INLINE void exp_shifted(const float *z, int64_t n, float mx, float *e)
{
    for (int64_t j = 0; j < n; j++)
        e[j] = nn_exp_neg(z[j] - mx);
}

/* sum_j exp(z[j] - mx), j < k: the first k - k mod 16 in 16 float lanes (j mod 16), the lanes
 * then in a fixed tree (lanes16_total), then the rest in order; e (unless NULL) gets each exp.
 * Without e the exps go through a local block of 256 (16 lanes' multiple): the same sums. */
NN_INLINE double exp_sum(const float *z, int64_t k, float mx, float *e)
{
    float l[16] = {0.0f}, buf[256];
    int64_t full = k / 16 * 16;
    if (e) {
        exp_shifted(z, k, mx, e);
        lanes16_add(l, e, full);
    } else {
        for (int64_t c0 = 0; c0 < full; c0 += 256) {
            int64_t w = full - c0 < 256 ? full - c0 : 256;
            exp_shifted(z + c0, w, mx, buf);
            lanes16_add(l, buf, w);
        }
    }
    double s = lanes16_total(l);
    for (int64_t j = full; j < k; j++)
        s += (double)(e ? e[j] : nn_exp_neg(z[j] - mx));
    return s;
}

IFD_NN_WIDE double ifd_nn_softmax_xent_rows(int64_t r0, int64_t r1, int64_t k, const float *logits,
                                            const int32_t *labels, float gscale, float *dlogits,
                                            int64_t *correct, int32_t *cls, float *conf)
{
    double loss = 0.0;
    int64_t right = 0;
    for (int64_t r = r0; r < r1; r++) {
        const float *z = logits + r * k;
        float mx;
        int64_t arg = row_argmax(z, k, &mx);
        float *d = labels ? dlogits + r * k : NULL;
        float sum = (float)(d ? exp_sum(z, k, mx, d) : exp_sum(z, k, mx, NULL));
        float inv = 1.0f / sum;
        if (labels) {
            int32_t y = labels[r];
            float ey = d[y];
            for (int64_t j = 0; j < k; j++)
                d[j] = gscale * (d[j] * inv);
            d[y] = gscale * (ey * inv - 1.0f);
            loss += (double)(mx + logf(sum) - z[y]);
            right += arg == y;
        }
        if (cls)
            cls[r] = (int32_t)arg;
        if (conf)
            conf[r] = inv;
    }
    if (correct)
        *correct += right;
    return loss;
}

/* Row i of the scores: the softmax of scale s[0..i], zero after up to t; exp(s - max) by
 * nn_exp_neg (the loop vectorizes; libm's expf is a call a element). */
static inline void causal_softmax_row(float *s, int64_t i, int64_t t, float scale)
{
    for (int64_t j = 0; j <= i; j++)
        s[j] *= scale;
    float mx = row_max(s, i + 1);
    for (int64_t j = 0; j <= i; j++)
        s[j] = nn_exp_neg(s[j] - mx);
    float inv = (float)(1.0 / lane_sum(s, i + 1));
    for (int64_t j = 0; j <= i; j++)
        s[j] *= inv;
    for (int64_t j = i + 1; j < t; j++)
        s[j] = 0.0f;
}

/*
 * The causal products run in blocks of NN_ATT_BLOCK rows (or columns): row block [i0, i0 + r)
 * of the scores has nothing but zeros after column i0 + r, so each product is taken over the
 * block's own columns [0, i0 + r) only. At t = 128 that is 10/16 of the square's multiply-adds
 * (the upper triangle was computed and then zeroed). The sums over k are the square's without
 * its zero terms.
 */
#define NN_ATT_BLOCK 32

IFD_NN_WIDE void ifd_nn_attention_head(int64_t t, int64_t heads, int64_t dh, int64_t b, int64_t h,
                                       const float *qkv, float *probs, float *out)
{
    int64_t c = heads * dh, ld = 3 * c;
    float scale = 1.0f / sqrtf((float)dh);
    const float *q = qkv + b * t * ld + h * dh, *k = q + c, *v = q + 2 * c;
    float *p = probs + (b * heads + h) * t * t, *o = out + b * t * c + h * dh;
    const float *kt = head_transposed(t, dh, k, ld);
    for (int64_t i0 = 0; i0 < t; i0 += NN_ATT_BLOCK) {
        int64_t r = t - i0 < NN_ATT_BLOCK ? t - i0 : NN_ATT_BLOCK, cols = i0 + r;
        gemm_bt(r, cols, dh, q + i0 * ld, ld, k, ld, kt, t, p + i0 * t, t);
        for (int64_t i = i0; i < cols; i++)
            causal_softmax_row(p + i * t, i, t, scale);
        gemm(0, 0, r, dh, cols, 1.0f, p + i0 * t, t, v, ld, 0.0f, o + i0 * c, c);
    }
}

void ifd_nn_attention(int64_t batch, int64_t t, int64_t heads, int64_t dh, const float *qkv,
                      float *probs, float *out)
{
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            ifd_nn_attention_head(t, heads, dh, b, h, qkv, probs, out);
}

IFD_NN_WIDE void ifd_nn_attention_grad_head(int64_t t, int64_t heads, int64_t dh, int64_t b,
                                            int64_t h, const float *qkv, const float *probs,
                                            const float *dout, float *dqkv, float *work)
{
    int64_t c = heads * dh, ld = 3 * c;
    float scale = 1.0f / sqrtf((float)dh);
    const float *q = qkv + b * t * ld + h * dh, *k = q + c, *v = q + 2 * c;
    const float *p = probs + (b * heads + h) * t * t;
    const float *dout_h = dout + b * t * c + h * dh;
    float *dq = dqkv + b * t * ld + h * dh, *dk = dq + c, *dv = dq + 2 * c;
    /* row blocks: dP = dO V^T and dS = P (dP - rowsum(P dP)) on the block's columns (zero after
     * the diagonal up to the block's end), then dQ = s dS K */
    const float *vt = head_transposed(t, dh, v, ld);
    for (int64_t i0 = 0; i0 < t; i0 += NN_ATT_BLOCK) {
        int64_t r = t - i0 < NN_ATT_BLOCK ? t - i0 : NN_ATT_BLOCK, cols = i0 + r;
        gemm_bt(r, cols, dh, dout_h + i0 * c, c, v, ld, vt, t, work + i0 * t, t);
        for (int64_t i = i0; i < cols; i++) {
            const float *pr = p + i * t;
            float *dr = work + i * t;
            double dot = lane_dot(pr, dr, i + 1);
            for (int64_t j = 0; j <= i; j++)
                dr[j] = pr[j] * (dr[j] - (float)dot);
            for (int64_t j = i + 1; j < cols; j++)
                dr[j] = 0.0f;
        }
        gemm(0, 0, r, dh, cols, 1.0f, work + i0 * t, t, k, ld, 0.0f, dq + i0 * ld, ld);
        scale_rows(r, dh, scale, dq + i0 * ld, ld);
    }
    /* column blocks: rows [j0, t) alone reach columns [j0, j0 + r): dV = P^T dO, dK = s dS^T Q */
    for (int64_t j0 = 0; j0 < t; j0 += NN_ATT_BLOCK) {
        int64_t r = t - j0 < NN_ATT_BLOCK ? t - j0 : NN_ATT_BLOCK;
        gemm(1, 0, r, dh, t - j0, 1.0f, p + j0 * t + j0, t, dout_h + j0 * c, c, 0.0f, dv + j0 * ld,
             ld);
        gemm(1, 0, r, dh, t - j0, 1.0f, work + j0 * t + j0, t, q + j0 * ld, ld, 0.0f, dk + j0 * ld,
             ld);
        scale_rows(r, dh, scale, dk + j0 * ld, ld);
    }
}

void ifd_nn_attention_grad(int64_t batch, int64_t t, int64_t heads, int64_t dh, const float *qkv,
                           const float *probs, const float *dout, float *dqkv, float *work)
{
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            ifd_nn_attention_grad_head(t, heads, dh, b, h, qkv, probs, dout, dqkv, work);
}
