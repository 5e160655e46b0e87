/* A replica's team (device/cpu/team.c) and the products and updates it shares: every chunk runs
 * once and the run returns after the last; helpers take chunks, also after sleeping; split
 * products agree with one sgemm over random shapes, transposes and scales, and repeat. Each test
 * prints its seed when it fails (IFD_TEST_SEED replays it). */
#include "core/rng.h"
#include "core/thread.h"
#include "device/cpu/team.h"
#include "device/ops_gemm_cpu.h"
#include "device/step.h"
#include "tests/util/numbers.h"
#include "tests/util/testutil.h"

#include <cblas.h>
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct tally {
    int *hits;     /* atomic: per chunk */
    int64_t order; /* atomic: chunks finished so far */
    int64_t *when; /* when[c]: order at chunk c's end */
    int64_t sleep_ns;
    int yield;            /* sched_yield inside each chunk: wider windows for a stale helper */
    int ended;            /* atomic: set once its ifd_team_run returned */
    int late;             /* atomic: chunks that ran after that (a helper still on an ended run) */
    int started;          /* atomic: chunks begun */
    int64_t wait_peer_ns; /* the first chunk begun waits up to this long for a second one */
} tally;

static void count_chunk(void *arg, int64_t c)
{
    tally *t = arg;
    if (__atomic_add_fetch(&t->started, 1, __ATOMIC_ACQ_REL) == 1 && t->wait_peer_ns) {
        /* whoever took the first chunk waits for someone to take another: a woken helper
         * arrives within this, however loaded the machine; after a lost wake-up nobody does */
        int64_t until = ifd_clock_ns() + t->wait_peer_ns;
        while (__atomic_load_n(&t->started, __ATOMIC_ACQUIRE) < 2 && ifd_clock_ns() < until)
            ifd_sleep_ns(20000);
    }
    if (t->sleep_ns)
        ifd_sleep_ns(t->sleep_ns);
    if (t->yield)
        sched_yield();
    if (__atomic_load_n(&t->ended, __ATOMIC_ACQUIRE))
        __atomic_add_fetch(&t->late, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t->hits[c], 1, __ATOMIC_RELAXED);
    t->when[c] = __atomic_fetch_add(&t->order, 1, __ATOMIC_RELAXED);
}

static tally *tally_new(int64_t chunks)
{
    tally *t = calloc(1, sizeof *t);
    t->hits = calloc((size_t)chunks + 1, sizeof *t->hits);
    t->when = calloc((size_t)chunks + 1, sizeof *t->when);
    ck_assert(t->hits && t->when);
    return t;
}

static void tally_free(tally *t)
{
    free(t->hits);
    free(t->when);
    free(t);
}

/* Every chunk runs exactly once, and all have run when ifd_team_run returns, for random team
 * sizes and chunk counts (the largest run among them), back to back: a helper still on run g
 * must not take a chunk of run g + 1, nor run one of g's after g returned (each run's tally
 * lives to the end of the trial and counts such late chunks). */
START_TEST(test_every_chunk_once)
{
    ifd_rng rng;
    seed_rng(&rng);
    enum { RUNS = 300 };
    for (int trial = 0; trial < 12; trial++) {
        int threads = (int)rand_between(&rng, 1, 5);
        ifd_team *team;
        ck_assert_int_eq(ifd_team_create(&team, threads, "test-team"), IFD_OK);
        ck_assert_int_eq(ifd_team_threads(team), threads);
        tally *runs[RUNS];
        for (int run = 0; run < RUNS; run++) {
            int64_t chunks = rand_between(&rng, 0, run % 50 == 0 ? 5000 : 40);
            if (run == 7)
                chunks = IFD_TEAM_MAX_CHUNKS;
            tally *t = runs[run] = tally_new(chunks);
            t->yield = trial % 2;
            ifd_team_run(team, chunks, count_chunk, t);
            __atomic_store_n(&t->ended, 1, __ATOMIC_RELEASE);
            ck_assert_int_eq(__atomic_load_n(&t->order, __ATOMIC_RELAXED), chunks);
            for (int64_t c = 0; c < chunks; c++)
                ck_assert_msg(t->hits[c] == 1,
                              "team of %d, run %d: chunk %lld of %lld ran %d times", threads, run,
                              (long long)c, (long long)chunks, t->hits[c]);
        }
        ifd_team_destroy(team); /* joins the helpers: a late chunk has been counted by now */
        for (int run = 0; run < RUNS; run++) {
            ck_assert_msg(runs[run]->late == 0,
                          "team of %d, run %d: %d chunks ran after it returned", threads, run,
                          runs[run]->late);
            tally_free(runs[run]);
        }
    }
}
END_TEST

/* More chunks than a run takes (IFD_TEAM_MAX_CHUNKS + 1 and more) run in order on the caller. */
START_TEST(test_too_many_chunks_run_on_the_caller)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_team *team;
    ck_assert_int_eq(ifd_team_create(&team, (int)rand_between(&rng, 2, 4), "test-team"), IFD_OK);
    int64_t chunks = IFD_TEAM_MAX_CHUNKS + rand_between(&rng, 1, 1000);
    tally *t = tally_new(chunks);
    ifd_team_run(team, chunks, count_chunk, t);
    for (int64_t c = 0; c < chunks; c++)
        ck_assert_int_eq(t->when[c], c);
    ck_assert_int_eq(ifd_team_helped(team), 0);
    tally_free(t);
    ifd_team_destroy(team);
}
END_TEST

/* A NULL team and a team of one run the chunks in order on the caller; a team of 0 is refused;
 * destroying NULL is a no-op. */
START_TEST(test_null_and_one)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_team *one, *none = (ifd_team *)&rng;
    ck_assert_int_eq(ifd_team_create(&none, 0, "x"), IFD_EINVAL);
    ck_assert_ptr_null(none);
    ck_assert_int_eq(ifd_team_create(&one, 1, "x"), IFD_OK);
    ifd_team *teams[2] = {NULL, one};
    for (int i = 0; i < 2; i++) {
        int64_t chunks = rand_between(&rng, 1, 300);
        tally *t = tally_new(chunks);
        ifd_team_run(teams[i], chunks, count_chunk, t);
        for (int64_t c = 0; c < chunks; c++)
            ck_assert_int_eq(t->when[c], c);
        tally_free(t);
        ck_assert_int_eq(ifd_team_helped(teams[i]), 0);
    }
    ck_assert_int_eq(ifd_team_threads(NULL), 1);
    ifd_team_destroy(one);
    ifd_team_destroy(NULL);
}
END_TEST

/* Helpers take chunks, also when they were asleep (a pause of random length, up to 20 x the
 * spin budget, before each run), and when a run has fewer chunks than the team has helpers (2
 * or 3 on a team of 4: those wake one helper a chunk, not all). The first chunk begun waits up
 * to 5 s for a second one to begin, so the caller cannot finish alone before a woken helper gets
 * a core (seen under ASan on the loaded 2-core CI: 3 chunks of 1 ms done in 3.3 ms, no helper);
 * after a lost wake-up no helper comes and this fails. */
START_TEST(test_helpers_take_chunks_after_sleeping)
{
    ifd_rng rng;
    seed_rng(&rng);
    int threads = _i == 0 ? 4 : (int)rand_between(&rng, 2, 4);
    ifd_team *team;
    ck_assert_int_eq(ifd_team_create(&team, threads, "test-team"), IFD_OK);
    for (int run = 0; run < 8; run++) {
        ifd_sleep_ns(rand_between(&rng, 0, 20 * IFD_SPIN_NS));
        int64_t before = ifd_team_helped(team);
        int64_t chunks = _i == 0 ? rand_between(&rng, 2, 3) : rand_between(&rng, 20, 40);
        tally *t = tally_new(chunks);
        t->sleep_ns = 100000;
        t->wait_peer_ns = 5000000000LL;
        int64_t t0 = ifd_clock_ns();
        ifd_team_run(team, chunks, count_chunk, t);
        int64_t took = ifd_clock_ns() - t0;
        ck_assert_int_eq(__atomic_load_n(&t->order, __ATOMIC_RELAXED), chunks);
        ck_assert_msg(ifd_team_helped(team) > before,
                      "team of %d, run %d: the helpers ran none of %lld chunks (%.1f ms)", threads,
                      run, (long long)chunks, (double)took * 1e-6);
        tally_free(t);
    }
    ifd_team_destroy(team);
}
END_TEST

/* A team of 2 to 4 threads (*threads) and the op tables of the caller alone and of that team,
 * with OpenBLAS on one thread, as the backend runs it (ifd_cpu_replica_threads). */
static ifd_team *product_tables(ifd_rng *rng, int *threads, ifd_ops *alone, ifd_ops *shared)
{
    ifd_team *team;
    *threads = (int)rand_between(rng, 2, 4);
    ck_assert_int_eq(ifd_team_create(&team, *threads, "test-team"), IFD_OK);
    openblas_set_num_threads(1);
    ifd_cpu_ops_init(alone, NULL);
    ifd_cpu_ops_init(shared, team);
    return team;
}

/* C[i,j] of alpha op(A) op(B) + beta C0 in double. */
static double gemm_ref(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       const float *b, float beta, const float *c0, int64_t i, int64_t j)
{
    double ref = beta * (double)c0[i * n + j];
    for (int64_t l = 0; l < k; l++)
        ref += alpha * (double)(ta ? a[l * m + i] : a[i * k + l]) *
               (double)(tb ? b[j * k + l] : b[l * n + j]);
    return ref;
}

/* The op set's gemm on a team agrees with one sgemm on the caller and with a double reference,
 * for random shapes above and below the split threshold (split by rows and by columns, ragged
 * last blocks), transposes, alpha and beta; and gives the same bits when run again (a run is
 * repeatable). */
START_TEST(test_gemm_split)
{
    ifd_rng rng;
    seed_rng(&rng);
    int threads;
    ifd_ops alone, shared;
    ifd_team *team = product_tables(&rng, &threads, &alone, &shared);
    int split = 0;
    /* every transpose pair, split by rows (m >= n) and by columns, twice each; then small ones */
    for (int trial = 0; trial < 24; trial++) {
        int big = trial < 16;
        int ta = trial & 1, tb = (trial >> 1) & 1, rows = (trial >> 2) & 1;
        int64_t m = rand_between(&rng, 2, 40), n = rand_between(&rng, 2, 40);
        if (big) {
            int64_t longer = rand_between(&rng, 33, 700),
                    shorter = rand_between(&rng, 2, longer - 1);
            m = rows ? longer : shorter;
            n = rows ? shorter : longer;
        }
        int64_t k = rand_between(&rng, 1, big ? 900 : 40);
        if (big && (double)m * (double)n * (double)k < IFD_TEAM_GEMM_MACS)
            k = IFD_TEAM_GEMM_MACS / (m * n) + rand_between(&rng, 1, 64);
        float alpha = (float)(ifd_rng_uniform(&rng) * 2 - 1);
        float beta = trial % 2 ? 0.0f : (float)ifd_rng_uniform(&rng);
        size_t cb = sizeof(float) * (size_t)(m * n);
        float *a = tu_frand(&rng, m * k), *b = tu_frand(&rng, k * n), *c0 = tu_frand(&rng, m * n);
        float *c1 = malloc(cb), *c2 = malloc(cb), *c3 = malloc(cb);
        memcpy(c1, c0, cb);
        memcpy(c2, c0, cb);
        memcpy(c3, c0, cb);
        int64_t helped = ifd_team_helped(team);
        alone.gemm(alone.ctx, ta, tb, m, n, k, alpha, a, b, beta, c1);
        shared.gemm(shared.ctx, ta, tb, m, n, k, alpha, a, b, beta, c2);
        shared.gemm(shared.ctx, ta, tb, m, n, k, alpha, a, b, beta, c3);
        split += ifd_team_helped(team) > helped;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double ref = gemm_ref(ta, tb, m, n, k, alpha, a, b, beta, c0, i, j);
                double tol = 1e-4 * (1.0 + sqrt((double)k));
                ck_assert_msg(fabs(c1[i * n + j] - ref) <= tol && fabs(c2[i * n + j] - ref) <= tol,
                              "%lldx%lldx%lld ta %d tb %d on %d threads: [%lld,%lld] %g alone, "
                              "%g shared, reference %g",
                              (long long)m, (long long)n, (long long)k, ta, tb, threads,
                              (long long)i, (long long)j, c1[i * n + j], c2[i * n + j], ref);
            }
        ck_assert_msg(memcmp(c2, c3, cb) == 0,
                      "%lldx%lldx%lld ta %d tb %d on %d threads: two "
                      "runs gave different bits",
                      (long long)m, (long long)n, (long long)k, ta, tb, threads);
        free(a);
        free(b);
        free(c0);
        free(c1);
        free(c2);
        free(c3);
    }
    ck_assert_msg(split > 0, "no product was shared with a helper");
    ifd_team_destroy(team);
}
END_TEST

/* A product with a long k and a small C (a weight's gradient over the batch's rows) splits along
 * k into pieces that depend on the shape alone: the same bits on the caller alone as on a team
 * of any size, near a double reference, for every transpose pair, alpha and beta; C's sides
 * from 2 (too small to split by rows or columns) to a quarter of k. */
START_TEST(test_gemm_k_split)
{
    ifd_rng rng;
    seed_rng(&rng);
    int threads;
    ifd_ops alone, shared;
    ifd_team *team = product_tables(&rng, &threads, &alone, &shared);
    int split = 0;
    for (int trial = 0; trial < 12; trial++) {
        int ta = trial & 1, tb = (trial >> 1) & 1;
        int64_t k = rand_between(&rng, 2048, 5000);
        int64_t m = rand_between(&rng, 2,
                                 trial < 8    ? 31
                                 : k / 4 < 80 ? k / 4
                                              : 80),
                n = rand_between(&rng, 2,
                                 trial < 8    ? 31
                                 : k / 4 < 80 ? k / 4
                                              : 80);
        float alpha = (float)(ifd_rng_uniform(&rng) * 2 - 1);
        float beta = trial % 3 ? 0.0f : (float)ifd_rng_uniform(&rng);
        size_t cb = sizeof(float) * (size_t)(m * n);
        float *a = tu_frand(&rng, m * k), *b = tu_frand(&rng, k * n), *c0 = tu_frand(&rng, m * n);
        float *c1 = malloc(cb), *c2 = malloc(cb);
        memcpy(c1, c0, cb);
        memcpy(c2, c0, cb);
        alone.gemm(alone.ctx, ta, tb, m, n, k, alpha, a, b, beta, c1);
        /* again until a helper takes a piece (a sleeping helper may wake after the caller took
         * them all); C's sides below 32 alone would never split by rows or columns */
        int64_t helped = ifd_team_helped(team);
        for (int run = 0; run < 200 && ifd_team_helped(team) == helped; run++) {
            memcpy(c2, c0, cb);
            shared.gemm(shared.ctx, ta, tb, m, n, k, alpha, a, b, beta, c2);
            ck_assert_msg(memcmp(c1, c2, cb) == 0,
                          "%lldx%lldx%lld ta %d tb %d: a team of %d gave other bits than the "
                          "caller alone",
                          (long long)m, (long long)n, (long long)k, ta, tb, threads);
        }
        split += trial < 8 && ifd_team_helped(team) > helped;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double ref = gemm_ref(ta, tb, m, n, k, alpha, a, b, beta, c0, i, j);
                double tol = 1e-4 * (1.0 + sqrt((double)k));
                ck_assert_msg(fabs(c1[i * n + j] - ref) <= tol,
                              "%lldx%lldx%lld ta %d tb %d: [%lld,%lld] %g, reference %g",
                              (long long)m, (long long)n, (long long)k, ta, tb, (long long)i,
                              (long long)j, c1[i * n + j], ref);
            }
        free(a);
        free(b);
        free(c0);
        free(c1);
        free(c2);
    }
    ck_assert_msg(split > 0, "no piece of a long product with a small C ran on a helper");
    ifd_team_destroy(team);
}
END_TEST

/* ifd_cpu_gemm_small on random data of one shape, twice (the same bits), against a double
 * reference; C's padding past n untouched. */
static void check_gemm_small(ifd_rng *rng, int ta, int tb, int64_t m, int64_t n, int64_t k,
                             int64_t lda, int64_t ldb, int64_t ldc, float alpha, float beta)
{
    int64_t ar = ta ? k : m, br = tb ? n : k;
    float *a = tu_frand(rng, ar * lda), *b = tu_frand(rng, br * ldb), *c0 = tu_frand(rng, m * ldc);
    size_t cb = sizeof(float) * (size_t)(m * ldc);
    float *c1 = malloc(cb), *c2 = malloc(cb);
    memcpy(c1, c0, cb);
    memcpy(c2, c0, cb);
    ifd_cpu_gemm_small(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c1, ldc);
    ifd_cpu_gemm_small(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c2, ldc);
    ck_assert_msg(memcmp(c1, c2, cb) == 0, "%lldx%lldx%lld ta %d tb %d: two runs differ",
                  (long long)m, (long long)n, (long long)k, ta, tb);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++) {
            double ref = c0[i * ldc + j];
            if (j < n) {
                ref *= beta;
                for (int64_t l = 0; l < k; l++)
                    ref += alpha * (double)(ta ? a[l * lda + i] : a[i * lda + l]) *
                           (double)(tb ? b[j * ldb + l] : b[l * ldb + j]);
            }
            double tol = j < n ? 1e-4 * (1.0 + sqrt((double)k)) : 0.0;
            ck_assert_msg(fabs(c1[i * ldc + j] - ref) <= tol,
                          "%lldx%lldx%lld ta %d tb %d alpha %g beta %g lds %lld %lld %lld: "
                          "[%lld,%lld] %g, expected %g",
                          (long long)m, (long long)n, (long long)k, ta, tb, (double)alpha,
                          (double)beta, (long long)lda, (long long)ldb, (long long)ldc,
                          (long long)i, (long long)j, c1[i * ldc + j], ref);
        }
    free(a);
    free(b);
    free(c0);
    free(c1);
    free(c2);
}

/* The attention's small products (ifd_cpu_gemm_small: libxsmm's kernels where the build has
 * libxsmm and the call fits one, else OpenBLAS) agree with a double reference for random shapes
 * (some above IFD_GEMM_SMALL_MAX, some with k = 0: C = beta C), leading dimensions wider than the
 * block, every transpose pair,
 * alpha 1 or not and beta 0, 1 or neither; leave C's padding alone; repeat bit for bit. */
START_TEST(test_gemm_small)
{
    ifd_rng rng;
    seed_rng(&rng);
#ifdef IFD_HAVE_LIBXSMM
    ck_assert_msg(strncmp(ifd_cpu_gemm_small_library(), "libxsmm ", 8) == 0, "%s",
                  ifd_cpu_gemm_small_library());
#else
    ck_assert_str_eq(ifd_cpu_gemm_small_library(), "OpenBLAS");
#endif
    for (int trial = 0; trial < 48; trial++) {
        int ta = trial & 1, tb = (trial >> 1) & 1, big = trial % 12 == 11;
        int64_t m = rand_between(&rng, 1, big ? 300 : 140), n = rand_between(&rng, 1, 140),
                k = trial % 12 == 4 ? 0 : rand_between(&rng, 1, big ? 300 : 140);
        int64_t ac = ta ? m : k, bc = tb ? k : n;
        int64_t lda = ac + rand_between(&rng, ac ? 0 : 1, 40),
                ldb = bc + rand_between(&rng, bc ? 0 : 1, 40), ldc = n + rand_between(&rng, 0, 40);
        float alpha = (trial >> 2) % 3 ? 1.0f : (float)(ifd_rng_uniform(&rng) * 2 - 1);
        float beta = (trial >> 3) % 3 == 0   ? 0.0f
                     : (trial >> 3) % 3 == 1 ? 1.0f
                                             : (float)ifd_rng_uniform(&rng);
        check_gemm_small(&rng, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta);
    }
}
END_TEST

/* Products that differ from each other in one thing only (a leading dimension, A transposed or
 * not, beta 0 or 1), interleaved in random order, each several times: every one gets its own
 * kernel (the thread's cache of libxsmm kernels keys on the whole descriptor). */
START_TEST(test_gemm_small_kernels_by_descriptor)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t m = rand_between(&rng, 1, 64), n = rand_between(&rng, 1, 64),
            k = rand_between(&rng, 1, 64);
    enum { VARIANTS = 7 };
    for (int round = 0; round < 6 * VARIANTS; round++) {
        int v = (int)rand_between(&rng, 0, VARIANTS - 1), ta = v == 4;
        int64_t lda = (ta ? m : k) + (v == 1 ? 3 : 0), ldb = n + (v == 2 ? 5 : 0),
                ldc = n + (v == 3 ? 2 : 0);
        check_gemm_small(&rng, ta, 0, m, n, k, lda, ldb, ldc, 1.0f, v == 5 ? 1.0f : 0.0f);
        if (v == 6) /* another shape at the same time, which may share a cache slot */
            check_gemm_small(&rng, 0, 0, n, m, k + 1, k + 1, m, m, 1.0f, 0.0f);
    }
}
END_TEST

/* ifd_cpu_transpose (libxsmm's where the build has it, up to IFD_GEMM_SMALL_MAX a side, else a
 * loop) puts every element in its place and nothing past the block, for random shapes and
 * leading dimensions. */
START_TEST(test_transpose)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int trial = 0; trial < 24; trial++) {
        int64_t rows = rand_between(&rng, 1, trial % 6 == 5 ? 400 : 200),
                cols = rand_between(&rng, 1, trial % 6 == 4 ? 400 : 64),
                ld = cols + rand_between(&rng, 0, 50);
        float *src = tu_frand(&rng, rows * ld), *dst = tu_frand(&rng, rows * cols + 1);
        float guard = dst[rows * cols];
        ifd_cpu_transpose(rows, cols, src, ld, dst);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                ck_assert_msg(dst[j * rows + i] == src[i * ld + j],
                              "%lldx%lld ld %lld: [%lld,%lld] %g, expected %g", (long long)rows,
                              (long long)cols, (long long)ld, (long long)j, (long long)i,
                              dst[j * rows + i], src[i * ld + j]);
        ck_assert(dst[rows * cols] == guard);
        free(src);
        free(dst);
    }
}
END_TEST

/* gemm_bias (C = A B + bias, plus res: none, a separate array, or C itself) on the caller alone
 * and on a team, near a double reference, for shapes split by rows (each block starting its own
 * rows), by columns, along k, and not at all; a team's run repeats its bits. */
START_TEST(test_gemm_bias)
{
    ifd_rng rng;
    seed_rng(&rng);
    int threads;
    ifd_ops alone, shared;
    ifd_team *team = product_tables(&rng, &threads, &alone, &shared);
    int split = 0;
    for (int trial = 0; trial < 24; trial++) {
        int way = trial % 3, shape = (trial / 3) % 4; /* by rows, by columns, along k, small */
        int64_t m = rand_between(&rng, 1, 40), n = rand_between(&rng, 1, 40),
                k = rand_between(&rng, 1, 40);
        if (shape == 0 || shape == 1) {
            int64_t longer = rand_between(&rng, 33, 600),
                    shorter = rand_between(&rng, 2, longer - 1);
            m = shape == 0 ? longer : shorter;
            n = shape == 0 ? shorter : longer;
            k = IFD_TEAM_GEMM_MACS / (m * n) + rand_between(&rng, 1, 300);
        } else if (shape == 2) {
            k = rand_between(&rng, 2048, 4000);
        }
        size_t cb = sizeof(float) * (size_t)(m * n);
        float *a = tu_frand(&rng, m * k), *b = tu_frand(&rng, k * n), *bias = tu_frand(&rng, n);
        float *res = tu_frand(&rng, m * n), *c1 = malloc(cb), *c2 = malloc(cb), *c3 = malloc(cb);
        const float *r1 = NULL, *r2 = NULL, *r3 = NULL;
        if (way == 1)
            r1 = r2 = r3 = res;
        if (way == 2) { /* res is C: each C starts as res */
            memcpy(c1, res, cb);
            memcpy(c2, res, cb);
            memcpy(c3, res, cb);
            r1 = c1, r2 = c2, r3 = c3;
        }
        int64_t helped = ifd_team_helped(team);
        alone.gemm_bias(alone.ctx, m, n, k, a, b, bias, r1, c1);
        shared.gemm_bias(shared.ctx, m, n, k, a, b, bias, r2, c2);
        shared.gemm_bias(shared.ctx, m, n, k, a, b, bias, r3, c3);
        split += ifd_team_helped(team) > helped;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double ref = (way ? (double)res[i * n + j] : 0.0) + bias[j];
                for (int64_t l = 0; l < k; l++)
                    ref += (double)a[i * k + l] * b[l * n + j];
                double tol = 1e-4 * (1.0 + sqrt((double)k));
                ck_assert_msg(fabs(c1[i * n + j] - ref) <= tol && fabs(c2[i * n + j] - ref) <= tol,
                              "%lldx%lldx%lld res %d on %d threads: [%lld,%lld] %g alone, %g "
                              "shared, reference %g",
                              (long long)m, (long long)n, (long long)k, way, threads, (long long)i,
                              (long long)j, c1[i * n + j], c2[i * n + j], ref);
            }
        ck_assert_msg(memcmp(c2, c3, cb) == 0, "%lldx%lldx%lld res %d: two runs gave other bits",
                      (long long)m, (long long)n, (long long)k, way);
        free(a);
        free(b);
        free(bias);
        free(res);
        free(c1);
        free(c2);
        free(c3);
    }
    ck_assert_msg(split > 0, "no gemm_bias was shared with a helper");
    ifd_team_destroy(team);
}
END_TEST

/* The optimizer update on a team gives the bits of one call on the caller, for SGD, momentum and
 * Adam over random lengths (one block or less, ragged last blocks) and values, slots included. */
START_TEST(test_update_split_same_bits)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_team *team;
    ck_assert_int_eq(ifd_team_create(&team, (int)rand_between(&rng, 2, 4), "test-team"), IFD_OK);
    const ifd_optimizer_kind kinds[] = {IFD_OPT_SGD, IFD_OPT_MOMENTUM, IFD_OPT_ADAM};
    for (int trial = 0; trial < 12; trial++) {
        ifd_optimizer opt = {.kind = kinds[trial % 3],
                             .learning_rate = (float)(0.001 + 0.1 * ifd_rng_uniform(&rng)),
                             .momentum = 0.9f,
                             .beta1 = 0.9f,
                             .beta2 = 0.999f,
                             .epsilon = 1e-7f};
        int64_t n = trial < 3 ? rand_between(&rng, 0, IFD_TEAM_UPDATE_BLOCK)
                              : rand_between(&rng, IFD_TEAM_UPDATE_BLOCK + 1, 100000);
        int64_t step = rand_between(&rng, 0, 1000);
        size_t nb = sizeof(float) * (size_t)(n > 0 ? n : 1);
        float *g = tu_frand(&rng, n), *p[2], *m[2], *v[2];
        p[0] = tu_frand(&rng, n);
        m[0] = tu_frand(&rng, n);
        v[0] = tu_frand(&rng, n);
        for (int64_t i = 0; i < n; i++)
            v[0][i] = v[0][i] * v[0][i]; /* a second moment is not negative */
        p[1] = malloc(nb);
        m[1] = malloc(nb);
        v[1] = malloc(nb);
        memcpy(p[1], p[0], nb);
        memcpy(m[1], m[0], nb);
        memcpy(v[1], v[0], nb);
        int sgd = opt.kind == IFD_OPT_SGD, adam = opt.kind == IFD_OPT_ADAM;
        ifd_cpu_optimizer_apply(NULL, &opt, &step, n, p[0], g, sgd ? NULL : m[0],
                                adam ? v[0] : NULL);
        double *partial = malloc(sizeof(double) * (size_t)ifd_cpu_blocks(n));
        float norm[2];
        ifd_cpu_optimizer_apply_on(team, &opt, &step, n, p[1], g, sgd ? NULL : m[1],
                                   adam ? v[1] : NULL, NULL, partial, &norm[1]);
        /* the norm of the updated parameters, the same bits on the caller alone */
        float skip = 1.0f;
        ifd_cpu_optimizer_apply_on(NULL, &opt, &step, n, p[0], g, NULL, NULL, &skip, NULL,
                                   &norm[0]);
        free(partial);
        double sq = 0.0;
        for (int64_t i = 0; i < n; i++)
            sq += (double)p[0][i] * (double)p[0][i];
        ck_assert(norm[0] == norm[1]);
        ck_assert_double_eq_tol(norm[0], sqrt(sq), 1.5e-5 * sqrt(sq) + 1e-30);
        ck_assert_msg(memcmp(p[0], p[1], nb) == 0 && memcmp(m[0], m[1], nb) == 0 &&
                          memcmp(v[0], v[1], nb) == 0,
                      "optimizer %d, %lld floats: the team's update differs from one call",
                      (int)opt.kind, (long long)n);
        for (int i = 0; i < 2; i++) {
            free(p[i]);
            free(m[i]);
            free(v[i]);
        }
        free(g);
    }
    ifd_team_destroy(team);
}
END_TEST

/* The team's size: the count asked for (ifd_config.replica_threads, --replica-threads) when above
 * 0, else the CPUs this process may use over the replicas (at least 1, at most
 * IFD_TEAM_AUTO_MAX), and OpenBLAS on one thread; OPENBLAS_NUM_THREADS in the environment
 * leaves OpenBLAS alone and gives teams of 1. */
START_TEST(test_replica_threads)
{
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int cpus = CPU_COUNT(&set);
    unsetenv("OPENBLAS_NUM_THREADS");
    ifd_rng rng;
    seed_rng(&rng);
    openblas_set_num_threads(2);
    for (int replicas = 1; replicas <= 2 * cpus + 1; replicas++) {
        ck_assert_int_eq(ifd_cpu_replica_threads(replicas, 0), cpus / replicas < 1 ? 1
                                                               : cpus / replicas > IFD_TEAM_AUTO_MAX
                                                                   ? IFD_TEAM_AUTO_MAX
                                                                   : cpus / replicas);
        ck_assert_int_eq(openblas_get_num_threads(), 1);
    }
    int n = (int)rand_between(&rng, 2, 9);
    ck_assert_int_eq(ifd_cpu_replica_threads((int)rand_between(&rng, 1, 8), n), n);
    setenv("OPENBLAS_NUM_THREADS", "2", 1);
    openblas_set_num_threads(2);
    ck_assert_int_eq(ifd_cpu_replica_threads((int)rand_between(&rng, 1, 8), n), 1);
    ck_assert_int_eq(openblas_get_num_threads(), 2);
}
END_TEST

/* The threads of this process that kept its name (OpenBLAS's servers do; libzmq's and ours are
 * named), besides the caller. */
static int unnamed_threads(void)
{
    char self[64] = "", path[300], comm[64];
    FILE *f = fopen("/proc/self/comm", "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(self, sizeof self, f));
    fclose(f);
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || atol(e->d_name) == (long)syscall(SYS_gettid))
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        if ((f = fopen(path, "r")) == NULL)
            continue; /* it ended meanwhile */
        n += fgets(comm, sizeof comm, f) != NULL && strcmp(comm, self) == 0;
        fclose(f);
    }
    closedir(d);
    return n;
}

/* OpenBLAS on one thread for the teams: its server threads, which spin on sched_yield for a
 * while whenever they start, are stopped; OPENBLAS_NUM_THREADS leaves them. (Counted against
 * the threads left once they are stopped: a sanitizer's own thread is unnamed too.) */
START_TEST(test_replica_threads_stop_blas_servers)
{
    ifd_rng rng;
    seed_rng(&rng);
    unsetenv("OPENBLAS_NUM_THREADS");
    int64_t m = rand_between(&rng, 128, 256), k = rand_between(&rng, 128, 256);
    float *a = calloc((size_t)(m * k), sizeof *a), *c = calloc((size_t)(m * m), sizeof *c);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(c);
    ifd_cpu_replica_threads((int)rand_between(&rng, 1, 4), 0);
    int base = unnamed_threads();
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    for (int with_env = 0; with_env < 2; with_env++) {
        /* a product large enough for OpenBLAS's threads starts its servers */
        openblas_set_num_threads(2);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)m, (int)k, 1.0f, a,
                    (int)k, a, (int)k, 0.0f, c, (int)m);
        int started = unnamed_threads();
        if (cpus > 1)
            ck_assert_int_gt(started, base); /* else OpenBLAS has no servers to stop */
        if (with_env)
            setenv("OPENBLAS_NUM_THREADS", "2", 1);
        ifd_cpu_replica_threads((int)rand_between(&rng, 1, 4), 0);
        ck_assert_int_eq(unnamed_threads(), with_env ? started : base);
        unsetenv("OPENBLAS_NUM_THREADS");
    }
    free(a);
    free(c);
}
END_TEST

/* The finite check of a step's gradients (device/step_cpu.c), alone and on a team: every
 * finite vector passes, and one NaN or infinity anywhere (the tail after the last full
 * vector of accumulators included) fails it. */
START_TEST(test_all_finite)
{
    /* check_grads: finite or not, and the norm, from one pass; the same bits with a team */
    ifd_rng rng;
    seed_rng(&rng);
    ifd_team *team;
    ck_assert_int_eq(ifd_team_create(&team, (int)rand_between(&rng, 2, 4), "ifd-test"), IFD_OK);
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int trial = 0; trial < 40; trial++) {
        int64_t n = trial % 2 ? rand_between(&rng, 1, 40)
                              : rand_between(&rng, 1, 6 * IFD_TEAM_UPDATE_BLOCK);
        float *x = tu_frand(&rng, n);
        x[rand_between(&rng, 0, n - 1)] = trial % 3 ? 3.0e38f : -3.0e38f; /* large is finite */
        double *partial = malloc(sizeof(double) * (size_t)ifd_cpu_blocks(n));
        ifd_step_out o[2];
        ifd_cpu_check_grads_on(NULL, x, n, NULL, &o[0]);
        ifd_cpu_check_grads_on(team, x, n, partial, &o[1]);
        double sq = 0.0;
        for (int64_t i = 0; i < n; i++)
            sq += (double)x[i] * (double)x[i];
        ck_assert(o[0].skipped == 0.0f && o[1].skipped == 0.0f);
        ck_assert(o[0].grad_norm == o[1].grad_norm);
        ck_assert_double_eq_tol(o[0].grad_norm, sqrt(sq), 1.5e-5 * sqrt(sq));
        int64_t at = trial % 4 == 0 ? n - 1 : rand_between(&rng, 0, n - 1);
        x[at] = bad[rand_between(&rng, 0, 2)];
        ifd_cpu_check_grads_on(NULL, x, n, NULL, &o[0]);
        ifd_cpu_check_grads_on(team, x, n, partial, &o[1]);
        RASSERT(o[0].skipped == 1.0f, "%g at %lld of %lld passed", (double)x[at], (long long)at,
                (long long)n);
        RASSERT(o[1].skipped == 1.0f, "team: %g at %lld of %lld passed", (double)x[at],
                (long long)at, (long long)n);
        free(partial);
        free(x);
    }
    ifd_step_out e;
    ifd_cpu_check_grads_on(team, NULL, 0, NULL, &e);
    ck_assert(e.skipped == 0.0f && e.grad_norm == 0.0f);
    ifd_team_destroy(team);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("team");
    TCase *tc = tcase_create("team");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_chunk_once);
    tcase_add_test(tc, test_null_and_one);
    tcase_add_loop_test(tc, test_helpers_take_chunks_after_sleeping, 0, 2);
    tcase_add_test(tc, test_too_many_chunks_run_on_the_caller);
    tcase_add_test(tc, test_gemm_split);
    tcase_add_test(tc, test_gemm_k_split);
    tcase_add_test(tc, test_gemm_bias);
    tcase_add_test(tc, test_gemm_small);
    tcase_add_test(tc, test_gemm_small_kernels_by_descriptor);
    tcase_add_test(tc, test_transpose);
    tcase_add_test(tc, test_update_split_same_bits);
    tcase_add_test(tc, test_replica_threads);
    tcase_add_test(tc, test_replica_threads_stop_blas_servers);
    tcase_add_test(tc, test_all_finite);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
