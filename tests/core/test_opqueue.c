/*
 * The controller signal queue (core/opqueue.h): a controller thread's body receives positive
 * signals in order, blocks until one comes, ends at STOP; signal_once mode; a body that returns
 * early does not hang its senders.
 *
 * Counts are random. The seed comes from IFD_TEST_SEED when set, else from the clock, and every
 * failure message names it so that a failing run can be repeated.
 */
#include "tests/util/testutil.h"

#include "core/opqueue.h"
#include "core/rng.h"
#include "core/thread.h"
#include <infeed/error.h>
#include "tests/util/wait.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- opqueue ------------------------------------------------------------------------------ */

#define OPQ_MAX_SIGNALS 512

typedef struct opq_rec {
    int64_t got[OPQ_MAX_SIGNALS];
    atomic_int n;          /* signals received */
    atomic_int ended;      /* the body returned */
    int return_after;      /* the body returns after this many signals; -1: at STOP */
    int next_after_stop;   /* what ifd_opq_next returned once more after STOP */
    char tname[16];        /* the body's thread name, read after its first signal */
    atomic_int name_taken; /* tname is filled */
    atomic_int tid;        /* the body's kernel id (tests/util/wait.h) */
} opq_rec;

static void opq_rec_init(opq_rec *r, int return_after)
{
    memset(r, 0, sizeof *r);
    atomic_init(&r->n, 0);
    atomic_init(&r->ended, 0);
    atomic_init(&r->name_taken, 0);
    atomic_init(&r->tid, 0);
    r->return_after = return_after;
    r->next_after_stop = -1;
}

static void opq_body(ifd_opq *q, void *arg)
{
    opq_rec *r = arg;
    atomic_store(&r->tid, tu_self_tid());
    int64_t it;
    int stopped = 0;
    while (r->return_after < 0 || atomic_load(&r->n) < r->return_after) {
        if (!ifd_opq_next(q, &it)) {
            stopped = 1;
            break;
        }
        if (!atomic_load(&r->name_taken)) {
            pthread_getname_np(pthread_self(), r->tname, sizeof r->tname);
            atomic_store(&r->name_taken, 1);
        }
        int n = atomic_load(&r->n);
        if (n < OPQ_MAX_SIGNALS)
            r->got[n] = it;
        atomic_store(&r->n, n + 1);
    }
    if (stopped)
        r->next_after_stop = ifd_opq_next(q, &it);
    atomic_store(&r->ended, 1);
}

START_TEST(test_opq_signals_in_order)
{
    ifd_rng rng;
    seed_rng(&rng);
    opq_rec r;
    opq_rec_init(&r, -1);
    ifd_opq *q = NULL;
    ck_assert_int_eq(ifd_opq_start(&q, "opq-order", opq_body, &r, 0), IFD_OK);
    ck_assert_ptr_nonnull(q);
    ck_assert_str_eq(ifd_opq_name(q), "opq-order");

    /* More than the signal queue holds, so the sender blocks at times. */
    int n = (int)rand_between(&rng, 1, 200);
    int64_t sent[200];
    for (int i = 0; i < n; i++) {
        sent[i] = rand_between(&rng, 1, 1000000);
        RASSERT(ifd_opq_signal(q, sent[i]) == IFD_OK, "signal %d failed", i);
    }
    /* The body has everything and waits for more; it has not ended. */
    int64_t deadline = ifd_clock_ns() + 10000 * MS;
    while (atomic_load(&r.n) < n && ifd_clock_ns() < deadline)
        ifd_sleep_ns(MS);
    RASSERT(atomic_load(&r.n) == n, "body received %d of %d signals", atomic_load(&r.n), n);
    tu_wait_blocked(&r.tid, &r.ended, "the body waiting for more signals");
    RASSERT(!atomic_load(&r.ended), "body ended before STOP");
    RASSERT(atomic_load(&r.name_taken) && strcmp(r.tname, "opq-order") == 0,
            "controller thread named '%s'", r.tname);

    ifd_opq_join(q);
    RASSERT(atomic_load(&r.ended), "body did not end at STOP");
    RASSERT(atomic_load(&r.n) == n, "body received %d signals, %d sent", atomic_load(&r.n), n);
    for (int i = 0; i < n; i++)
        RASSERT(r.got[i] == sent[i], "signal %d: body got %" PRId64 ", sent %" PRId64, i, r.got[i],
                sent[i]);
    ck_assert_int_eq(r.next_after_stop, 0);
    ifd_opq_join(q); /* idempotent */
    ifd_opq_destroy(q);
    ifd_opq_destroy(NULL);
}
END_TEST

START_TEST(test_opq_join_without_signals)
{
    opq_rec r;
    opq_rec_init(&r, -1);
    ifd_opq *q;
    ck_assert_int_eq(ifd_opq_start(&q, "a-long-controller-name-that-is-cut", opq_body, &r, 0),
                     IFD_OK);
    tu_wait_blocked(&r.tid, &r.ended, "the body with no signal");
    ck_assert_int_eq(atomic_load(&r.ended), 0);
    ck_assert_int_eq(atomic_load(&r.n), 0);
    /* destroy joins. */
    ifd_opq_destroy(q);
    ck_assert_int_eq(atomic_load(&r.ended), 1);
    ck_assert_int_eq(atomic_load(&r.n), 0);
    ck_assert_int_eq(r.next_after_stop, 0);
}
END_TEST

START_TEST(test_opq_signal_rejects_nonpositive)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int once = 0; once < 2; once++) {
        opq_rec r;
        opq_rec_init(&r, -1);
        ifd_opq *q;
        ck_assert_int_eq(ifd_opq_start(&q, "opq-inval", opq_body, &r, once), IFD_OK);
        int64_t bad[] = {0, -1, IFD_SIGNAL_STOP, INT64_MIN, -rand_between(&rng, 1, 1000000)};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            int rc = ifd_opq_signal(q, bad[i]);
            RASSERT(rc == IFD_EINVAL, "signal(%" PRId64 ") gave %s", bad[i], ifd_errname(rc));
        }
        /* A rejected signal is not the first signal of signal_once mode, and does not stop the
         * thread. */
        int64_t good = rand_between(&rng, 1, 1000);
        ck_assert_int_eq(ifd_opq_signal(q, good), IFD_OK);
        ifd_opq_join(q);
        RASSERT(atomic_load(&r.n) == 1 && r.got[0] == good,
                "once=%d: body got %d signals (first %" PRId64 "), expected only %" PRId64, once,
                atomic_load(&r.n), r.got[0], good);
        ck_assert_int_eq(atomic_load(&r.ended), 1);
        ifd_opq_destroy(q);
    }
}
END_TEST

/* The body returns early; the sender can still send many more signals than the signal queue
 * holds, and join does not hang. Run on a helper thread so a hang fails with a message. */
typedef struct early_ctx {
    ifd_opq *q;
    int nsignals;
    int failed_rc;
    atomic_int done;
} early_ctx;

static void *early_sender(void *arg)
{
    early_ctx *e = arg;
    e->failed_rc = IFD_OK;
    for (int i = 0; i < e->nsignals; i++) {
        int rc = ifd_opq_signal(e->q, i + 1);
        if (rc != IFD_OK && e->failed_rc == IFD_OK)
            e->failed_rc = rc;
    }
    ifd_opq_join(e->q);
    atomic_store(&e->done, 1);
    return NULL;
}

START_TEST(test_opq_body_returns_early)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 4; round++) {
        /* Round 0 returns before reading anything; later rounds after a few signals. */
        int k = round == 0 ? 0 : (int)rand_between(&rng, 1, 10);
        opq_rec r;
        opq_rec_init(&r, k);
        ifd_opq *q;
        ck_assert_int_eq(ifd_opq_start(&q, "opq-early", opq_body, &r, 0), IFD_OK);
        early_ctx e = {.q = q, .nsignals = k + (int)rand_between(&rng, 40, 200)};
        atomic_init(&e.done, 0);
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, early_sender, &e), 0);
        RASSERT(tu_wait_flag(&e.done, 10000 * MS),
                "round %d: sending %d signals and joining hung after the body returned after %d",
                round, e.nsignals, k);
        pthread_join(t, NULL);
        RASSERT(e.failed_rc == IFD_OK, "a signal after the body returned gave %s",
                ifd_errname(e.failed_rc));
        RASSERT(atomic_load(&r.n) == k, "body took %d signals, expected %d", atomic_load(&r.n), k);
        for (int i = 0; i < k; i++)
            ck_assert_int_eq(r.got[i], i + 1);
        ck_assert_int_eq(atomic_load(&r.ended), 1);
        ifd_opq_destroy(q);
    }
}
END_TEST

START_TEST(test_opq_signal_once)
{
    ifd_rng rng;
    seed_rng(&rng);
    opq_rec r;
    opq_rec_init(&r, -1);
    ifd_opq *q;
    ck_assert_int_eq(ifd_opq_start(&q, "opq-once", opq_body, &r, 1), IFD_OK);
    int n = (int)rand_between(&rng, 2, 100);
    int64_t first = rand_between(&rng, 1, 1000000);
    ck_assert_int_eq(ifd_opq_signal(q, first), IFD_OK);
    for (int i = 1; i < n; i++)
        RASSERT(ifd_opq_signal(q, rand_between(&rng, 1, 1000000)) == IFD_OK,
                "dropped signal %d was not accepted", i);
    tu_wait_blocked(&r.tid, &r.ended, "the signal_once body after its signal");
    RASSERT(atomic_load(&r.n) == 1, "signal_once body received %d signals of %d sent",
            atomic_load(&r.n), n);
    RASSERT(!atomic_load(&r.ended), "signal_once body ended before STOP");
    ifd_opq_join(q);
    RASSERT(atomic_load(&r.n) == 1 && r.got[0] == first,
            "signal_once body got %d signals (first %" PRId64 "), expected just %" PRId64,
            atomic_load(&r.n), r.got[0], first);
    ck_assert_int_eq(atomic_load(&r.ended), 1);
    ifd_opq_destroy(q);
}
END_TEST

/* The body blocks in ifd_opq_next until a signal arrives. */
START_TEST(test_opq_body_waits_for_signal)
{
    opq_rec r;
    opq_rec_init(&r, -1);
    ifd_opq *q;
    ck_assert_int_eq(ifd_opq_start(&q, "opq-wait", opq_body, &r, 0), IFD_OK);
    for (int64_t i = 1; i <= 3; i++) {
        tu_wait_blocked(&r.tid, &r.ended, "the body waiting for a signal");
        RASSERT(atomic_load(&r.n) == i - 1, "body has %d signals before signal %" PRId64,
                atomic_load(&r.n), i);
        ck_assert_int_eq(ifd_opq_signal(q, i * 10), IFD_OK);
        int64_t deadline = ifd_clock_ns() + 10000 * MS;
        while (atomic_load(&r.n) < i && ifd_clock_ns() < deadline)
            ifd_sleep_ns(MS);
        RASSERT(atomic_load(&r.n) == i, "body did not wake for signal %" PRId64, i);
    }
    ifd_opq_destroy(q);
    ck_assert_int_eq(r.got[0], 10);
    ck_assert_int_eq(r.got[2], 30);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("opqueue");
    TCase *tc = tu_tcase(s, "opqueue", 30);
    tcase_add_test(tc, test_opq_signals_in_order);
    tcase_add_test(tc, test_opq_join_without_signals);
    tcase_add_test(tc, test_opq_signal_rejects_nonpositive);
    tcase_add_test(tc, test_opq_body_returns_early);
    tcase_add_test(tc, test_opq_signal_once);
    tcase_add_test(tc, test_opq_body_waits_for_signal);
    return tu_run_suite(s);
}
