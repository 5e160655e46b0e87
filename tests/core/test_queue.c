/*
 * Tests of the bounded blocking queue (core/queue.h): FIFO order and copies by value, blocking and
 * wake-ups, close and abort while threads are blocked, and timeouts.
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

/* ---- basic behaviour ---------------------------------------------------------------------- */

START_TEST(test_create_invalid)
{
    ifd_queue *q = (ifd_queue *)&q;
    ck_assert_int_eq(ifd_queue_create(&q, 0, 4), IFD_EINVAL);
    ck_assert_ptr_null(q);
    q = (ifd_queue *)&q;
    ck_assert_int_eq(ifd_queue_create(&q, 8, 0), IFD_EINVAL);
    ck_assert_ptr_null(q);

    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 100);
    q = tu_queue_make(cap);
    RASSERT(ifd_queue_capacity(q) == cap, "capacity %zu, expected %zu", ifd_queue_capacity(q), cap);
    ck_assert_uint_eq(ifd_queue_len(q), 0);
    ck_assert_int_eq(ifd_queue_is_closed(q), 0);
    ifd_queue_destroy(q);
    ifd_queue_destroy(NULL);
}
END_TEST

/* Interleaved pushes and pops against a model FIFO, wrapping around the ring many times. */
START_TEST(test_fifo_order)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 20; round++) {
        size_t cap = (size_t)rand_between(&rng, 1, 64);
        ifd_queue *q = tu_queue_make(cap);
        uint64_t next_in = 0, next_out = 0;
        int ops = (int)rand_between(&rng, 50, 2000);
        for (int i = 0; i < ops; i++) {
            size_t len = (size_t)(next_in - next_out);
            RASSERT(ifd_queue_len(q) == len, "round %d op %d: len %zu, expected %zu", round, i,
                    ifd_queue_len(q), len);
            int push = ifd_rng_below(&rng, 2) == 0;
            tu_item it = tu_item_make(next_in);
            if (push && len < cap) {
                RASSERT(ifd_queue_push(q, &it) == IFD_OK, "push failed");
                next_in++;
            } else if (push) {
                int rc = ifd_queue_push_until(q, &it, 0);
                RASSERT(rc == IFD_ETIMEDOUT, "push on a full queue (cap %zu) gave %s", cap,
                        ifd_errname(rc));
            } else if (len > 0) {
                RASSERT(ifd_queue_pop(q, &it) == IFD_OK, "pop failed");
                RASSERT(it.tag == next_out && tu_item_valid(&it),
                        "round %d: popped tag %" PRIu64 ", expected %" PRIu64, round, it.tag,
                        next_out);
                next_out++;
            } else {
                int rc = ifd_queue_pop_until(q, &it, 0);
                RASSERT(rc == IFD_ETIMEDOUT, "pop on an empty queue gave %s", ifd_errname(rc));
            }
        }
        /* The rest, in order. */
        tu_item it;
        while (next_out < next_in) {
            RASSERT(ifd_queue_pop(q, &it) == IFD_OK, "pop failed");
            RASSERT(it.tag == next_out, "popped %" PRIu64 ", expected %" PRIu64, it.tag, next_out);
            next_out++;
        }
        ck_assert_uint_eq(ifd_queue_len(q), 0);
        ifd_queue_destroy(q);
    }
}
END_TEST

/* Items are copied by value at any item size, including ones larger than a cache line. */
START_TEST(test_item_sizes)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 10; round++) {
        size_t sz = (size_t)rand_between(&rng, 1, 1000);
        size_t cap = (size_t)rand_between(&rng, 1, 16);
        ifd_queue *q = NULL;
        ck_assert_int_eq(ifd_queue_create(&q, sz, cap), IFD_OK);
        unsigned char *in = malloc(sz), *out = malloc(sz);
        for (size_t i = 0; i < cap; i++) {
            memset(in, (int)(i * 7 + 1), sz);
            ck_assert_int_eq(ifd_queue_push(q, in), IFD_OK);
        }
        memset(in, 0xEE, sz); /* the queue holds copies, not the caller's buffer */
        for (size_t i = 0; i < cap; i++) {
            memset(out, 0, sz);
            ck_assert_int_eq(ifd_queue_pop(q, out), IFD_OK);
            for (size_t b = 0; b < sz; b++)
                RASSERT(out[b] == (unsigned char)(i * 7 + 1),
                        "item size %zu: item %zu byte %zu is %u", sz, i, b, out[b]);
        }
        free(in);
        free(out);
        ifd_queue_destroy(q);
    }
}
END_TEST

/* ---- blocking and wake-ups ---------------------------------------------------------------- */

START_TEST(test_pop_blocks_until_push)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_queue *q = tu_queue_make((size_t)rand_between(&rng, 1, 8));
    tu_op c;
    tu_op_start_blocked(&c, q, 0, 0);
    tu_item it = tu_item_make(4242);
    ck_assert_int_eq(ifd_queue_push(q, &it), IFD_OK);
    tu_op_join_woken(&c, "pop");
    ck_assert_int_eq(c.rc, IFD_OK);
    ck_assert_uint_eq(c.it.tag, 4242);
    ck_assert(tu_item_valid(&c.it));
    ck_assert_uint_eq(ifd_queue_len(q), 0);
    ifd_queue_destroy(q);
}
END_TEST

START_TEST(test_push_blocks_until_pop)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = tu_queue_make(cap);
    tu_queue_fill(q, 0, cap);
    tu_op p;
    tu_op_start_blocked(&p, q, 1, cap);
    RASSERT(ifd_queue_len(q) == cap, "len %zu while a push is blocked, capacity %zu",
            ifd_queue_len(q), cap);
    tu_item it;
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    ck_assert_uint_eq(it.tag, 0);
    tu_op_join_woken(&p, "push");
    ck_assert_int_eq(p.rc, IFD_OK);
    /* The blocked item went in last. */
    for (size_t i = 1; i <= cap; i++) {
        ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
        RASSERT(it.tag == i, "popped %" PRIu64 ", expected %zu (cap %zu)", it.tag, i, cap);
    }
    ifd_queue_destroy(q);
}
END_TEST

/* Several consumers blocked at once: each push wakes (at least) one, and every item is taken by
 * exactly one consumer. */
START_TEST(test_many_blocked_consumers_woken)
{
    ifd_rng rng;
    seed_rng(&rng);
    int n = (int)rand_between(&rng, 2, 6);
    ifd_queue *q = tu_queue_make((size_t)rand_between(&rng, 1, 8));
    tu_op c[6];
    tu_ops_start_blocked(c, n, q, 0, 0);
    for (int i = 0; i < n; i++) {
        tu_item it = tu_item_make(100 + (uint64_t)i);
        ck_assert_int_eq(ifd_queue_push(q, &it), IFD_OK);
    }
    int seen[6] = {0};
    for (int i = 0; i < n; i++) {
        tu_op_join_woken(&c[i], "pop");
        RASSERT(c[i].rc == IFD_OK, "consumer %d: %s", i, ifd_errname(c[i].rc));
        int k = (int)(c[i].it.tag - 100);
        RASSERT(k >= 0 && k < n && tu_item_valid(&c[i].it), "consumer %d got tag %" PRIu64, i,
                c[i].it.tag);
        seen[k]++;
    }
    for (int i = 0; i < n; i++)
        RASSERT(seen[i] == 1, "item %d taken %d times", i, seen[i]);
    ifd_queue_destroy(q);
}
END_TEST

/* ---- close -------------------------------------------------------------------------------- */

/* How a queue is ended while pops wait on it, and what the pops then return. */
typedef struct queue_end {
    const char *name;
    void (*end)(ifd_queue *q);
    int rc;
} queue_end;

static const queue_end k_close = {"close", ifd_queue_close, IFD_ECLOSED};
static const queue_end k_abort = {"abort", ifd_queue_abort, IFD_ESTOPPED};

/* Random pops blocked on an empty queue all return e->rc when e ends the queue. */
static void check_end_wakes_blocked_pops(const queue_end *e)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_queue *q = tu_queue_make((size_t)rand_between(&rng, 1, 8));
    int n = (int)rand_between(&rng, 1, 6);
    tu_op c[6];
    tu_ops_start_blocked(c, n, q, 0, 0);
    e->end(q);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "pop after %s", e->name);
        tu_op_join_woken(&c[i], what);
        RASSERT(c[i].rc == e->rc, "blocked pop %d after %s gave %s", i, e->name,
                ifd_errname(c[i].rc));
    }
    ck_assert_int_eq(ifd_queue_is_closed(q), 1);
    ifd_queue_destroy(q);
}

START_TEST(test_close_wakes_blocked_pop)
{
    check_end_wakes_blocked_pops(&k_close);
}
END_TEST

/* A consumer that pops until the end sees every item pushed before close, in order, then
 * IFD_ECLOSED. Items are pushed while it is blocked. */
typedef struct drainer {
    pthread_t t;
    ifd_queue *q;
    uint64_t tags[64];
    int n;
    int last_rc;
    atomic_int tid;
    atomic_int done;
} drainer;

static void *drainer_main(void *arg)
{
    drainer *d = arg;
    atomic_store(&d->tid, tu_self_tid());
    tu_item it;
    int rc;
    while ((rc = ifd_queue_pop(d->q, &it)) == IFD_OK)
        if (d->n < 64)
            d->tags[d->n++] = tu_item_valid(&it) ? it.tag : UINT64_MAX;
    d->last_rc = rc;
    atomic_store(&d->done, 1);
    return NULL;
}

START_TEST(test_close_delivers_pending)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = tu_queue_make(cap);
    drainer d = {.q = q};
    atomic_init(&d.tid, 0);
    atomic_init(&d.done, 0);
    ck_assert_int_eq(pthread_create(&d.t, NULL, drainer_main, &d), 0);
    tu_wait_blocked(&d.tid, &d.done, "pop on an empty queue");
    int k = (int)rand_between(&rng, 1, (int64_t)cap);
    tu_queue_fill(q, 0, (size_t)k);
    ifd_queue_close(q);
    tu_item it = tu_item_make(999);
    ck_assert_int_eq(ifd_queue_push(q, &it), IFD_ECLOSED);
    ck_assert_int_eq(ifd_queue_push_until(q, &it, ifd_clock_ns() + 1000 * MS), IFD_ECLOSED);
    RASSERT(tu_wait_flag(&d.done, 10000 * MS), "consumer did not end after close");
    pthread_join(d.t, NULL);
    RASSERT(d.last_rc == IFD_ECLOSED, "consumer ended with %s", ifd_errname(d.last_rc));
    RASSERT(d.n == k, "consumer got %d items, %d were pushed before close", d.n, k);
    for (int i = 0; i < k; i++)
        RASSERT(d.tags[i] == (uint64_t)i, "item %d: tag %" PRIu64, i, d.tags[i]);
    /* Still closed and drained. */
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_ECLOSED);
    ck_assert_int_eq(ifd_queue_pop_until(q, &it, ifd_clock_ns() + 1000 * MS), IFD_ECLOSED);
    ifd_queue_destroy(q);
}
END_TEST

/* Closing a queue with items in it: pushes fail, pops drain the rest, then fail. */
START_TEST(test_close_with_items)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 32);
    ifd_queue *q = tu_queue_make(cap);
    size_t k = (size_t)rand_between(&rng, 0, (int64_t)cap);
    tu_queue_fill(q, 10, k);
    ifd_queue_close(q);
    ifd_queue_close(q); /* idempotent */
    ck_assert_int_eq(ifd_queue_is_closed(q), 1);
    tu_item it = tu_item_make(1);
    ck_assert_int_eq(ifd_queue_push(q, &it), IFD_ECLOSED);
    RASSERT(ifd_queue_len(q) == k, "len %zu after close, %zu pushed", ifd_queue_len(q), k);
    for (size_t i = 0; i < k; i++) {
        RASSERT(ifd_queue_pop(q, &it) == IFD_OK, "pop %zu of %zu after close failed", i, k);
        RASSERT(it.tag == 10 + i, "tag %" PRIu64 ", expected %zu", it.tag, 10 + i);
    }
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_ECLOSED);
    ifd_queue_destroy(q);
}
END_TEST

/* A producer blocked on a full queue fails with IFD_ECLOSED at close; what was inside is still
 * delivered. */
START_TEST(test_close_wakes_blocked_push)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = tu_queue_make(cap);
    tu_queue_fill(q, 0, cap);
    tu_op p;
    tu_op_start_blocked(&p, q, 1, 777);
    ifd_queue_close(q);
    tu_op_join_woken(&p, "push after close");
    RASSERT(p.rc == IFD_ECLOSED, "blocked push after close gave %s", ifd_errname(p.rc));
    tu_item it;
    for (size_t i = 0; i < cap; i++) {
        ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
        ck_assert_uint_eq(it.tag, i);
    }
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_ECLOSED);
    ifd_queue_destroy(q);
}
END_TEST

/* ---- abort -------------------------------------------------------------------------------- */

START_TEST(test_abort_wakes_blocked_pop)
{
    check_end_wakes_blocked_pops(&k_abort);
}
END_TEST

static void collect_tag(void *p, void *arg)
{
    tu_item it;
    memcpy(&it, p, sizeof it);
    uint64_t **cursor = arg;
    **cursor = tu_item_valid(&it) ? it.tag : UINT64_MAX;
    (*cursor)++;
}

START_TEST(test_abort_wakes_blocked_push_and_drain)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = tu_queue_make(cap);
    tu_queue_fill(q, 50, cap);
    int n = (int)rand_between(&rng, 1, 4);
    tu_op p[4];
    tu_ops_start_blocked(p, n, q, 1, 1000);
    ifd_queue_abort(q);
    for (int i = 0; i < n; i++) {
        tu_op_join_woken(&p[i], "push after abort");
        RASSERT(p[i].rc == IFD_ESTOPPED, "blocked push %d after abort gave %s", i,
                ifd_errname(p[i].rc));
    }
    /* Aborted: pops fail at once even with items inside, and so do pushes. */
    tu_item it = tu_item_make(1);
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_ESTOPPED);
    ck_assert_int_eq(ifd_queue_pop_until(q, &it, ifd_clock_ns() + 1000 * MS), IFD_ESTOPPED);
    ck_assert_int_eq(ifd_queue_push(q, &it), IFD_ESTOPPED);
    ck_assert_int_eq(ifd_queue_push_until(q, &it, 0), IFD_ESTOPPED);
    RASSERT(ifd_queue_len(q) == cap, "len %zu after abort, expected %zu", ifd_queue_len(q), cap);

    /* drain gives back exactly the items left, in order. */
    uint64_t tags[8];
    uint64_t *cursor = tags;
    size_t got = ifd_queue_drain(q, collect_tag, &cursor);
    RASSERT(got == cap, "drain returned %zu, %zu items were left", got, cap);
    RASSERT((size_t)(cursor - tags) == cap, "drain called fn %td times", cursor - tags);
    for (size_t i = 0; i < cap; i++)
        RASSERT(tags[i] == 50 + i, "drained item %zu: tag %" PRIu64, i, tags[i]);
    ck_assert_uint_eq(ifd_queue_len(q), 0);
    ck_assert_uint_eq(ifd_queue_drain(q, collect_tag, &cursor), 0);
    ifd_queue_abort(q); /* idempotent */
    ifd_queue_destroy(q);
}
END_TEST

/* Abort after close still turns every pop into IFD_ESTOPPED, with items left; drain works in any
 * state, with a NULL fn, and with items larger than its stack buffer. */
START_TEST(test_abort_after_close_and_drain_any_state)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 2, 16);
    ifd_queue *q = tu_queue_make(cap);
    size_t k = (size_t)rand_between(&rng, 1, (int64_t)cap);
    tu_queue_fill(q, 0, k);
    ifd_queue_close(q);
    ifd_queue_abort(q);
    tu_item it;
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_ESTOPPED);
    RASSERT(ifd_queue_drain(q, NULL, NULL) == k, "drain(NULL fn) did not count %zu items", k);
    ifd_queue_destroy(q);

    /* Open queue, no abort. */
    q = tu_queue_make(cap);
    tu_queue_fill(q, 0, k);
    uint64_t tags[16];
    uint64_t *cursor = tags;
    ck_assert_uint_eq(ifd_queue_drain(q, collect_tag, &cursor), k);
    for (size_t i = 0; i < k; i++)
        ck_assert_uint_eq(tags[i], i);
    /* Still usable afterwards. */
    tu_queue_fill(q, 100, cap);
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    ck_assert_uint_eq(it.tag, 100);
    ifd_queue_destroy(q);

    /* Large items. */
    size_t sz = (size_t)rand_between(&rng, 257, 2000);
    ck_assert_int_eq(ifd_queue_create(&q, sz, cap), IFD_OK);
    unsigned char *buf = malloc(sz);
    for (size_t i = 0; i < k; i++) {
        memset(buf, (int)i + 1, sz);
        ck_assert_int_eq(ifd_queue_push(q, buf), IFD_OK);
    }
    ifd_queue_abort(q);
    RASSERT(ifd_queue_drain(q, NULL, NULL) == k, "drain of %zu-byte items", sz);
    free(buf);
    ifd_queue_destroy(q);
}
END_TEST

/* ---- timeouts ----------------------------------------------------------------------------- */

START_TEST(test_pop_until_times_out)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_queue *q = tu_queue_make((size_t)rand_between(&rng, 1, 8));
    tu_item it;
    for (int i = 0; i < 3; i++) {
        int64_t wait = rand_between(&rng, 10, 60) * MS;
        int64_t t0 = ifd_clock_ns(), deadline = t0 + wait;
        int rc = ifd_queue_pop_until(q, &it, deadline);
        int64_t back = ifd_clock_ns();
        RASSERT(rc == IFD_ETIMEDOUT, "pop_until on an empty queue gave %s", ifd_errname(rc));
        /* The order of the events: the deadline passed, then the pop returned. */
        RASSERT(back >= deadline, "pop_until timed out %" PRId64 " ns before its deadline",
                deadline - back);
        RASSERT(back - t0 < wait + 5000 * MS,
                "pop_until took %" PRId64 " ns for a %" PRId64 " deadline", back - t0, wait);
    }
    /* Deadlines in the past do not block. */
    int64_t past[3] = {0, -1, ifd_clock_ns() - 1};
    for (int i = 0; i < 3; i++) {
        int64_t t0 = ifd_clock_ns();
        int rc = ifd_queue_pop_until(q, &it, past[i]);
        RASSERT(rc == IFD_ETIMEDOUT, "pop_until(%" PRId64 ") gave %s", past[i], ifd_errname(rc));
        RASSERT(ifd_clock_ns() - t0 < 1000 * MS, "pop_until with a past deadline blocked");
    }
    /* With an item there, a past deadline still pops. */
    tu_queue_fill(q, 5, 1);
    ck_assert_int_eq(ifd_queue_pop_until(q, &it, 0), IFD_OK);
    ck_assert_uint_eq(it.tag, 5);
    ifd_queue_destroy(q);
}
END_TEST

START_TEST(test_push_until_times_out)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = tu_queue_make(cap);
    tu_queue_fill(q, 0, cap);
    tu_item it = tu_item_make(99);
    for (int i = 0; i < 3; i++) {
        int64_t wait = rand_between(&rng, 10, 60) * MS;
        int64_t t0 = ifd_clock_ns(), deadline = t0 + wait;
        int rc = ifd_queue_push_until(q, &it, deadline);
        int64_t back = ifd_clock_ns();
        RASSERT(rc == IFD_ETIMEDOUT, "push_until on a full queue gave %s", ifd_errname(rc));
        RASSERT(back >= deadline, "push_until timed out %" PRId64 " ns before its deadline",
                deadline - back);
        RASSERT(back - t0 < wait + 5000 * MS, "push_until took too long");
    }
    int64_t past[3] = {0, -5, ifd_clock_ns() - 1};
    for (int i = 0; i < 3; i++) {
        int64_t t0 = ifd_clock_ns();
        int rc = ifd_queue_push_until(q, &it, past[i]);
        RASSERT(rc == IFD_ETIMEDOUT, "push_until(%" PRId64 ") gave %s", past[i], ifd_errname(rc));
        RASSERT(ifd_clock_ns() - t0 < 1000 * MS, "push_until with a past deadline blocked");
    }
    RASSERT(ifd_queue_len(q) == cap, "timed-out pushes changed len to %zu (cap %zu)",
            ifd_queue_len(q), cap);
    /* Nothing timed out went in: the items are the original ones. */
    tu_item out;
    for (size_t i = 0; i < cap; i++) {
        ck_assert_int_eq(ifd_queue_pop(q, &out), IFD_OK);
        ck_assert_uint_eq(out.tag, i);
    }
    ck_assert_int_eq(ifd_queue_push_until(q, &it, 0), IFD_OK);
    ifd_queue_destroy(q);
}
END_TEST

/* A timed pop or push is woken before its deadline like the blocking one, and close/abort beat
 * the timeout. */
START_TEST(test_until_woken_before_deadline)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = tu_queue_make(cap);

    tu_op c;
    tu_op_start(&c, q, 0, 0, ifd_clock_ns() + 20000 * MS);
    tu_op_wait_blocked(&c, "pop_until on an empty queue");
    tu_queue_fill(q, 31, 1);
    tu_op_join_woken(&c, "pop_until");
    ck_assert_int_eq(c.rc, IFD_OK);
    ck_assert_uint_eq(c.it.tag, 31);

    tu_queue_fill(q, 0, cap);
    tu_op p;
    tu_op_start(&p, q, 1, 77, ifd_clock_ns() + 20000 * MS);
    tu_op_wait_blocked(&p, "push_until on a full queue");
    tu_item it;
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    tu_op_join_woken(&p, "push_until");
    ck_assert_int_eq(p.rc, IFD_OK);
    ifd_queue_destroy(q);

    /* Close wakes a timed pop with IFD_ECLOSED, abort a timed push with IFD_ESTOPPED. */
    q = tu_queue_make(cap);
    tu_op_start(&c, q, 0, 0, ifd_clock_ns() + 20000 * MS);
    tu_op_wait_blocked(&c, "pop_until on an empty queue");
    ifd_queue_close(q);
    tu_op_join_woken(&c, "pop_until after close");
    RASSERT(c.rc == IFD_ECLOSED, "timed pop after close gave %s", ifd_errname(c.rc));
    ifd_queue_destroy(q);

    q = tu_queue_make(cap);
    tu_queue_fill(q, 0, cap);
    tu_op_start(&p, q, 1, 1, ifd_clock_ns() + 20000 * MS);
    tu_op_wait_blocked(&p, "push_until on a full queue");
    ifd_queue_abort(q);
    tu_op_join_woken(&p, "push_until after abort");
    RASSERT(p.rc == IFD_ESTOPPED, "timed push after abort gave %s", ifd_errname(p.rc));
    ifd_queue_destroy(q);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("queue");
    TCase *tc = tu_tcase(s, "basic", 30);
    tcase_add_test(tc, test_create_invalid);
    tcase_add_test(tc, test_fifo_order);
    tcase_add_test(tc, test_item_sizes);
    tc = tu_tcase(s, "blocking", 30);
    tcase_add_test(tc, test_pop_blocks_until_push);
    tcase_add_test(tc, test_push_blocks_until_pop);
    tcase_add_test(tc, test_many_blocked_consumers_woken);
    tc = tu_tcase(s, "close", 30);
    tcase_add_test(tc, test_close_wakes_blocked_pop);
    tcase_add_test(tc, test_close_delivers_pending);
    tcase_add_test(tc, test_close_with_items);
    tcase_add_test(tc, test_close_wakes_blocked_push);
    tc = tu_tcase(s, "abort", 30);
    tcase_add_test(tc, test_abort_wakes_blocked_pop);
    tcase_add_test(tc, test_abort_wakes_blocked_push_and_drain);
    tcase_add_test(tc, test_abort_after_close_and_drain_any_state);
    tc = tu_tcase(s, "timeouts", 30);
    tcase_add_test(tc, test_pop_until_times_out);
    tcase_add_test(tc, test_push_until_times_out);
    tcase_add_test(tc, test_until_woken_before_deadline);
    return tu_run_suite(s);
}
