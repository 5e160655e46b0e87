/* The cpu backend's all-reduce (device/cpu/allreduce.h): sums bit for bit equal to the sum in
 * replica order, empty chunks, one replica, and abort and leave releasing the replicas that wait.
 *
 * Every test draws its shapes and values from BASE_SEED plus its loop index, and prints the seed
 * and the shape when it fails, so a failure can be replayed (-DBASE_SEED=... draws others). */
#include "tests/util/testutil.h"

#include "core/rng.h"
#include "core/thread.h"
#include "device/cpu/allreduce.h"
#include "tests/util/numbers.h"
#include "tests/util/program_ref.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct ar_worker {
    pthread_t tid;
    ifd_cpu_allreduce *ar;
    int r, replicas, rounds;
    int64_t n;
    float *buf;
    float *const *inputs; /* [round * replicas + r] */
    float *const *sums;   /* [round] */
    int rc;               /* the first non-OK result, or IFD_OK */
    int rc_round;
    int64_t bad_round, bad_index; /* the first mismatch, -1 when none */
} ar_worker;

static void *ar_worker_main(void *arg)
{
    ar_worker *w = arg;
    w->rc = IFD_OK;
    w->bad_round = w->bad_index = -1;
    for (int round = 0; round < w->rounds; round++) {
        memcpy(w->buf, w->inputs[round * w->replicas + w->r], sizeof(float) * (size_t)w->n);
        int rc = ifd_cpu_allreduce_run(w->ar, w->r);
        if (rc != IFD_OK) {
            w->rc = rc;
            w->rc_round = round;
            break;
        }
        if (w->bad_round < 0 && memcmp(w->buf, w->sums[round], sizeof(float) * (size_t)w->n) != 0) {
            w->bad_round = round;
            for (int64_t i = 0; i < w->n; i++)
                if (memcmp(&w->buf[i], &w->sums[round][i], sizeof(float)) != 0) {
                    w->bad_index = i;
                    break;
                }
        }
    }
    return NULL;
}

/* Random values over a wide range of exponents, so that the order of a float sum shows. */
static float wide_random(ifd_rng *rng)
{
    return (float)(tu_urand(rng, -1.0, 1.0) * ldexp(1.0, (int)rand_between(rng, -20, 20)));
}

/* Fills inputs[rounds * R] and their sums in replica order 0..R-1, in float. Returns how many
 * sums differ, bit for bit, from the sum in the reverse order. */
static int64_t ar_make_rounds(ifd_rng *rng, int R, int rounds, int64_t n, float **inputs,
                              float **sums)
{
    int64_t order_matters = 0;
    for (int round = 0; round < rounds; round++) {
        for (int r = 0; r < R; r++) {
            float *x = inputs[round * R + r] = tu_falloc(n);
            for (int64_t i = 0; i < n; i++)
                x[i] = wide_random(rng);
        }
        float *s = sums[round] = tu_falloc(n);
        for (int64_t i = 0; i < n; i++) {
            float acc = inputs[round * R][i];
            for (int r = 1; r < R; r++)
                acc += inputs[round * R + r][i];
            s[i] = acc;
            float rev = inputs[round * R + R - 1][i];
            for (int r = R - 2; r >= 0; r--)
                rev += inputs[round * R + r][i];
            order_matters += memcmp(&rev, &acc, sizeof acc) != 0;
        }
    }
    return order_matters;
}

/* R replicas' workers, each with its buffer bound to one all-reduce, over `rounds` rounds of
 * random inputs and their sums in replica order (ar_make_rounds). */
typedef struct ar_case {
    int R, rounds;
    float **inputs, **sums;
    ifd_cpu_allreduce ar;
    ar_worker *w;
} ar_case;

/* Returns ar_make_rounds's count of sums that the order changes. */
static int64_t ar_case_make(ar_case *c, ifd_rng *rng, int R, int rounds, int64_t n)
{
    c->R = R;
    c->rounds = rounds;
    c->inputs = calloc((size_t)(rounds * R), sizeof(float *));
    c->sums = calloc((size_t)rounds, sizeof(float *));
    int64_t order_matters = ar_make_rounds(rng, R, rounds, n, c->inputs, c->sums);
    ck_assert_int_eq(ifd_cpu_allreduce_init(&c->ar, R, n), IFD_OK);
    c->w = calloc((size_t)R, sizeof *c->w);
    for (int r = 0; r < R; r++) {
        c->w[r] = (ar_worker){.ar = &c->ar,
                              .r = r,
                              .replicas = R,
                              .rounds = rounds,
                              .n = n,
                              .buf = tu_falloc(n),
                              .inputs = c->inputs,
                              .sums = c->sums};
        ifd_cpu_allreduce_bind(&c->ar, r, c->w[r].buf);
    }
    return order_matters;
}

static void ar_case_free(ar_case *c)
{
    ifd_cpu_allreduce_fini(&c->ar);
    for (int r = 0; r < c->R; r++)
        free(c->w[r].buf);
    free(c->w);
    for (int i = 0; i < c->rounds * c->R; i++)
        free(c->inputs[i]);
    for (int i = 0; i < c->rounds; i++)
        free(c->sums[i]);
    free(c->inputs);
    free(c->sums);
}

START_TEST(test_allreduce_sum)
{
    uint64_t seed = tu_test_seed(20, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int R = (int)rand_between(&rng, 2, 6), rounds = (int)rand_between(&rng, 1, 6);
    int64_t n;
    if (_i == 0)
        n = 0;
    else if (_i % 4 == 1)
        n = rand_between(&rng, 1, R - 1); /* some replicas own an empty chunk */
    else
        n = rand_between(&rng, 1, 3000);
    ar_case c;
    int64_t order_matters = ar_case_make(&c, &rng, R, rounds, n);
    if (n >= 200 && R >= 3)
        ck_assert_msg(order_matters > 0, "seed %llu: test data cannot tell summation orders apart",
                      (unsigned long long)seed);
    ar_worker *w = c.w;
    float **sums = c.sums;
    for (int r = 0; r < R; r++)
        ck_assert_int_eq(pthread_create(&w[r].tid, NULL, ar_worker_main, &w[r]), 0);
    for (int r = 0; r < R; r++)
        pthread_join(w[r].tid, NULL);
    for (int r = 0; r < R; r++) {
        ck_assert_msg(w[r].rc == IFD_OK, "seed %llu R=%d n=%lld: replica %d round %d: %s",
                      (unsigned long long)seed, R, (long long)n, r, w[r].rc_round,
                      ifd_errname(w[r].rc));
        ck_assert_msg(w[r].bad_round < 0,
                      "seed %llu R=%d n=%lld rounds=%d: replica %d round %lld element %lld: %.9g, "
                      "sum in replica order %.9g",
                      (unsigned long long)seed, R, (long long)n, rounds, r,
                      (long long)w[r].bad_round, (long long)w[r].bad_index,
                      w[r].bad_index >= 0 ? (double)w[r].buf[w[r].bad_index] : 0.0,
                      w[r].bad_index >= 0 ? (double)sums[w[r].bad_round][w[r].bad_index] : 0.0);
    }
    ar_case_free(&c);
}
END_TEST

START_TEST(test_allreduce_single_replica)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, tu_test_seed(21, 0));
    int64_t n = 100;
    float *buf = tu_falloc(n), *copy = tu_falloc(n);
    for (int64_t i = 0; i < n; i++)
        copy[i] = buf[i] = wide_random(&rng);
    ifd_cpu_allreduce ar;
    ck_assert_int_eq(ifd_cpu_allreduce_init(&ar, 1, n), IFD_OK);
    ifd_cpu_allreduce_bind(&ar, 0, buf);
    for (int round = 0; round < 3; round++)
        ck_assert_int_eq(ifd_cpu_allreduce_run(&ar, 0), IFD_OK);
    ck_assert(memcmp(buf, copy, sizeof(float) * (size_t)n) == 0);
    ifd_cpu_allreduce_fini(&ar);
    free(buf);
    free(copy);
}
END_TEST

/* Waits (10 s at most) until `want` replicas wait in the all-reduce's barrier. */
static int ar_wait_arrived(ifd_cpu_allreduce *ar, int want)
{
    int64_t deadline = ifd_clock_ns() + 10 * 1000000000ll;
    for (;;) {
        ifd_mutex_lock(&ar->mu);
        int arrived = __atomic_load_n(&ar->arrived, __ATOMIC_ACQUIRE);
        ifd_mutex_unlock(&ar->mu);
        if (arrived >= want)
            return 1;
        if (ifd_clock_ns() > deadline)
            return 0;
        ifd_sleep_ns(1000000);
    }
}

/* R - 1 replicas enter a round that one replica never joins; then abort (_i even) or leave
 * (_i odd) releases them with IFD_ESTOPPED or IFD_EEOF. Both are final; an abort overrides a
 * leave. */
START_TEST(test_allreduce_abort_leave)
{
    uint64_t seed = tu_test_seed(22, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int leave = _i % 2;
    int R = (int)rand_between(&rng, 2, 6), absent = (int)rand_between(&rng, 0, R - 1);
    int64_t n = rand_between(&rng, 1, 500);
    ar_case c;
    ar_case_make(&c, &rng, R, 2, n);
    ar_worker *w = c.w;
    ifd_cpu_allreduce *ar = &c.ar;
    for (int r = 0; r < R; r++)
        w[r].rounds = 1; /* the round that one replica never joins */
    for (int r = 0; r < R; r++)
        if (r != absent)
            ck_assert_int_eq(pthread_create(&w[r].tid, NULL, ar_worker_main, &w[r]), 0);
    int all_waiting = ar_wait_arrived(ar, R - 1);
    if (leave)
        ifd_cpu_allreduce_leave(ar);
    else
        ifd_cpu_allreduce_abort(ar);
    for (int r = 0; r < R; r++)
        if (r != absent)
            pthread_join(w[r].tid, NULL);
    ck_assert_msg(all_waiting, "seed %llu R=%d: the replicas never all waited",
                  (unsigned long long)seed, R);
    int want = leave ? IFD_EEOF : IFD_ESTOPPED;
    for (int r = 0; r < R; r++)
        if (r != absent)
            ck_assert_msg(w[r].rc == want, "seed %llu R=%d absent=%d %s: replica %d got %s",
                          (unsigned long long)seed, R, absent, leave ? "leave" : "abort", r,
                          ifd_errname(w[r].rc));
    /* Later calls get the same answer without blocking. */
    ck_assert_int_eq(ifd_cpu_allreduce_run(ar, absent), want);

    /* Both are final: a leave stays a leave until an abort overrides it, and an abort stays. */
    ck_assert_int_eq(ifd_cpu_allreduce_run(ar, 0), want);
    ifd_cpu_allreduce_leave(ar);
    ifd_cpu_allreduce_abort(ar);
    ck_assert_int_eq(ifd_cpu_allreduce_run(ar, 0), IFD_ESTOPPED);
    ifd_cpu_allreduce_leave(ar);
    ck_assert_int_eq(ifd_cpu_allreduce_run(ar, 0), IFD_ESTOPPED);
    ar_case_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("allreduce");
    TCase *tc = tu_tcase(s, "allreduce", 60);
    tcase_add_loop_test(tc, test_allreduce_sum, 0, 12);
    tcase_add_test(tc, test_allreduce_single_replica);
    tcase_add_loop_test(tc, test_allreduce_abort_leave, 0, 8);
    return tu_run_suite(s);
}
