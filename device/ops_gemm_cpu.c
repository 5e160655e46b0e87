/* The op set's products on the host (CBLAS): gemm shared with the replica's team by blocks of C
 * or pieces of k, and gemm_bias, a dense layer's product with its bias and residual. */
#include "device/ops_gemm_cpu.h"

#include "device/cpu/team.h"
#include "device/nn_cpu.h"
#include "device/step.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

#ifdef IFD_HAVE_LIBXSMM
#include <libxsmm.h>

static pthread_once_t xsmm_once = PTHREAD_ONCE_INIT;

static char xsmm_name[64];

static void xsmm_init(void)
{
    libxsmm_init();
    snprintf(xsmm_name, sizeof xsmm_name, "libxsmm %s (%s kernels)", LIBXSMM_VERSION,
             libxsmm_get_target_arch());
}

/*
 * The thread's last kernels, by their descriptor: libxsmm's registry lookup (a hash of the whole
 * descriptor, then its table) took 1.85 % of an attention driver's samples (0.6 % with this
 * cache): the attention asks for the same few shapes thousands of times a step. Direct-mapped,
 * XSMM_CACHE entries; a kernel is never freed before libxsmm_finalize, so a cached pointer stays
 * good. A miss (or a shape libxsmm has no kernel for) asks the registry, as before.
 */
#define XSMM_CACHE 32

typedef struct xsmm_key {
    int64_t m, n, k, lda, ldb, ldc;
    int ta;
    float beta;
} xsmm_key;

typedef struct xsmm_entry {
    xsmm_key key;
    libxsmm_smmfunction f;
} xsmm_entry;

static _Thread_local xsmm_entry xsmm_cache[XSMM_CACHE];

static int xsmm_key_eq(const xsmm_key *a, const xsmm_key *b)
{
    return a->m == b->m && a->n == b->n && a->k == b->k && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldc == b->ldc && a->ta == b->ta && a->beta == b->beta;
}

static libxsmm_smmfunction xsmm_kernel(const xsmm_key *key)
{
    uint64_t h = (uint64_t)key->m * 0x9E3779B97F4A7C15u ^ (uint64_t)key->n * 0xC2B2AE3D27D4EB4Fu ^
                 (uint64_t)key->k * 0x165667B19E3779F9u ^ (uint64_t)key->lda * 31u ^
                 (uint64_t)key->ldb * 17u ^ (uint64_t)key->ldc * 7u ^ (uint64_t)key->ta ^
                 (key->beta != 0.0f ? 2u : 0u);
    xsmm_entry *e = &xsmm_cache[(h ^ (h >> 29)) % XSMM_CACHE];
    if (e->f != NULL && xsmm_key_eq(&e->key, key))
        return e->f;
    libxsmm_blasint xlda = (libxsmm_blasint)key->ldb, xldb = (libxsmm_blasint)key->lda,
                    xldc = (libxsmm_blasint)key->ldc;
    int flags = key->ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0;
    float one = 1.0f, beta = key->beta;
    libxsmm_smmfunction f = libxsmm_smmdispatch((libxsmm_blasint)key->n, (libxsmm_blasint)key->m,
                                                (libxsmm_blasint)key->k, &xlda, &xldb, &xldc, &one,
                                                &beta, &flags, NULL);
    if (f != NULL)
        *e = (xsmm_entry){*key, f};
    return f;
}

/*
 * A small product by a libxsmm JIT kernel (its registry: one per shape, generated at the first
 * call, then looked up, through the thread's cache above); 0 where libxsmm has none (alpha not
 * 1, beta not 0 or 1, B transposed).
 * libxsmm is column-major, so row-major C = op(A) B is column-major C^T = B^T op(A)^T: B is
 * libxsmm's A and A its B, a transposed A its transposed B (a kernel flag). A transposed B would
 * be libxsmm's transposed A, which 1.17 does not generate. Each element of C is one chain of
 * multiply-adds over k in order.
 */
static int xsmm_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (tb || alpha != 1.0f || (beta != 0.0f && beta != 1.0f) || m < 1 || n < 1 || k < 1 ||
        m > IFD_GEMM_SMALL_MAX || n > IFD_GEMM_SMALL_MAX || k > IFD_GEMM_SMALL_MAX)
        return 0;
    (void)pthread_once(&xsmm_once, xsmm_init);
    xsmm_key key = {m, n, k, lda, ldb, ldc, ta != 0, beta};
    libxsmm_smmfunction f = xsmm_kernel(&key);
    if (f == NULL)
        return 0;
    f(b, a, c);
    return 1;
}
#endif

const char *ifd_cpu_gemm_small_library(void)
{
#ifdef IFD_HAVE_LIBXSMM
    (void)pthread_once(&xsmm_once, xsmm_init);
    return xsmm_name;
#else
    return "OpenBLAS";
#endif
}

void ifd_cpu_transpose(int64_t rows, int64_t cols, const float *src, int64_t ld, float *dst)
{
#ifdef IFD_HAVE_LIBXSMM
    if (rows >= 1 && cols >= 1 && rows <= IFD_GEMM_SMALL_MAX && cols <= IFD_GEMM_SMALL_MAX) {
        /* column-major: src is cols x rows (ld), dst rows x cols */
        (void)pthread_once(&xsmm_once, xsmm_init);
        libxsmm_otrans(dst, src, sizeof(float), (libxsmm_blasint)cols, (libxsmm_blasint)rows,
                       (libxsmm_blasint)ld, (libxsmm_blasint)rows);
        return;
    }
#endif
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[j * rows + i] = src[i * ld + j];
}

void ifd_cpu_gemm_small(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc)
{
#ifdef IFD_HAVE_LIBXSMM
    if (xsmm_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
        return;
#endif
    sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* One product shared by a replica's team: C's rows (or columns) in blocks, one block a chunk,
 * each an sgemm of its own on one thread; the last block takes the rest. */
typedef struct gemm_split {
    int ta, tb, by_rows;
    int64_t m, n, k, block, blocks;
    float alpha, beta;
    const float *a, *b;
    float *c;
    const float *bias, *res; /* gemm_bias (by rows): each block starts its rows as res + bias */
} gemm_split;

static void gemm_block(void *arg, int64_t i)
{
    const gemm_split *g = arg;
    int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    int64_t lo = i * g->block, dim = g->by_rows ? g->m : g->n;
    int64_t len = i == g->blocks - 1 ? dim - lo : g->block;
    if (g->bias)
        ifd_nn_bias_fill_rows(len, g->n, g->bias, g->res ? g->res + lo * g->n : NULL,
                              g->c + lo * g->n);
    if (g->by_rows) /* rows lo.. of op(A): A's rows, or its columns when transposed */
        sgemm(g->ta, g->tb, len, g->n, g->k, g->alpha, g->a + (g->ta ? lo : lo * lda), lda, g->b,
              ldb, g->beta, g->c + lo * g->n, g->n);
    else /* columns lo.. of op(B) */
        sgemm(g->ta, g->tb, g->m, len, g->k, g->alpha, g->a, lda, g->b + (g->tb ? lo * ldb : lo),
              ldb, g->beta, g->c + lo, g->n);
}

/* One dense product on the caller's thread. */
void ifd_cpu_gemm_one(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      const float *b, float beta, float *c)
{
    if (n == 1) {
        /* A matrix-vector product (one output column): sgemv reads A once where sgemm would
         * first pack a copy of it. B, [k,1] or [1,k], is contiguous either way. */
        if (ta)
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)k, (int)m, alpha, a, (int)m, b, 1, beta, c,
                        1);
        else
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)m, (int)k, alpha, a, (int)k, b, 1, beta,
                        c, 1);
        return;
    }
    sgemm(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

/*
 * A product with a long inner dimension and a small output (a weight's gradient x^T dy over
 * the batch's rows: 128 x 384 summed over 4096 rows) is split along k instead, in
 * GEMM_K_CHUNK-long pieces whose count and bounds depend on the shape alone: split by C's
 * columns, each block would pack all of the long operand again. Piece 0 goes to C with the
 * call's beta, piece i > 0 to scratch i - 1, and C then adds the pieces in order, so the bits
 * are the same on one thread as on any team. The scratch is the calling thread's, kept between
 * calls (freed when the thread ends).
 */
#define GEMM_K_CHUNK 1024
#define GEMM_K_SPLIT_MAX 64
/* The most floats of scratch a split takes (16 MiB): fewer pieces for a larger C. */
#define GEMM_K_SCRATCH_FLOATS (1 << 22)

typedef struct gemm_ksplit {
    int ta, tb;
    int64_t m, n, k, pieces;
    float alpha, beta;
    const float *a, *b;
    float *c, *scratch;
} gemm_ksplit;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

typedef struct gemm_scratch {
    float *data;
    size_t floats;
} gemm_scratch;

static void scratch_free(void *p)
{
    gemm_scratch *s = p;
    free(s->data);
    free(s);
}

static void scratch_key_make(void)
{
    (void)pthread_key_create(&scratch_key, scratch_free);
}

/* The calling thread's scratch of at least floats floats; NULL when out of memory. */
float *ifd_cpu_scratch(size_t floats)
{
    (void)pthread_once(&scratch_once, scratch_key_make);
    gemm_scratch *s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = calloc(1, sizeof *s);
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->floats < floats) {
        float *d = malloc(floats * sizeof(float));
        if (d == NULL)
            return NULL;
        free(s->data);
        s->data = d;
        s->floats = floats;
    }
    return s->data;
}

/* The pieces of k the product splits into (1: none): k at least two pieces and four times C's
 * longer side, at most GEMM_K_SPLIT_MAX pieces and GEMM_K_SCRATCH_FLOATS of scratch. */
static int64_t gemm_k_pieces(int64_t m, int64_t n, int64_t k)
{
    int64_t side = m > n ? m : n;
    if (k < 2 * GEMM_K_CHUNK || k < 4 * side)
        return 1;
    int64_t pieces = k / GEMM_K_CHUNK, most = GEMM_K_SCRATCH_FLOATS / (m * n) + 1;
    pieces = pieces > GEMM_K_SPLIT_MAX ? GEMM_K_SPLIT_MAX : pieces;
    return pieces > most ? most : pieces;
}

static void gemm_kpiece(void *arg, int64_t i)
{
    const gemm_ksplit *g = arg;
    int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    int64_t per = g->k / g->pieces, lo = i * per, len = i == g->pieces - 1 ? g->k - lo : per;
    /* columns lo.. of op(A), rows lo.. of op(B) */
    const float *a = g->a + (g->ta ? lo * lda : lo), *b = g->b + (g->tb ? lo : lo * ldb);
    float *c = i == 0 ? g->c : g->scratch + (i - 1) * g->m * g->n;
    sgemm(g->ta, g->tb, g->m, g->n, len, g->alpha, a, lda, b, ldb, i == 0 ? g->beta : 0.0f, c,
          g->n);
}

/* C's pieces along k (gemm_k_pieces of them), on the team; 0 when the scratch is not there. */
static int gemm_by_k(ifd_team *team, int ta, int tb, int64_t m, int64_t n, int64_t k,
                     int64_t pieces, float alpha, const float *a, const float *b, float beta,
                     float *c)
{
    float *scratch = ifd_cpu_scratch((size_t)((pieces - 1) * m * n));
    if (scratch == NULL)
        return 0;
    gemm_ksplit g = {.ta = ta,
                     .tb = tb,
                     .m = m,
                     .n = n,
                     .k = k,
                     .pieces = pieces,
                     .alpha = alpha,
                     .beta = beta,
                     .a = a,
                     .b = b,
                     .c = c,
                     .scratch = scratch};
    ifd_team_run(team, pieces, gemm_kpiece, &g);
    int64_t mn = m * n;
    for (int64_t i = 1; i < pieces; i++) {
        const float *s = scratch + (i - 1) * mn;
        for (int64_t j = 0; j < mn; j++)
            c[j] += s[j];
    }
    return 1;
}

/*
 * Products of at least IFD_TEAM_GEMM_MACS multiply-adds are split over the replica's team (ctx,
 * device/cpu/team.h; NULL: none) along C's longer side, so that each block re-packs the smaller
 * operand: rows when m >= n (each block packs all of op(B)), else columns. Blocks are multiples
 * of 16 rows or columns (the width of the AVX-512 kernels), about IFD_TEAM_GEMM_BLOCKS per
 * thread, so that a thread slowed by something else on its core takes fewer. The blocks depend
 * on the shape and the team's size only, so a run is repeatable; a block's bits can differ from
 * one sgemm's over the whole product in the last place, where OpenBLAS picks another kernel
 * for the smaller shape (its small-matrix kernels sum over k in another order).
 * gemm_team_split fills g's blocks and says whether the product is shared.
 */
static int gemm_team_split(ifd_team *team, gemm_split *g)
{
    int threads = ifd_team_threads(team);
    int64_t dim = g->by_rows ? g->m : g->n;
    if (threads <= 1 || (double)g->m * (double)g->n * (double)g->k < IFD_TEAM_GEMM_MACS || dim < 32)
        return 0;
    int64_t blocks = (int64_t)threads * IFD_TEAM_GEMM_BLOCKS;
    g->block = ((dim + blocks - 1) / blocks + 15) / 16 * 16;
    g->blocks = dim / g->block;
    return 1;
}

void ifd_cpu_gemm(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, const float *b, float beta, float *c)
{
    ifd_team *team = ctx;
    if (n == 1) {
        ifd_cpu_gemm_one(ta, tb, m, n, k, alpha, a, b, beta, c);
        return;
    }
    int64_t pieces = gemm_k_pieces(m, n, k);
    if (pieces > 1 && gemm_by_k(team, ta, tb, m, n, k, pieces, alpha, a, b, beta, c))
        return;
    gemm_split g = {.ta = ta,
                    .tb = tb,
                    .by_rows = m >= n,
                    .m = m,
                    .n = n,
                    .k = k,
                    .alpha = alpha,
                    .beta = beta,
                    .a = a,
                    .b = b,
                    .c = c};
    if (gemm_team_split(team, &g))
        ifd_team_run(team, g.blocks, gemm_block, &g);
    else
        ifd_cpu_gemm_one(ta, tb, m, n, k, alpha, a, b, beta, c);
}

/*
 * C starts as res + bias and the product goes on top of it with beta = 1: OpenBLAS's beta = 0
 * zeroes C in a pass of its own, and a bias added after the product was another (together 5 %
 * of a charlm step). Shared by rows, each block starts its own rows just before its product,
 * while they are in its cache; otherwise C is started whole, then the product as gemm's.
 */
void ifd_cpu_gemm_bias(void *ctx, int64_t m, int64_t n, int64_t k, const float *a, const float *b,
                       const float *bias, const float *res, float *c)
{
    ifd_team *team = ctx;
    gemm_split g = {.by_rows = m >= n,
                    .m = m,
                    .n = n,
                    .k = k,
                    .alpha = 1.0f,
                    .beta = 1.0f,
                    .a = a,
                    .b = b,
                    .c = c,
                    .bias = bias,
                    .res = res};
    if (n > 1 && g.by_rows && gemm_k_pieces(m, n, k) == 1 && gemm_team_split(team, &g)) {
        ifd_team_run(team, g.blocks, gemm_block, &g);
        return;
    }
    ifd_nn_bias_fill_rows(m, n, bias, res, c);
    ifd_cpu_gemm(ctx, 0, 0, m, n, k, 1.0f, a, b, 1.0f, c);
}
