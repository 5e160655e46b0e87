/*
 * The error rendezvous (core/rendezvous.h): the first real error is the run's cause, each source
 * keeps its own, the stop actions run once and in order, also when many threads record errors at
 * once.
 *
 * Orders and counts are random. The seed comes from IFD_TEST_SEED when set, else from the clock,
 * and every failure message names it so that a failing run can be repeated.
 */
#include "tests/util/testutil.h"

#include "core/rendezvous.h"
#include "core/rng.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The rendezvous logs every error it records; keep those lines out of the test output. */
static void quiet_stderr(void)
{
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) {
        fflush(stderr);
        dup2(fd, 2);
        close(fd);
    }
}

typedef struct stop_counter {
    atomic_int calls;
    atomic_int order; /* the value of a shared sequence when this ran */
    atomic_int *seq;
    pthread_t thread; /* the thread it last ran on */
} stop_counter;

static void count_stop(void *arg)
{
    stop_counter *c = arg;
    atomic_fetch_add(&c->calls, 1);
    if (c->seq)
        atomic_store(&c->order, atomic_fetch_add(c->seq, 1));
    c->thread = pthread_self();
}

static void stop_counter_init(stop_counter *c, atomic_int *seq)
{
    memset(c, 0, sizeof *c);
    atomic_init(&c->calls, 0);
    atomic_init(&c->order, -1);
    c->seq = seq;
}

START_TEST(test_rendezvous_no_error)
{
    quiet_stderr();
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    stop_counter c;
    stop_counter_init(&c, NULL);
    ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &c), IFD_OK);
    ifd_error out;
    ifd_error_set(&out, IFD_EIO, "junk");
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_OK);
    ck_assert_int_eq(out.code, IFD_OK);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, NULL), IFD_OK);
    ck_assert_int_eq(ifd_rendezvous_stopping(rv), 0);

    /* An IFD_OK "error" and a NULL one are ignored: nothing recorded, nothing stopped. */
    ifd_error ok = {.code = IFD_OK};
    ifd_rendezvous_record_error(rv, "infeed", &ok);
    ifd_rendezvous_record_error(rv, "infeed", NULL);
    ifd_rendezvous_record_done(rv, "infeed");
    ifd_rendezvous_record_done(rv, "outfeed");
    ck_assert_int_eq(ifd_rendezvous_stopping(rv), 0);
    ck_assert_int_eq(atomic_load(&c.calls), 0);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_OK);
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "infeed", &out), IFD_OK);
    ck_assert_int_eq(out.code, IFD_OK);
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "nobody", NULL), IFD_OK);
    ifd_rendezvous_destroy(rv);
    ifd_rendezvous_destroy(NULL);
}
END_TEST

START_TEST(test_rendezvous_cause_text)
{
    quiet_stderr();
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    ck_assert_int_eq(
        ifd_rendezvous_error(rv, "replica 2", IFD_ENUMERIC, "loss is %s at step %d", "nan", 17),
        IFD_ENUMERIC);
    ifd_error out;
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_ENUMERIC);
    ck_assert_int_eq(out.code, IFD_ENUMERIC);
    ck_assert_str_eq(out.msg, "replica 2: loss is nan at step 17");
    ck_assert_str_eq(ifd_error_text(&out), "replica 2: loss is nan at step 17");
    /* The per-source error is the sentence itself, without the source. */
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "replica 2", &out), IFD_ENUMERIC);
    ck_assert_str_eq(out.msg, "loss is nan at step 17");
    ifd_rendezvous_destroy(rv);

    /* An error with no sentence is reported with its description. */
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    ifd_error e = {.code = IFD_EPROTO};
    ifd_rendezvous_record_error(rv, "outfeed", &e);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_EPROTO);
    ck_assert_str_eq(out.msg, "outfeed: protocol error");
    ifd_rendezvous_destroy(rv);

    /* A long sentence is cut but still starts with the source. */
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    char big[IFD_ERROR_MSG_MAX];
    memset(big, 'w', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ifd_rendezvous_error(rv, "hook stop_at_step", IFD_EINVAL, "%s", big);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_EINVAL);
    ck_assert(strncmp(out.msg, "hook stop_at_step: www", 22) == 0);
    ck_assert(strlen(out.msg) < sizeof out.msg);
    ifd_rendezvous_destroy(rv);
}
END_TEST

/* Random sequences of errors from random sources: the cause is the first real error in record
 * order; when only secondary errors came, the first of those. Each source keeps its own first
 * real error (a secondary one until a real one replaces it). */
START_TEST(test_rendezvous_first_real_error_wins)
{
    quiet_stderr();
    ifd_rng rng;
    seed_rng(&rng);
    static const int secondary[] = {IFD_ESTOPPED, IFD_ECANCELED, IFD_ECLOSED};
    static const int real[] = {IFD_EIO,    IFD_ESHAPE, IFD_ENUMERIC,
                               IFD_EPROTO, IFD_EINVAL, IFD_EINTERNAL};
    for (int round = 0; round < 200; round++) {
        ifd_rendezvous *rv;
        ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
        stop_counter c;
        stop_counter_init(&c, NULL);
        ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &c), IFD_OK);
        int nsources = (int)rand_between(&rng, 1, 6);
        int nrecords = (int)rand_between(&rng, 1, 12);
        /* Every third round: secondary errors first, then one real error last. */
        int forced_last_real = round % 3 == 0;
        int first_real = -1, first_any = -1;
        int src_of[12], code_of[12];
        struct {
            int code;
            int idx;
        } expect_src[6];
        for (int s = 0; s < 6; s++)
            expect_src[s].code = IFD_OK, expect_src[s].idx = -1;
        for (int i = 0; i < nrecords; i++) {
            int s = (int)ifd_rng_below(&rng, (uint64_t)nsources);
            int is_real;
            if (forced_last_real)
                is_real = i == nrecords - 1;
            else
                is_real = ifd_rng_below(&rng, 3) == 0;
            int code = is_real ? real[ifd_rng_below(&rng, 6)] : secondary[ifd_rng_below(&rng, 3)];
            src_of[i] = s;
            code_of[i] = code;
            char src[32];
            snprintf(src, sizeof src, "source %d", s);
            ifd_rendezvous_error(rv, src, code, "record %d", i);
            RASSERT(atomic_load(&c.calls) == 1,
                    "stop action ran %d times after the first record (it must run before "
                    "record_error returns)",
                    atomic_load(&c.calls));
            if (first_any < 0)
                first_any = i;
            if (is_real && first_real < 0)
                first_real = i;
            /* Per source: the first real error, else the first secondary one. */
            if (expect_src[s].idx < 0 || (ifd_error_is_secondary(expect_src[s].code) && is_real)) {
                expect_src[s].code = code;
                expect_src[s].idx = i;
            }
        }
        int want = first_real >= 0 ? first_real : first_any;
        ifd_error out;
        int rc = ifd_rendezvous_cause(rv, &out);
        char expect_msg[64];
        snprintf(expect_msg, sizeof expect_msg, "source %d: record %d", src_of[want], want);
        RASSERT(rc == code_of[want] && out.code == rc && strcmp(out.msg, expect_msg) == 0,
                "round %d (%d records, %d sources%s): cause %s '%s', expected %s '%s'", round,
                nrecords, nsources, forced_last_real ? ", real error last" : "", ifd_errname(rc),
                out.msg, ifd_errname(code_of[want]), expect_msg);
        for (int s = 0; s < nsources; s++) {
            char src[32], msg[32];
            snprintf(src, sizeof src, "source %d", s);
            rc = ifd_rendezvous_source_error(rv, src, &out);
            RASSERT(rc == expect_src[s].code, "round %d: %s has %s, expected %s", round, src,
                    ifd_errname(rc), ifd_errname(expect_src[s].code));
            if (expect_src[s].idx >= 0) {
                snprintf(msg, sizeof msg, "record %d", expect_src[s].idx);
                RASSERT(strcmp(out.msg, msg) == 0 && out.code == rc,
                        "round %d: %s kept '%s', expected '%s'", round, src, out.msg, msg);
            }
        }
        ck_assert_int_eq(ifd_rendezvous_stopping(rv), 1);
        ck_assert_int_eq(atomic_load(&c.calls), 1);
        ifd_rendezvous_destroy(rv);
    }
}
END_TEST

/* A source's later real error does not replace its first real one. */
START_TEST(test_rendezvous_source_keeps_first_real)
{
    quiet_stderr();
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    ifd_rendezvous_error(rv, "infeed", IFD_ECLOSED, "closed");
    ifd_rendezvous_error(rv, "outfeed", IFD_ESTOPPED, "stopped");
    ifd_error out;
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_ECLOSED);
    ck_assert_str_eq(out.msg, "infeed: closed");
    ifd_rendezvous_error(rv, "outfeed", IFD_EIO, "sink failed");
    ifd_rendezvous_error(rv, "outfeed", IFD_EPROTO, "later");
    ifd_rendezvous_error(rv, "outfeed", IFD_ECANCELED, "even later");
    ifd_rendezvous_error(rv, "infeed", IFD_ESHAPE, "bad batch");
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_EIO);
    ck_assert_str_eq(out.msg, "outfeed: sink failed");
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "outfeed", &out), IFD_EIO);
    ck_assert_str_eq(out.msg, "sink failed");
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "infeed", &out), IFD_ESHAPE);
    ck_assert_str_eq(out.msg, "bad batch");
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "replica 0", &out), IFD_OK);
    ck_assert_int_eq(out.code, IFD_OK);
    ifd_rendezvous_destroy(rv);
}
END_TEST

START_TEST(test_rendezvous_actions_order_and_abort)
{
    quiet_stderr();
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    atomic_int seq;
    atomic_init(&seq, 0);
    stop_counter c[IFD_RENDEZVOUS_MAX_ACTIONS];
    for (int i = 0; i < IFD_RENDEZVOUS_MAX_ACTIONS; i++) {
        stop_counter_init(&c[i], &seq);
        ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &c[i]), IFD_OK);
    }
    stop_counter extra;
    stop_counter_init(&extra, &seq);
    ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &extra), IFD_ENOMEM);

    /* An outside abort runs the actions, in registration order, without recording an error. */
    ifd_rendezvous_abort(rv);
    ck_assert_int_eq(ifd_rendezvous_stopping(rv), 1);
    for (int i = 0; i < IFD_RENDEZVOUS_MAX_ACTIONS; i++) {
        ck_assert_int_eq(atomic_load(&c[i].calls), 1);
        ck_assert_int_eq(atomic_load(&c[i].order), i);
        ck_assert(pthread_equal(c[i].thread, pthread_self()));
    }
    ck_assert_int_eq(atomic_load(&extra.calls), 0);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, NULL), IFD_OK);
    /* Later errors and aborts do not run them again, but are recorded. */
    ifd_rendezvous_abort(rv);
    ifd_rendezvous_error(rv, "infeed", IFD_EIO, "late");
    for (int i = 0; i < IFD_RENDEZVOUS_MAX_ACTIONS; i++)
        ck_assert_int_eq(atomic_load(&c[i].calls), 1);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, NULL), IFD_EIO);
    ifd_rendezvous_destroy(rv);
}
END_TEST

/* Many threads record errors at once: the actions run exactly once, on one of them, and the cause
 * is a real error that was recorded. */
typedef struct rv_thread {
    pthread_t t;
    ifd_rendezvous *rv;
    atomic_int *go;
    int id;
    int nerrors;
    uint64_t seed;
} rv_thread;

static void *rv_thread_main(void *arg)
{
    rv_thread *r = arg;
    ifd_rng rng;
    ifd_rng_seed(&rng, r->seed);
    while (!atomic_load(r->go))
        sched_yield();
    char src[24];
    snprintf(src, sizeof src, "thread %d", r->id);
    for (int i = 0; i < r->nerrors; i++) {
        /* Odd threads only ever record secondary errors. */
        int code = (r->id % 2) ? IFD_ESTOPPED : (i % 2 ? IFD_ECANCELED : IFD_EIO);
        ifd_rendezvous_error(r->rv, src, code, "error %d", i);
        if (ifd_rng_below(&rng, 4) == 0)
            ifd_rendezvous_abort(r->rv);
        (void)ifd_rendezvous_stopping(r->rv);
    }
    return NULL;
}

START_TEST(test_rendezvous_concurrent_once)
{
    quiet_stderr();
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 10; round++) {
        ifd_rendezvous *rv;
        ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
        int nact = (int)rand_between(&rng, 1, IFD_RENDEZVOUS_MAX_ACTIONS);
        stop_counter c[IFD_RENDEZVOUS_MAX_ACTIONS];
        atomic_int seq;
        atomic_init(&seq, 0);
        for (int i = 0; i < nact; i++) {
            stop_counter_init(&c[i], &seq);
            ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &c[i]), IFD_OK);
        }
        int n = (int)rand_between(&rng, 2, 16);
        atomic_int go;
        atomic_init(&go, 0);
        rv_thread th[16];
        for (int i = 0; i < n; i++) {
            th[i] = (rv_thread){.rv = rv, .go = &go, .id = i, .seed = ifd_rng_next(&rng)};
            th[i].nerrors = (int)rand_between(&rng, 1, 20);
            ck_assert_int_eq(pthread_create(&th[i].t, NULL, rv_thread_main, &th[i]), 0);
        }
        atomic_store(&go, 1);
        for (int i = 0; i < n; i++)
            pthread_join(th[i].t, NULL);
        for (int i = 0; i < nact; i++) {
            RASSERT(atomic_load(&c[i].calls) == 1,
                    "round %d, %d threads: stop action %d ran %d times", round, n, i,
                    atomic_load(&c[i].calls));
            RASSERT(atomic_load(&c[i].order) == i, "action %d ran %d-th", i,
                    atomic_load(&c[i].order));
        }
        ck_assert_int_eq(ifd_rendezvous_stopping(rv), 1);
        /* Thread 0 recorded IFD_EIO as its first error, so the cause is real. */
        ifd_error out;
        int rc = ifd_rendezvous_cause(rv, &out);
        RASSERT(rc == IFD_EIO, "round %d: cause %s '%s', expected a real error", round,
                ifd_errname(rc), out.msg);
        RASSERT(strncmp(out.msg, "thread ", 7) == 0 && strstr(out.msg, ": error 0") != NULL,
                "cause text '%s'", out.msg);
        int tid = atoi(out.msg + 7);
        RASSERT(tid % 2 == 0 && tid < n, "cause from thread %d, which only had secondary errors",
                tid);
        for (int i = 0; i < n; i++) {
            char src[24];
            snprintf(src, sizeof src, "thread %d", i);
            int want = (i % 2) ? IFD_ESTOPPED : IFD_EIO;
            rc = ifd_rendezvous_source_error(rv, src, &out);
            RASSERT(rc == want, "%s: kept %s, expected %s", src, ifd_errname(rc),
                    ifd_errname(want));
            RASSERT(strcmp(out.msg, "error 0") == 0, "%s kept '%s', expected 'error 0'", src,
                    out.msg);
        }
        ifd_rendezvous_destroy(rv);
    }
}
END_TEST

START_TEST(test_rendezvous_many_sources)
{
    /* Far more sources than any fixed table: each keeps its own error under its own name. */
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    int n = 300;
    for (int i = 0; i < n; i++) {
        char src[32];
        snprintf(src, sizeof src, "replica %d", i);
        ifd_rendezvous_error(rv, src, i == n - 1 ? IFD_EIO : IFD_ESTOPPED, "from %d", i);
    }
    ifd_error e;
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &e), IFD_EIO);
    ck_assert_str_eq(e.msg, "replica 299: from 299");
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "replica 150", &e), IFD_ESTOPPED);
    ck_assert_str_eq(e.msg, "from 150");
    ifd_rendezvous_destroy(rv);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rendezvous");
    TCase *tc = tu_tcase(s, "rendezvous", 30);
    tcase_add_test(tc, test_rendezvous_no_error);
    tcase_add_test(tc, test_rendezvous_cause_text);
    tcase_add_test(tc, test_rendezvous_first_real_error_wins);
    tcase_add_test(tc, test_rendezvous_source_keeps_first_real);
    tcase_add_test(tc, test_rendezvous_actions_order_and_abort);
    tcase_add_test(tc, test_rendezvous_concurrent_once);
    tcase_add_test(tc, test_rendezvous_many_sources);
    return tu_run_suite(s);
}
