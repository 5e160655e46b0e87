/*
 * Hand-offs through the bounded queue (core/queue.h) between threads: many producers and
 * consumers (every item once, each producer's items in order, the capacity never exceeded), and
 * the thresholds that batch hand-offs (ifd_queue_set_wake, ifd_queue_kick).
 *
 * Sizes and counts are random. The seed comes from IFD_TEST_SEED when set, else from the clock,
 * and every failure message names it so that a failing run can be repeated.
 */
#include "tests/util/testutil.h"

#include "core/queue.h"
#include "core/rng.h"
#include "core/thread.h"
#include <infeed/error.h>
#include "tests/util/queue_items.h"
#include "tests/util/wait.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- many producers, many consumers ------------------------------------------------------- */

#define MP_MAX 6

typedef struct mp_shared {
    ifd_queue *q;
    size_t cap;
    atomic_int over_cap; /* a len above capacity was seen */
    atomic_int producers_left;
    atomic_int stop_sampler;
} mp_shared;

typedef struct mp_producer {
    pthread_t t;
    mp_shared *sh;
    uint32_t id;
    uint32_t count;
    int timed; /* use push_until with a far deadline instead of push */
    int rc;
} mp_producer;

typedef struct mp_consumer {
    pthread_t t;
    mp_shared *sh;
    uint64_t *tags; /* received, in order */
    size_t n, max;
    int timed;
    int bad_item;
    int rc;
} mp_consumer;

static uint64_t mp_tag(uint32_t producer, uint32_t seq)
{
    return ((uint64_t)producer << 32) | seq;
}

static void *mp_producer_main(void *arg)
{
    mp_producer *p = arg;
    p->rc = IFD_OK;
    for (uint32_t s = 0; s < p->count; s++) {
        tu_item it = tu_item_make(mp_tag(p->id, s));
        int rc = p->timed ? ifd_queue_push_until(p->sh->q, &it, ifd_clock_ns() + 20000 * MS)
                          : ifd_queue_push(p->sh->q, &it);
        if (rc != IFD_OK) {
            p->rc = rc;
            break;
        }
        if (ifd_queue_len(p->sh->q) > p->sh->cap)
            atomic_store(&p->sh->over_cap, 1);
    }
    /* The last producer out closes the stream. */
    if (atomic_fetch_sub(&p->sh->producers_left, 1) == 1)
        ifd_queue_close(p->sh->q);
    return NULL;
}

static void *mp_consumer_main(void *arg)
{
    mp_consumer *c = arg;
    tu_item it;
    int rc;
    for (;;) {
        rc = c->timed ? ifd_queue_pop_until(c->sh->q, &it, ifd_clock_ns() + 20000 * MS)
                      : ifd_queue_pop(c->sh->q, &it);
        if (rc != IFD_OK)
            break;
        if (!tu_item_valid(&it))
            c->bad_item = 1;
        if (c->n < c->max)
            c->tags[c->n++] = it.tag;
        if (ifd_queue_len(c->sh->q) > c->sh->cap)
            atomic_store(&c->sh->over_cap, 1);
    }
    c->rc = rc;
    return NULL;
}

static void *mp_sampler_main(void *arg)
{
    mp_shared *sh = arg;
    while (!atomic_load(&sh->stop_sampler)) {
        if (ifd_queue_len(sh->q) > sh->cap)
            atomic_store(&sh->over_cap, 1);
        ifd_sleep_ns(20000);
    }
    return NULL;
}

START_TEST(test_many_producers_many_consumers)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 6; round++) {
        int np = (int)rand_between(&rng, 2, MP_MAX), nc = (int)rand_between(&rng, 2, MP_MAX);
        mp_shared sh;
        sh.cap = (size_t)rand_between(&rng, 1, 8);
        sh.q = tu_queue_make(sh.cap);
        atomic_init(&sh.over_cap, 0);
        atomic_init(&sh.producers_left, np);
        atomic_init(&sh.stop_sampler, 0);

        mp_producer prod[MP_MAX];
        mp_consumer cons[MP_MAX];
        size_t total = 0;
        for (int i = 0; i < np; i++) {
            prod[i] = (mp_producer){.sh = &sh, .id = (uint32_t)i};
            prod[i].count = (uint32_t)rand_between(&rng, 0, 1500);
            prod[i].timed = ifd_rng_below(&rng, 2) == 0;
            total += prod[i].count;
        }
        for (int i = 0; i < nc; i++) {
            cons[i] = (mp_consumer){.sh = &sh, .max = total};
            cons[i].tags = malloc((total ? total : 1) * sizeof(uint64_t));
            cons[i].timed = ifd_rng_below(&rng, 2) == 0;
        }
        pthread_t sampler;
        ck_assert_int_eq(pthread_create(&sampler, NULL, mp_sampler_main, &sh), 0);
        for (int i = 0; i < nc; i++)
            ck_assert_int_eq(pthread_create(&cons[i].t, NULL, mp_consumer_main, &cons[i]), 0);
        for (int i = 0; i < np; i++)
            ck_assert_int_eq(pthread_create(&prod[i].t, NULL, mp_producer_main, &prod[i]), 0);
        for (int i = 0; i < np; i++)
            pthread_join(prod[i].t, NULL);
        for (int i = 0; i < nc; i++)
            pthread_join(cons[i].t, NULL);
        atomic_store(&sh.stop_sampler, 1);
        pthread_join(sampler, NULL);

        char what[160];
        snprintf(what, sizeof what, "round %d: %d producers, %d consumers, capacity %zu", round, np,
                 nc, sh.cap);
        for (int i = 0; i < np; i++)
            RASSERT(prod[i].rc == IFD_OK, "%s: producer %d: %s", what, i, ifd_errname(prod[i].rc));
        RASSERT(!atomic_load(&sh.over_cap), "%s: len exceeded capacity", what);

        /* Every item exactly once; per consumer, each producer's items in increasing order. */
        uint8_t *seen[MP_MAX];
        for (int i = 0; i < np; i++)
            seen[i] = calloc(prod[i].count ? prod[i].count : 1, 1);
        size_t received = 0;
        for (int c = 0; c < nc; c++) {
            RASSERT(cons[c].rc == IFD_ECLOSED, "%s: consumer %d ended with %s", what, c,
                    ifd_errname(cons[c].rc));
            RASSERT(!cons[c].bad_item, "%s: consumer %d got a corrupted item", what, c);
            int64_t last[MP_MAX];
            for (int i = 0; i < np; i++)
                last[i] = -1;
            for (size_t k = 0; k < cons[c].n; k++) {
                uint32_t pid = (uint32_t)(cons[c].tags[k] >> 32);
                uint32_t s = (uint32_t)cons[c].tags[k];
                RASSERT(pid < (uint32_t)np && s < prod[pid].count,
                        "%s: consumer %d got unknown tag %" PRIx64, what, c, cons[c].tags[k]);
                RASSERT(!seen[pid][s], "%s: item %u of producer %u received twice", what, s, pid);
                seen[pid][s] = 1;
                RASSERT((int64_t)s > last[pid],
                        "%s: consumer %d got producer %u's item %u after item %" PRId64, what, c,
                        pid, s, last[pid]);
                last[pid] = s;
            }
            received += cons[c].n;
        }
        RASSERT(received == total, "%s: %zu items received, %zu pushed", what, received, total);
        for (int i = 0; i < np; i++) {
            for (uint32_t s = 0; s < prod[i].count; s++)
                RASSERT(seen[i][s], "%s: item %u of producer %d never received", what, s, i);
            free(seen[i]);
        }
        for (int i = 0; i < nc; i++)
            free(cons[i].tags);
        ifd_queue_destroy(sh.q);
    }
}
END_TEST

/* ---- hand-offs in bursts (ifd_queue_set_wake, ifd_queue_kick) ---------------------------- */

/* A consumer that pops until the end, counting what it got. */
typedef struct counter_consumer {
    pthread_t t;
    ifd_queue *q;
    uint64_t tags[64];
    atomic_int n;
    int last_rc;
    atomic_int tid;
    atomic_int done;
} counter_consumer;

static void *counter_consumer_main(void *arg)
{
    counter_consumer *c = arg;
    atomic_store(&c->tid, tu_self_tid());
    tu_item it;
    int rc;
    while ((rc = ifd_queue_pop(c->q, &it)) == IFD_OK) {
        int n = atomic_load(&c->n);
        if (n < 64)
            c->tags[n] = tu_item_valid(&it) ? it.tag : UINT64_MAX;
        atomic_store(&c->n, n + 1);
    }
    c->last_rc = rc;
    atomic_store(&c->done, 1);
    return NULL;
}

/* Starts a consumer on the empty queue q and waits until it is blocked there. */
static void counter_consumer_start(counter_consumer *c, ifd_queue *q)
{
    memset(c, 0, sizeof *c);
    c->q = q;
    atomic_init(&c->n, 0);
    atomic_init(&c->tid, 0);
    atomic_init(&c->done, 0);
    ck_assert_int_eq(pthread_create(&c->t, NULL, counter_consumer_main, c), 0);
    tu_wait_blocked(&c->tid, &c->done, "consumer on an empty queue");
}

/* Waits (10 s at most) for the consumer to end after close or abort, and joins it. */
static void counter_consumer_join(counter_consumer *c, const char *what)
{
    RASSERT(tu_wait_flag(&c->done, 10000 * MS), "%s", what);
    pthread_join(c->t, NULL);
}

/* Waits up to timeout_ns for the consumer to have at least n items. */
static int wait_count(counter_consumer *c, int n, int64_t timeout_ns)
{
    int64_t deadline = ifd_clock_ns() + timeout_ns;
    while (atomic_load(&c->n) < n && ifd_clock_ns() < deadline)
        ifd_sleep_ns(MS);
    return atomic_load(&c->n);
}

/* A consumer blocked on an empty queue stays blocked below wake_len and is woken at wake_len. */
START_TEST(test_wake_len_batches_consumer)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 2, 8);
    size_t wake_len = (size_t)rand_between(&rng, 2, (int64_t)cap);
    ifd_queue *q = tu_queue_make(cap);
    ifd_queue_set_wake(q, wake_len, 1);
    counter_consumer c;
    counter_consumer_start(&c, q);
    for (size_t i = 0; i + 1 < wake_len; i++) {
        tu_queue_fill(q, i, 1);
        tu_wait_blocked(&c.tid, &c.done, "consumer below wake_len");
        RASSERT(atomic_load(&c.n) == 0,
                "consumer woken at %zu items, wake_len %zu (capacity %zu) took %d", i + 1, wake_len,
                cap, atomic_load(&c.n));
    }
    tu_queue_fill(q, wake_len - 1, 1);
    int got = wait_count(&c, (int)wake_len, 10000 * MS);
    RASSERT(got == (int)wake_len,
            "consumer took %d items after wake_len %zu were in (capacity %zu); a woken consumer "
            "drains what is there",
            got, wake_len, cap);
    ifd_queue_close(q);
    counter_consumer_join(&c, "consumer did not end at close");
    ck_assert_int_eq(c.last_rc, IFD_ECLOSED);
    for (size_t i = 0; i < wake_len; i++)
        RASSERT(c.tags[i] == i, "item %zu: tag %" PRIu64, i, c.tags[i]);
    ifd_queue_destroy(q);
}
END_TEST

/* Below wake_len, kick wakes the consumer, which then drains everything even below wake_len; once
 * empty, the threshold holds again. Close also hands over items below wake_len. */
START_TEST(test_kick_and_close_hand_over_below_wake_len)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 3, 8);
    size_t wake_len = (size_t)rand_between(&rng, 3, (int64_t)cap);
    ifd_queue *q = tu_queue_make(cap);
    ifd_queue_set_wake(q, wake_len, 1);
    counter_consumer c;
    counter_consumer_start(&c, q);

    ifd_queue_kick(q); /* empty: nothing to hand over, and no lasting effect */
    size_t k = (size_t)rand_between(&rng, 1, (int64_t)wake_len - 1);
    tu_queue_fill(q, 0, k);
    tu_wait_blocked(&c.tid, &c.done, "consumer below wake_len");
    RASSERT(atomic_load(&c.n) == 0, "consumer woken by %zu items below wake_len %zu", k, wake_len);
    ifd_queue_kick(q);
    int got = wait_count(&c, (int)k, 10000 * MS);
    RASSERT(got == (int)k, "after kick the consumer took %d of %zu items (wake_len %zu)", got, k,
            wake_len);

    /* Empty again: one item waits for wake_len (or a kick, or close). */
    tu_wait_blocked(&c.tid, &c.done, "consumer on an emptied queue");
    tu_queue_fill(q, k, 1);
    tu_wait_blocked(&c.tid, &c.done, "consumer below wake_len after a kick");
    RASSERT(atomic_load(&c.n) == (int)k, "a kick lasted past the queue emptying (wake_len %zu)",
            wake_len);
    ifd_queue_close(q);
    counter_consumer_join(&c, "consumer did not end at close");
    RASSERT(atomic_load(&c.n) == (int)k + 1, "close handed over %d items, expected %zu",
            atomic_load(&c.n), k + 1);
    ck_assert_int_eq(c.last_rc, IFD_ECLOSED);
    for (size_t i = 0; i <= k; i++)
        RASSERT(c.tags[i] == i, "item %zu: tag %" PRIu64, i, c.tags[i]);
    ifd_queue_destroy(q);
}
END_TEST

/* A pop that finds items does not wait for wake_len; abort wakes a consumer below wake_len. */
START_TEST(test_wake_len_does_not_delay_ready_pops)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 2, 8);
    ifd_queue *q = tu_queue_make(cap);
    ifd_queue_set_wake(q, cap, 1);
    tu_queue_fill(q, 0, 1);
    tu_item it;
    int64_t t0 = ifd_clock_ns();
    ck_assert_int_eq(ifd_queue_pop_until(q, &it, ifd_clock_ns() + 10000 * MS), IFD_OK);
    RASSERT(ifd_clock_ns() - t0 < 1000 * MS, "a pop with an item there waited for wake_len");
    ck_assert_uint_eq(it.tag, 0);

    /* A timed pop below wake_len does not time out empty-handed when an item is there. */
    tu_queue_fill(q, 1, 1);
    ck_assert_int_eq(ifd_queue_pop_until(q, &it, 0), IFD_OK);

    counter_consumer c;
    counter_consumer_start(&c, q);
    tu_queue_fill(q, 2, 1); /* one item, below wake_len (cap >= 2) */
    tu_wait_blocked(&c.tid, &c.done, "consumer below wake_len");
    RASSERT(atomic_load(&c.n) == 0, "consumer woken below wake_len %zu", cap);
    ifd_queue_abort(q);
    counter_consumer_join(&c, "abort did not wake a consumer below wake_len");
    ck_assert_int_eq(c.last_rc, IFD_ESTOPPED);
    ifd_queue_destroy(q);
}
END_TEST

/* A timed pop that waited, with items below wake_len at its deadline, takes one rather than
 * timing out empty-handed. */
START_TEST(test_timed_pop_below_wake_len_at_deadline)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 2, 8);
    ifd_queue *q = tu_queue_make(cap);
    ifd_queue_set_wake(q, cap, 1);
    int64_t wait = rand_between(&rng, 150, 250) * MS;
    int64_t t0 = ifd_clock_ns();
    tu_op c;
    tu_op_start(&c, q, 0, 0, t0 + wait);
    tu_op_wait_blocked(&c, "pop_until on an empty queue");
    tu_queue_fill(q, 7, 1);
    tu_op_join_woken(&c, "pop_until below wake_len");
    RASSERT(c.rc == IFD_OK && c.it.tag == 7,
            "pop_until with an item below wake_len %zu at its deadline gave %s", cap,
            ifd_errname(c.rc));
    /* The order of the events: the deadline passed, then the pop returned. */
    RASSERT(c.back_ns >= c.deadline_ns,
            "pop_until took the item below wake_len %zu %" PRId64 " ns before its deadline", cap,
            c.deadline_ns - c.back_ns);
    ck_assert_uint_eq(ifd_queue_len(q), 0);
    ifd_queue_destroy(q);
}
END_TEST

/* A producer blocked on a full queue stays blocked until wake_free slots are free. */
START_TEST(test_wake_free_batches_producer)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 2, 8);
    size_t wake_free = (size_t)rand_between(&rng, 2, (int64_t)cap);
    ifd_queue *q = tu_queue_make(cap);
    ifd_queue_set_wake(q, 1, wake_free);
    tu_queue_fill(q, 0, cap);
    tu_op p;
    tu_op_start_blocked(&p, q, 1, cap);
    tu_item it;
    for (size_t i = 0; i + 1 < wake_free; i++) {
        ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
        ck_assert_uint_eq(it.tag, i);
        char what[96];
        snprintf(what, sizeof what, "producer at %zu free slots, wake_free %zu (cap %zu)", i + 1,
                 wake_free, cap);
        tu_op_wait_blocked(&p, what);
        RASSERT(!atomic_load(&p.done), "%s was woken", what);
    }
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    tu_op_join_woken(&p, "push at wake_free");
    ck_assert_int_eq(p.rc, IFD_OK);
    RASSERT(ifd_queue_len(q) == cap - wake_free + 1, "len %zu", ifd_queue_len(q));
    ifd_queue_destroy(q);
}
END_TEST

/* set_wake clamps to 1..capacity: a huge wake_len still wakes the consumer when the queue is full,
 * a huge wake_free wakes the producer when the queue is empty, and 0 behaves like 1. */
START_TEST(test_set_wake_clamps)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = tu_queue_make(cap);
    ifd_queue_set_wake(q, 1000, 1000);
    counter_consumer c;
    counter_consumer_start(&c, q);
    tu_queue_fill(q, 0, cap);
    RASSERT(wait_count(&c, (int)cap, 10000 * MS) == (int)cap,
            "wake_len 1000 was not clamped to capacity %zu", cap);
    ifd_queue_close(q);
    counter_consumer_join(&c, "consumer did not end");
    ifd_queue_destroy(q);

    q = tu_queue_make(cap);
    ifd_queue_set_wake(q, 1000, 1000);
    tu_queue_fill(q, 0, cap);
    tu_op p;
    tu_op_start_blocked(&p, q, 1, cap);
    tu_item it;
    for (size_t i = 0; i < cap; i++)
        ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    tu_op_join_woken(&p, "push with wake_free 1000");
    ck_assert_int_eq(p.rc, IFD_OK);
    ifd_queue_destroy(q);

    q = tu_queue_make(cap);
    ifd_queue_set_wake(q, 0, 0);
    counter_consumer_start(&c, q);
    tu_queue_fill(q, 0, 1);
    RASSERT(wait_count(&c, 1, 10000 * MS) == 1, "wake_len 0 was not clamped to 1");
    ifd_queue_close(q);
    counter_consumer_join(&c, "consumer did not end");
    ifd_queue_destroy(q);
}
END_TEST

/* Many producers and consumers with random wake thresholds: producers kick when they finish, so
 * every item arrives exactly once and the stream ends. */
typedef struct burst_producer {
    pthread_t t;
    ifd_queue *q;
    uint32_t id, count;
    atomic_int *left;
    int rc;
} burst_producer;

static void *burst_producer_main(void *arg)
{
    burst_producer *p = arg;
    p->rc = IFD_OK;
    for (uint32_t s = 0; s < p->count; s++) {
        tu_item it = tu_item_make(mp_tag(p->id, s));
        int rc = ifd_queue_push(p->q, &it);
        if (rc != IFD_OK) {
            p->rc = rc;
            break;
        }
    }
    ifd_queue_kick(p->q);
    if (atomic_fetch_sub(p->left, 1) == 1)
        ifd_queue_close(p->q);
    return NULL;
}

START_TEST(test_wake_thresholds_many_threads)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 6; round++) {
        int np = (int)rand_between(&rng, 1, MP_MAX), nc = (int)rand_between(&rng, 1, MP_MAX);
        size_t cap = (size_t)rand_between(&rng, 1, 8);
        size_t wl = (size_t)rand_between(&rng, 1, (int64_t)cap);
        size_t wf = (size_t)rand_between(&rng, 1, (int64_t)cap);
        mp_shared sh;
        sh.cap = cap;
        sh.q = tu_queue_make(cap);
        ifd_queue_set_wake(sh.q, wl, wf);
        atomic_init(&sh.over_cap, 0);
        atomic_init(&sh.producers_left, np);
        atomic_init(&sh.stop_sampler, 0);
        burst_producer prod[MP_MAX];
        mp_consumer cons[MP_MAX];
        size_t total = 0;
        for (int i = 0; i < np; i++) {
            prod[i] = (burst_producer){.q = sh.q, .id = (uint32_t)i, .left = &sh.producers_left};
            prod[i].count = (uint32_t)rand_between(&rng, 0, 1000);
            total += prod[i].count;
        }
        for (int i = 0; i < nc; i++) {
            cons[i] = (mp_consumer){.sh = &sh, .max = total};
            cons[i].tags = malloc((total ? total : 1) * sizeof(uint64_t));
        }
        for (int i = 0; i < nc; i++)
            ck_assert_int_eq(pthread_create(&cons[i].t, NULL, mp_consumer_main, &cons[i]), 0);
        for (int i = 0; i < np; i++)
            ck_assert_int_eq(pthread_create(&prod[i].t, NULL, burst_producer_main, &prod[i]), 0);
        for (int i = 0; i < np; i++)
            pthread_join(prod[i].t, NULL);
        for (int i = 0; i < nc; i++)
            pthread_join(cons[i].t, NULL);
        char what[160];
        snprintf(what, sizeof what,
                 "round %d: %d producers, %d consumers, capacity %zu, wake_len %zu, wake_free "
                 "%zu",
                 round, np, nc, cap, wl, wf);
        size_t received = 0;
        uint8_t *seen[MP_MAX];
        for (int i = 0; i < np; i++) {
            RASSERT(prod[i].rc == IFD_OK, "%s: producer %d: %s", what, i, ifd_errname(prod[i].rc));
            seen[i] = calloc(prod[i].count ? prod[i].count : 1, 1);
        }
        for (int c = 0; c < nc; c++) {
            RASSERT(cons[c].rc == IFD_ECLOSED && !cons[c].bad_item, "%s: consumer %d: %s", what, c,
                    ifd_errname(cons[c].rc));
            for (size_t k = 0; k < cons[c].n; k++) {
                uint32_t pid = (uint32_t)(cons[c].tags[k] >> 32), s = (uint32_t)cons[c].tags[k];
                RASSERT(pid < (uint32_t)np && s < prod[pid].count && !seen[pid][s],
                        "%s: tag %" PRIx64 " unknown or received twice", what, cons[c].tags[k]);
                seen[pid][s] = 1;
            }
            received += cons[c].n;
        }
        RASSERT(received == total, "%s: %zu items received, %zu pushed", what, received, total);
        RASSERT(!atomic_load(&sh.over_cap), "%s: len exceeded capacity", what);
        for (int i = 0; i < np; i++)
            free(seen[i]);
        for (int i = 0; i < nc; i++)
            free(cons[i].tags);
        ifd_queue_destroy(sh.q);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("queue_handoff");
    TCase *tc = tu_tcase(s, "concurrency", 30);
    tcase_add_test(tc, test_many_producers_many_consumers);
    tc = tu_tcase(s, "wake", 30);
    tcase_add_test(tc, test_wake_len_batches_consumer);
    tcase_add_test(tc, test_kick_and_close_hand_over_below_wake_len);
    tcase_add_test(tc, test_wake_len_does_not_delay_ready_pops);
    tcase_add_test(tc, test_timed_pop_below_wake_len_at_deadline);
    tcase_add_test(tc, test_wake_free_batches_producer);
    tcase_add_test(tc, test_set_wake_clamps);
    tcase_add_test(tc, test_wake_thresholds_many_threads);
    return tu_run_suite(s);
}
