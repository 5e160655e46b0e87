/* Time in a run: the infeed's initial sleep (the seed's initial_infeed_sleep_secs) and the
 * watchdog that ends a starving run. Durations are lower bounds or generous upper bounds, so a
 * loaded machine does not fail them. */
#include "core/thread.h"
#include "tests/util/testutil.h"

#include <stdlib.h>
#include <string.h>

#define SEC (INT64_C(1000000000))

/* A batch queue as a source that records when the infeed first asked it for a batch. */
typedef struct rec_source {
    ifd_batch_source inner;
    int64_t first_next_ns; /* atomic; 0: never */
    int64_t nexts;         /* atomic */
} rec_source;

static int rs_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    rec_source *rs = ctx;
    int64_t never = 0;
    __atomic_compare_exchange_n(&rs->first_next_ns, &never, ifd_clock_ns(), 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_RELAXED);
    __atomic_add_fetch(&rs->nexts, 1, __ATOMIC_RELAXED);
    return rs->inner.ops->next(rs->inner.ctx, out, err);
}

static void rs_abort(void *ctx)
{
    rec_source *rs = ctx;
    rs->inner.ops->abort(rs->inner.ctx);
}

static const ifd_batch_source_ops rs_ops = {.next = rs_next, .abort = rs_abort};

/* A run over a recording source fed by a producer thread. */
typedef struct run {
    ifd_config cfg;
    ifd_batch_queue *q;
    rec_source rs;
    tu_producer *prod;
    ifd_session *s;
    ifd_sink *sink;
} run;

/* softmax over 3 features and 2 classes, batch 4 on replicas replicas; n batches are pushed, and
 * the queue stays open after them when keep_open (the input stalls). */
static void run_init(run *r, int replicas, int64_t steps)
{
    memset(r, 0, sizeof *r);
    tu_config_train(&r->cfg, "softmax", IFD_OPT_SGD, 3, 2, 4 * replicas, 2, 1);
    r->cfg.replicas = replicas;
    r->cfg.num_steps = steps;
}

static void run_start(run *r, int64_t n, int keep_open)
{
    ck_assert_int_eq(ifd_batch_queue_create(&r->q, 4), IFD_OK);
    r->rs.inner = ifd_batch_queue_source(r->q);
    ifd_batch_source src = {.ops = &rs_ops, .ctx = &r->rs};
    ifd_error err;
    int rc = ifd_session_create(&r->s, &r->cfg, src, &err);
    ck_assert_msg(rc == IFD_OK, "session_create: %s", ifd_error_text(&err));
    ck_assert_int_eq(ifd_sink_memory_create(&r->sink), IFD_OK);
    ck_assert_int_eq(ifd_session_add_sink(r->s, r->sink), IFD_OK);
    r->prod = tu_producer_start(r->q, tu_batches_random(&r->cfg, n, 3), n, keep_open);
}

static void run_finish(run *r)
{
    ifd_batch_queue_close(r->q);
    tu_producer_join(r->prod);
    ifd_session_destroy(r->s);
    ifd_batch_queue_destroy(r->q);
    ifd_sink_destroy(r->sink);
}

/* Calls ifd_session_abort after a delay, from its own thread. */
typedef struct aborter {
    pthread_t t;
    ifd_session *s;
    int64_t delay_ns;
} aborter;

static void *aborter_main(void *arg)
{
    aborter *a = arg;
    ifd_sleep_ns(a->delay_ns);
    ifd_session_abort(a->s, "test abort");
    return NULL;
}

/* ---- the initial infeed sleep ---------------------------------------------------------------- */

/* The first batch is not asked for before the sleep is over; the run then trains as usual. */
START_TEST(initial_sleep_delays_the_first_batch)
{
    run r;
    run_init(&r, 1 + _i, 5);
    r.cfg.initial_infeed_sleep_secs = 0.25 * (1 + _i);
    run_start(&r, 5, 0);
    int64_t t0 = ifd_clock_ns();
    ifd_error err;
    int rc = ifd_session_run(r.s, &err);
    ck_assert_msg(rc == IFD_OK, "%s", ifd_error_text(&err));
    ck_assert_int_eq(ifd_session_global_step(r.s), 5);
    int64_t first = __atomic_load_n(&r.rs.first_next_ns, __ATOMIC_ACQUIRE);
    ck_assert_msg(first > 0, "the source was never asked for a batch");
    double waited = (double)(first - t0) / 1e9;
    ck_assert_msg(waited >= r.cfg.initial_infeed_sleep_secs,
                  "the first batch was asked for %.3f s into the run, before the %.2f s sleep "
                  "ended",
                  waited, r.cfg.initial_infeed_sleep_secs);
    run_finish(&r);
}
END_TEST

/* Without a sleep the first batch is asked for at once (so the test above can fail). */
START_TEST(no_initial_sleep_by_default)
{
    run r;
    run_init(&r, 1, 3);
    ck_assert(r.cfg.initial_infeed_sleep_secs == 0.0);
    run_start(&r, 3, 0);
    int64_t t0 = ifd_clock_ns();
    ifd_error err;
    ck_assert_int_eq(ifd_session_run(r.s, &err), IFD_OK);
    int64_t first = __atomic_load_n(&r.rs.first_next_ns, __ATOMIC_ACQUIRE);
    ck_assert_msg(first > 0 && first - t0 < 2 * SEC, "first batch asked for after %.3f s",
                  (double)(first - t0) / 1e9);
    run_finish(&r);
}
END_TEST

/* An abort during a long sleep ends the run at once, with the abort as the cause, and the
 * source is never asked for a batch. */
START_TEST(abort_ends_the_initial_sleep)
{
    run r;
    run_init(&r, 1 + _i, 5);
    r.cfg.initial_infeed_sleep_secs = 60.0;
    run_start(&r, 5, 0);
    aborter a = {.s = r.s, .delay_ns = 100 * MS};
    int64_t t0 = ifd_clock_ns();
    ck_assert_int_eq(pthread_create(&a.t, NULL, aborter_main, &a), 0);
    ifd_error err;
    int rc = ifd_session_run(r.s, &err);
    double took = (double)(ifd_clock_ns() - t0) / 1e9;
    pthread_join(a.t, NULL);
    ck_assert_msg(rc == IFD_ECANCELED && strstr(err.msg, "test abort"), "rc %s: %s",
                  ifd_errname(rc), ifd_error_text(&err));
    ck_assert_msg(took < 5.0, "the run took %.3f s after an abort 0.1 s into a 60 s sleep", took);
    ck_assert_int_eq(__atomic_load_n(&r.rs.nexts, __ATOMIC_ACQUIRE), 0);
    run_finish(&r);
}
END_TEST

START_TEST(initial_sleep_is_validated)
{
    ifd_config cfg;
    ifd_error err;
    const double bad[] = {-0.5, 86401.0, 1.0 / 0.0, 0.0 / 0.0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, 4, 2, 1);
        cfg.initial_infeed_sleep_secs = bad[i];
        ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
        ck_assert_msg(strstr(err.msg, "initial_infeed_sleep_secs") && strstr(err.msg, "86400"),
                      "%g: '%s'", bad[i], err.msg);
    }
    cfg.initial_infeed_sleep_secs = 86400.0;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_OK);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("watchdog");
    TCase *tc = tcase_create("initial_sleep");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, initial_sleep_delays_the_first_batch, 0, 2);
    tcase_add_test(tc, no_initial_sleep_by_default);
    tcase_add_loop_test(tc, abort_ends_the_initial_sleep, 0, 2);
    tcase_add_test(tc, initial_sleep_is_validated);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
