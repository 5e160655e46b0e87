/* Time in a run: the infeed's initial sleep (the seed's initial_infeed_sleep_secs) and the
 * watchdog that ends a starving run. Durations are generous upper bounds (a run does not hang),
 * or the order of two events where the behaviour is a wait (the first batch is not asked for
 * before the sleep ends; the watchdog does not fire before its limit), so a loaded machine does
 * not fail them. */
#include "core/thread.h"
#include "tests/util/testutil.h"

#include <stdlib.h>
#include <string.h>

#define SEC (INT64_C(1000000000))

/* A batch queue as a source that records when the infeed first asked it for a batch, how many
 * it asked for and got, and when it got the last one. */
typedef struct rec_source {
    ifd_batch_source inner;
    int64_t first_next_ns; /* atomic; 0: never */
    int64_t nexts;         /* atomic: calls to next */
    int64_t delivered;     /* atomic: batches next returned */
    int64_t last_ns;       /* atomic: when next returned the last of them */
} rec_source;

static int rs_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    rec_source *rs = ctx;
    int64_t never = 0;
    __atomic_compare_exchange_n(&rs->first_next_ns, &never, ifd_clock_ns(), 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_RELAXED);
    __atomic_add_fetch(&rs->nexts, 1, __ATOMIC_RELAXED);
    int rc = rs->inner.ops->next(rs->inner.ctx, out, err);
    if (rc == IFD_OK) {
        __atomic_store_n(&rs->last_ns, ifd_clock_ns(), __ATOMIC_RELAXED);
        __atomic_add_fetch(&rs->delivered, 1, __ATOMIC_RELEASE);
    }
    return rc;
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
    tu_batch **bs; /* the producer's array (it owns the batches) */
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
    r->cfg.steps = steps;
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
    r->bs = tu_batches_random(&r->cfg, n, 3);
    r->prod = tu_producer_start(r->q, r->bs, n, keep_open);
}

static void run_finish(run *r)
{
    ifd_batch_queue_close(r->q);
    tu_producer_join(r->prod);
    free(r->bs);
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
    r.cfg.initial_infeed_sleep = 0.25 * (1 + _i);
    run_start(&r, 5, 0);
    int64_t t0 = ifd_clock_ns();
    ifd_error err;
    int rc = ifd_session_run(r.s, &err);
    ck_assert_msg(rc == IFD_OK, "%s", ifd_error_text(&err));
    ck_assert_int_eq(ifd_session_global_step(r.s), 5);
    int64_t first = __atomic_load_n(&r.rs.first_next_ns, __ATOMIC_ACQUIRE);
    ck_assert_msg(first > 0, "the source was never asked for a batch");
    double waited = (double)(first - t0) / 1e9;
    /* The behaviour is a wait, so this is the order of two events on one clock (t0 is taken
     * before the run starts its sleep), which no load can reverse. */
    ck_assert_msg(waited >= r.cfg.initial_infeed_sleep,
                  "the first batch was asked for %.3f s into the run, before the %.2f s sleep "
                  "ended",
                  waited, r.cfg.initial_infeed_sleep);
    run_finish(&r);
}
END_TEST

/* Without a sleep the first batch is asked for at once (so the test above can fail). */
START_TEST(no_initial_sleep_by_default)
{
    run r;
    run_init(&r, 1, 3);
    ck_assert(r.cfg.initial_infeed_sleep == 0.0);
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
    r.cfg.initial_infeed_sleep = 60.0;
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
        cfg.initial_infeed_sleep = bad[i];
        ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
        ck_assert_msg(strncmp(err.msg, "initial_infeed_sleep: ", 22) == 0 &&
                          strstr(err.msg, "86400"),
                      "%g: '%s'", bad[i], err.msg);
    }
    cfg.initial_infeed_sleep = 86400.0;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_OK);
}
END_TEST

/* ---- the watchdog ------------------------------------------------------------------------------
 */

/* What the session and the source say when the watchdog fires (its context function is called
 * then, on its thread; the test reads it after the run, which joined that thread). */
typedef struct firing {
    run *r;
    int calls;
    int64_t at_ns, step, delivered, last_ns;
    int waiting, waiting_replica;
    int64_t staged; /* shards staged in every replica's infeed ring, summed */
} firing;

static void test_context(void *arg, char *buf, size_t len)
{
    firing *f = arg;
    f->at_ns = ifd_clock_ns();
    f->calls++;
    f->step = ifd_session_global_step(f->r->s);
    f->delivered = __atomic_load_n(&f->r->rs.delivered, __ATOMIC_ACQUIRE);
    f->last_ns = __atomic_load_n(&f->r->rs.last_ns, __ATOMIC_RELAXED);
    f->waiting = ifd_session_infeed_waiting(f->r->s, &f->waiting_replica, NULL);
    ifd_ring_depths d;
    for (int i = 0; i < f->r->cfg.replicas; i++)
        f->staged += ifd_session_ring_depths(f->r->s, i, &d) == IFD_OK ? d.infeed : 1;
    snprintf(buf, len, "7 producers connected");
}

/* The replica numbers the sentence lists as having an empty infeed, as a bit set; -1 when it
 * names none. */
static int64_t empty_replicas(const char *msg)
{
    const char *p = strstr(msg, "the infeed of replica ");
    if (p)
        p += strlen("the infeed of replica");
    else if ((p = strstr(msg, "the infeeds of replicas ")) != NULL)
        p += strlen("the infeeds of replicas");
    else
        return -1;
    int64_t set = 0;
    while (*p == ' ' || *p == ',' || (*p >= '0' && *p <= '9') || strncmp(p, " and ", 5) == 0) {
        if (*p >= '0' && *p <= '9') {
            set |= INT64_C(1) << strtol(p, (char **)&p, 10);
        } else if (strncmp(p, " and ", 5) == 0 && p[5] >= '0' && p[5] <= '9') {
            p += 5;
        } else if (*p == ' ' && !(p[1] >= '0' && p[1] <= '9')) {
            break;
        } else {
            p++;
        }
    }
    return set;
}

/* A source that delivers k batches and then nothing (the queue stays open): the run ends with
 * IFD_ETIMEDOUT from the watchdog, at global step k, naming every replica's infeed as empty and
 * carrying the caller's context. It fires because the input starved: when it fires, the source
 * has delivered k batches, the infeed waits for the next, no replica has a shard staged, and at
 * least cfg.watchdog seconds have passed since the source delivered the last batch (step k could
 * not end before it, and the watchdog counts from a step's end). */
START_TEST(starving_input_ends_the_run)
{
    ifd_rng rng;
    seed_rng(&rng);
    int replicas = (int)rand_between(&rng, 1, 4);
    int64_t k = rand_between(&rng, 1, 7);
    run r;
    run_init(&r, replicas, 50);
    r.cfg.iterations_per_loop = rand_between(&rng, 1, 4);
    r.cfg.watchdog = 0.3;
    run_start(&r, k, 1);
    firing f = {.r = &r};
    ck_assert_int_eq(ifd_session_set_watchdog_context(r.s, test_context, &f), IFD_OK);
    int64_t t0 = ifd_clock_ns();
    ifd_error err;
    int rc = ifd_session_run(r.s, &err);
    double took = (double)(ifd_clock_ns() - t0) / 1e9;
    const char *m = err.msg;
    RASSERT(rc == IFD_ETIMEDOUT, "R=%d k=%lld: rc %s: %s", replicas, (long long)k, ifd_errname(rc),
            m);
    RASSERT(strncmp(m, "watchdog: no step completed for 0.3 s", 37) == 0, "sentence '%s'", m);
    RASSERT(ifd_session_global_step(r.s) == k, "R=%d: global step %lld, expected %lld", replicas,
            (long long)ifd_session_global_step(r.s), (long long)k);
    int64_t all = (INT64_C(1) << replicas) - 1;
    RASSERT(empty_replicas(m) == all,
            "R=%d: the sentence should name the infeed of every replica "
            "as empty: '%s'",
            replicas, m);
    RASSERT(strstr(m, "no outfeed ring is full") != NULL, "'%s'", m);
    RASSERT(strstr(m, "; 7 producers connected") != NULL, "the context is missing: '%s'", m);
    RASSERT(took < 10.0, "the run ended %.3f s after it began", took);
    RASSERT(f.calls == 1 && f.step == k && f.delivered == k,
            "R=%d k=%lld: fired %d times, at global step %lld after %lld batches", replicas,
            (long long)k, f.calls, (long long)f.step, (long long)f.delivered);
    RASSERT(f.waiting && f.waiting_replica >= -1 && f.waiting_replica < replicas && f.staged == 0,
            "R=%d k=%lld: when it fired the infeed was %s the source (replica %d), %lld shards "
            "staged",
            replicas, (long long)k, f.waiting ? "waiting for" : "not waiting for",
            f.waiting_replica, (long long)f.staged);
    /* The watchdog's limit is its behaviour: the order of two events (the last batch delivered,
     * the firing), which no load can reverse. */
    RASSERT(f.at_ns - f.last_ns >= (int64_t)(r.cfg.watchdog * 1e9),
            "R=%d k=%lld: fired %.3f s after the last batch came, before its %g s", replicas,
            (long long)k, (double)(f.at_ns - f.last_ns) / 1e9, r.cfg.watchdog);
    RASSERT(ifd_session_end_reason(r.s) == IFD_END_ERROR, "reason %s",
            ifd_end_reason_name(ifd_session_end_reason(r.s)));
    /* The end summary carries it. */
    size_t n = ifd_sink_memory_count(r.sink);
    char *end = ifd_sink_memory_get(r.sink, n - 1);
    RASSERT(strstr(end, "ETIMEDOUT\"") && strstr(end, "watchdog: no step"), "%s", end);
    free(end);
    run_finish(&r);
}
END_TEST

/* Pushes n batches, one every delay_ns, then closes the queue. */
typedef struct slow_producer {
    pthread_t t;
    ifd_batch_queue *q;
    tu_batch **bs;
    int64_t n, delay_ns;
} slow_producer;

static void *slow_main(void *arg)
{
    slow_producer *p = arg;
    for (int64_t i = 0; i < p->n; i++) {
        ifd_sleep_ns(p->delay_ns);
        if (ifd_batch_queue_push(p->q, &p->bs[i]->b) != IFD_OK)
            tu_batch_free(p->bs[i]);
    }
    ifd_batch_queue_close(p->q);
    free(p->bs);
    return NULL;
}

/* Steps that come slowly but more often than the watchdog's limit keep the run alive. */
START_TEST(slow_input_is_not_starving)
{
    run r;
    run_init(&r, 2, 8);
    r.cfg.watchdog = 0.4;
    run_start(&r, 0, 1); /* an empty producer that leaves the queue open: the slow one feeds it */
    slow_producer sp = {
        .q = r.q, .bs = tu_batches_random(&r.cfg, 8, 5), .n = 8, .delay_ns = 100 * MS};
    ck_assert_int_eq(pthread_create(&sp.t, NULL, slow_main, &sp), 0);
    ifd_error err;
    int rc = ifd_session_run(r.s, &err);
    pthread_join(sp.t, NULL);
    ck_assert_msg(rc == IFD_OK, "%s", ifd_error_text(&err));
    ck_assert_int_eq(ifd_session_global_step(r.s), 8);
    run_finish(&r);
}
END_TEST

/* A hook that takes its time after every loop and then has the next batch pushed 40 ms later
 * (from a thread of its own): each loop waits briefly for input, long after the step before it. */
typedef struct pacer {
    ifd_batch_queue *q;
    tu_batch **bs;
    int next, n;
    pthread_t t[16];
    int nt;
} pacer;

typedef struct delayed_push {
    ifd_batch_queue *q;
    tu_batch *b;
} delayed_push;

static void *delayed_push_main(void *arg)
{
    delayed_push *d = arg;
    ifd_sleep_ns(40 * MS);
    if (ifd_batch_queue_push(d->q, &d->b->b) != IFD_OK)
        tu_batch_free(d->b);
    free(d);
    return NULL;
}

static int slow_after_run(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)ctx;
    (void)err;
    pacer *p = arg;
    ifd_sleep_ns(400 * MS);
    if (p->next < p->n && p->nt < 16) {
        delayed_push *d = malloc(sizeof *d);
        *d = (delayed_push){.q = p->q, .b = p->bs[p->next++]};
        ck_assert_int_eq(pthread_create(&p->t[p->nt++], NULL, delayed_push_main, d), 0);
    }
    return IFD_OK;
}

/* Time between device loops (hooks) is not starvation: the clock starts again when a loop
 * begins. */
START_TEST(time_between_loops_does_not_count)
{
    run r;
    run_init(&r, 1, 6);
    r.cfg.iterations_per_loop = 1;
    r.cfg.watchdog = 0.2;
    run_start(&r, 1, 1);
    pacer p = {.q = r.q, .bs = tu_batches_random(&r.cfg, 5, 9), .n = 5};
    ifd_hook h = {.name = "slow", .after_run = slow_after_run, .arg = &p};
    ck_assert_int_eq(ifd_session_add_hook(r.s, &h), IFD_OK);
    ifd_error err;
    int rc = ifd_session_run(r.s, &err);
    for (int i = 0; i < p.nt; i++)
        pthread_join(p.t[i], NULL);
    ck_assert_msg(rc == IFD_OK, "%s", ifd_error_text(&err));
    ck_assert_int_eq(ifd_session_global_step(r.s), 6);
    for (int i = p.next; i < p.n; i++)
        tu_batch_free(p.bs[i]);
    free(p.bs);
    run_finish(&r);
}
END_TEST

/* A sink whose first write blocks for a while: the outfeed thread stops draining. */
static int stuck_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    (void)json;
    (void)len;
    (void)err;
    if (__atomic_fetch_add((int *)ctx, 1, __ATOMIC_RELAXED) == 0)
        ifd_sleep_ns(1500 * MS);
    return IFD_OK;
}

static const ifd_sink_ops stuck_ops = {.write = stuck_write};

/* An outfeed that is not drained fills its ring and the steps stop: the sentence says the outfeed
 * rings are full and no infeed is empty. */
START_TEST(full_outfeed_is_named)
{
    run r;
    run_init(&r, 1 + _i, 40);
    r.cfg.iterations_per_loop = 10;
    r.cfg.outfeed_depth = 2;
    r.cfg.summary_every = 1;
    r.cfg.watchdog = 0.3;
    run_start(&r, 40, 0);
    int writes = 0;
    ifd_sink *stuck;
    ck_assert_int_eq(ifd_sink_create(&stuck, &stuck_ops, &writes), IFD_OK);
    ck_assert_int_eq(ifd_session_add_sink(r.s, stuck), IFD_OK);
    ifd_error err;
    int rc = ifd_session_run(r.s, &err);
    ck_assert_msg(rc == IFD_ETIMEDOUT, "rc %s: %s", ifd_errname(rc), ifd_error_text(&err));
    ck_assert_msg(strstr(err.msg, "no replica's infeed is empty") &&
                      strstr(err.msg, r.cfg.replicas == 1 ? "the outfeed ring of replica 0 is full"
                                                          : "the outfeed rings of replicas 0 and 1 "
                                                            "are full"),
                  "'%s'", err.msg);
    run_finish(&r);
    ifd_sink_destroy(stuck);
}
END_TEST

/* The rings a session reports: capacities from the config, lengths within them. */
START_TEST(ring_depths)
{
    run r;
    run_init(&r, 3, 4);
    r.cfg.infeed_depth = 5;
    r.cfg.outfeed_depth = 7;
    run_start(&r, 4, 0);
    ifd_ring_depths d;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(ifd_session_ring_depths(r.s, i, &d), IFD_OK);
        ck_assert_int_eq(d.infeed_capacity, 5);
        ck_assert_int_eq(d.outfeed_capacity, 7);
        ck_assert_int_eq(d.infeed, 0);
        ck_assert_int_eq(d.outfeed, 0);
    }
    ck_assert_int_eq(ifd_session_ring_depths(r.s, 3, &d), IFD_EINVAL);
    ck_assert_int_eq(ifd_session_ring_depths(r.s, -1, &d), IFD_EINVAL);
    ifd_error err;
    ck_assert_int_eq(ifd_session_run(r.s, &err), IFD_OK);
    run_finish(&r);
}
END_TEST

START_TEST(watchdog_is_validated)
{
    ifd_config cfg;
    ifd_error err;
    const double bad[] = {-1.0, 1e6, 0.0 / 0.0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, 4, 2, 1);
        cfg.watchdog = bad[i];
        ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
        ck_assert_msg(strncmp(err.msg, "watchdog: ", 10) == 0 && strstr(err.msg, "0 (off)"),
                      "%g: '%s'", bad[i], err.msg);
    }
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
    tc = tcase_create("watchdog");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, starving_input_ends_the_run, 0, 6);
    tcase_add_test(tc, slow_input_is_not_starving);
    tcase_add_test(tc, time_between_loops_does_not_count);
    tcase_add_loop_test(tc, full_outfeed_is_named, 0, 2);
    tcase_add_test(tc, ring_depths);
    tcase_add_test(tc, watchdog_is_validated);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
