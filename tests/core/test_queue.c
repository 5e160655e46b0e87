/*
 * Tests of the bounded blocking queue (core/queue.h) and the controller signal queue
 * (core/opqueue.h): blocking and wake-ups, close and abort while threads are blocked, timeouts,
 * FIFO order, many producers and consumers, the hand-off thresholds (ifd_queue_set_wake,
 * ifd_queue_kick), and the signal protocol of a controller thread.
 *
 * Sizes and counts are random. The seed comes from IFD_TEST_SEED when set, else from the clock,
 * and every failure message names it so that a failing run can be repeated.
 */
#include "tests/util/testutil.h"

#include "core/opqueue.h"
#include "core/queue.h"
#include "core/rng.h"
#include "core/thread.h"
#include "infeed/error.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------ */

/* How long a thread must stay stuck to count as blocked. */
#define BLOCK_CHECK_NS (50 * MS)

/* Waits up to timeout_ns for *flag to become nonzero. Returns its value. */
static int wait_flag(atomic_int *flag, int64_t timeout_ns)
{
    int64_t deadline = ifd_clock_ns() + timeout_ns;
    while (!atomic_load(flag) && ifd_clock_ns() < deadline)
        ifd_sleep_ns(MS);
    return atomic_load(flag);
}

/* The kernel's id of the calling thread. */
static int self_tid(void)
{
    return (int)syscall(SYS_gettid);
}

/* The scheduler state of one of our threads ('R', 'S', ...), '?' when /proc cannot tell. */
static char thread_state(int tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* "tid (comm) S ..." */
    return paren && paren[1] == ' ' && paren[2] ? paren[2] : '?';
}

/* Fails unless the thread that publishes its id in *tid gets stuck: it must be seen asleep in the
 * kernel (twice in a row), then still not have returned BLOCK_CHECK_NS later. Waiting for the
 * sleep first means a thread slow to start is not mistaken for a blocked one. */
static void wait_blocked(atomic_int *tid, atomic_int *done, const char *what)
{
    int64_t deadline = ifd_clock_ns() + 10000 * MS;
    for (int seen = 0; seen < 2;) {
        RASSERT(!atomic_load(done), "%s returned instead of blocking", what);
        RASSERT(ifd_clock_ns() < deadline, "%s: never seen blocked within 10 s", what);
        int t = atomic_load(tid);
        char st = t ? thread_state(t) : 'R';
        seen = st == 'S' || st == '?' ? seen + 1 : 0;
        ifd_sleep_ns(MS);
    }
    ifd_sleep_ns(BLOCK_CHECK_NS);
    RASSERT(!atomic_load(done), "%s returned instead of blocking", what);
}

/* An item with a payload, so that copying by value is checked byte for byte. */
typedef struct item {
    uint64_t tag;
    uint64_t check;
    unsigned char pad[13];
} item;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static item make_item(uint64_t tag)
{
    item it;
    memset(&it, 0, sizeof it);
    it.tag = tag;
    it.check = mix(tag);
    for (size_t i = 0; i < sizeof it.pad; i++)
        it.pad[i] = (unsigned char)(tag + i);
    return it;
}

static int item_valid(const item *it)
{
    if (it->check != mix(it->tag))
        return 0;
    for (size_t i = 0; i < sizeof it->pad; i++)
        if (it->pad[i] != (unsigned char)(it->tag + i))
            return 0;
    return 1;
}

/* A thread that does one push or pop, then raises done. */
typedef struct op_thread {
    pthread_t t;
    ifd_queue *q;
    item it;
    int64_t deadline_ns; /* < 0: the blocking call, else the _until call */
    int rc;
    atomic_int tid;
    atomic_int done;
} op_thread;

static void *pop_main(void *arg)
{
    op_thread *o = arg;
    atomic_store(&o->tid, self_tid());
    if (o->deadline_ns < 0)
        o->rc = ifd_queue_pop(o->q, &o->it);
    else
        o->rc = ifd_queue_pop_until(o->q, &o->it, o->deadline_ns);
    atomic_store(&o->done, 1);
    return NULL;
}

static void *push_main(void *arg)
{
    op_thread *o = arg;
    atomic_store(&o->tid, self_tid());
    if (o->deadline_ns < 0)
        o->rc = ifd_queue_push(o->q, &o->it);
    else
        o->rc = ifd_queue_push_until(o->q, &o->it, o->deadline_ns);
    atomic_store(&o->done, 1);
    return NULL;
}

static void op_start(op_thread *o, ifd_queue *q, int push, uint64_t tag, int64_t deadline_ns)
{
    memset(o, 0, sizeof *o);
    o->q = q;
    o->it = make_item(tag);
    o->deadline_ns = deadline_ns;
    o->rc = -1;
    atomic_init(&o->tid, 0);
    atomic_init(&o->done, 0);
    ck_assert_int_eq(pthread_create(&o->t, NULL, push ? push_main : pop_main, o), 0);
}

static void op_wait_blocked(op_thread *o, const char *what)
{
    wait_blocked(&o->tid, &o->done, what);
}

/* Starts a push or pop that must block (see wait_blocked). */
static void op_start_blocked(op_thread *o, ifd_queue *q, int push, uint64_t tag)
{
    op_start(o, q, push, tag, -1);
    op_wait_blocked(o, push ? "push" : "pop");
}

/* Waits (bounded) for the thread to finish after it was woken, then joins it. */
static void op_join_woken(op_thread *o, const char *what)
{
    RASSERT(wait_flag(&o->done, 10000 * MS), "%s: blocked thread was not woken within 10 s", what);
    pthread_join(o->t, NULL);
}

static ifd_queue *make_queue(size_t capacity)
{
    ifd_queue *q = NULL;
    ck_assert_int_eq(ifd_queue_create(&q, sizeof(item), capacity), IFD_OK);
    ck_assert_ptr_nonnull(q);
    return q;
}

/* Pushes tags first..first+n-1 without blocking. */
static void fill(ifd_queue *q, uint64_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        item it = make_item(first + i);
        RASSERT(ifd_queue_push_until(q, &it, 0) == IFD_OK, "fill: push %zu of %zu failed", i, n);
    }
}

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
    q = make_queue(cap);
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
        ifd_queue *q = make_queue(cap);
        uint64_t next_in = 0, next_out = 0;
        int ops = (int)rand_between(&rng, 50, 2000);
        for (int i = 0; i < ops; i++) {
            size_t len = (size_t)(next_in - next_out);
            RASSERT(ifd_queue_len(q) == len, "round %d op %d: len %zu, expected %zu", round, i,
                    ifd_queue_len(q), len);
            int push = ifd_rng_below(&rng, 2) == 0;
            item it = make_item(next_in);
            if (push && len < cap) {
                RASSERT(ifd_queue_push(q, &it) == IFD_OK, "push failed");
                next_in++;
            } else if (push) {
                int rc = ifd_queue_push_until(q, &it, 0);
                RASSERT(rc == IFD_ETIMEDOUT, "push on a full queue (cap %zu) gave %s", cap,
                        ifd_errname(rc));
            } else if (len > 0) {
                RASSERT(ifd_queue_pop(q, &it) == IFD_OK, "pop failed");
                RASSERT(it.tag == next_out && item_valid(&it),
                        "round %d: popped tag %" PRIu64 ", expected %" PRIu64, round, it.tag,
                        next_out);
                next_out++;
            } else {
                int rc = ifd_queue_pop_until(q, &it, 0);
                RASSERT(rc == IFD_ETIMEDOUT, "pop on an empty queue gave %s", ifd_errname(rc));
            }
        }
        /* The rest, in order. */
        item it;
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
    ifd_queue *q = make_queue((size_t)rand_between(&rng, 1, 8));
    op_thread c;
    op_start_blocked(&c, q, 0, 0);
    item it = make_item(4242);
    ck_assert_int_eq(ifd_queue_push(q, &it), IFD_OK);
    op_join_woken(&c, "pop");
    ck_assert_int_eq(c.rc, IFD_OK);
    ck_assert_uint_eq(c.it.tag, 4242);
    ck_assert(item_valid(&c.it));
    ck_assert_uint_eq(ifd_queue_len(q), 0);
    ifd_queue_destroy(q);
}
END_TEST

START_TEST(test_push_blocks_until_pop)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = make_queue(cap);
    fill(q, 0, cap);
    op_thread p;
    op_start_blocked(&p, q, 1, cap);
    RASSERT(ifd_queue_len(q) == cap, "len %zu while a push is blocked, capacity %zu",
            ifd_queue_len(q), cap);
    item it;
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    ck_assert_uint_eq(it.tag, 0);
    op_join_woken(&p, "push");
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
    ifd_queue *q = make_queue((size_t)rand_between(&rng, 1, 8));
    op_thread c[6];
    for (int i = 0; i < n; i++)
        op_start(&c[i], q, 0, 0, -1);
    for (int i = 0; i < n; i++)
        op_wait_blocked(&c[i], "pop on an empty queue");
    for (int i = 0; i < n; i++) {
        item it = make_item(100 + (uint64_t)i);
        ck_assert_int_eq(ifd_queue_push(q, &it), IFD_OK);
    }
    int seen[6] = {0};
    for (int i = 0; i < n; i++) {
        op_join_woken(&c[i], "pop");
        RASSERT(c[i].rc == IFD_OK, "consumer %d: %s", i, ifd_errname(c[i].rc));
        int k = (int)(c[i].it.tag - 100);
        RASSERT(k >= 0 && k < n && item_valid(&c[i].it), "consumer %d got tag %" PRIu64, i,
                c[i].it.tag);
        seen[k]++;
    }
    for (int i = 0; i < n; i++)
        RASSERT(seen[i] == 1, "item %d taken %d times", i, seen[i]);
    ifd_queue_destroy(q);
}
END_TEST

/* ---- close -------------------------------------------------------------------------------- */

START_TEST(test_close_wakes_blocked_pop)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_queue *q = make_queue((size_t)rand_between(&rng, 1, 8));
    int n = (int)rand_between(&rng, 1, 6);
    op_thread c[6];
    for (int i = 0; i < n; i++)
        op_start(&c[i], q, 0, 0, -1);
    for (int i = 0; i < n; i++)
        op_wait_blocked(&c[i], "pop on an empty queue");
    ifd_queue_close(q);
    for (int i = 0; i < n; i++) {
        op_join_woken(&c[i], "pop after close");
        RASSERT(c[i].rc == IFD_ECLOSED, "blocked pop %d after close gave %s", i,
                ifd_errname(c[i].rc));
    }
    ck_assert_int_eq(ifd_queue_is_closed(q), 1);
    ifd_queue_destroy(q);
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
    atomic_store(&d->tid, self_tid());
    item it;
    int rc;
    while ((rc = ifd_queue_pop(d->q, &it)) == IFD_OK)
        if (d->n < 64)
            d->tags[d->n++] = item_valid(&it) ? it.tag : UINT64_MAX;
    d->last_rc = rc;
    atomic_store(&d->done, 1);
    return NULL;
}

START_TEST(test_close_delivers_pending)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = make_queue(cap);
    drainer d = {.q = q};
    atomic_init(&d.tid, 0);
    atomic_init(&d.done, 0);
    ck_assert_int_eq(pthread_create(&d.t, NULL, drainer_main, &d), 0);
    wait_blocked(&d.tid, &d.done, "pop on an empty queue");
    int k = (int)rand_between(&rng, 1, (int64_t)cap);
    fill(q, 0, (size_t)k);
    ifd_queue_close(q);
    item it = make_item(999);
    ck_assert_int_eq(ifd_queue_push(q, &it), IFD_ECLOSED);
    ck_assert_int_eq(ifd_queue_push_until(q, &it, ifd_clock_ns() + 1000 * MS), IFD_ECLOSED);
    RASSERT(wait_flag(&d.done, 10000 * MS), "consumer did not end after close");
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
    ifd_queue *q = make_queue(cap);
    size_t k = (size_t)rand_between(&rng, 0, (int64_t)cap);
    fill(q, 10, k);
    ifd_queue_close(q);
    ifd_queue_close(q); /* idempotent */
    ck_assert_int_eq(ifd_queue_is_closed(q), 1);
    item it = make_item(1);
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
    ifd_queue *q = make_queue(cap);
    fill(q, 0, cap);
    op_thread p;
    op_start_blocked(&p, q, 1, 777);
    ifd_queue_close(q);
    op_join_woken(&p, "push after close");
    RASSERT(p.rc == IFD_ECLOSED, "blocked push after close gave %s", ifd_errname(p.rc));
    item it;
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
    ifd_rng rng;
    seed_rng(&rng);
    ifd_queue *q = make_queue((size_t)rand_between(&rng, 1, 8));
    int n = (int)rand_between(&rng, 1, 6);
    op_thread c[6];
    for (int i = 0; i < n; i++)
        op_start(&c[i], q, 0, 0, -1);
    for (int i = 0; i < n; i++)
        op_wait_blocked(&c[i], "pop on an empty queue");
    ifd_queue_abort(q);
    for (int i = 0; i < n; i++) {
        op_join_woken(&c[i], "pop after abort");
        RASSERT(c[i].rc == IFD_ESTOPPED, "blocked pop %d after abort gave %s", i,
                ifd_errname(c[i].rc));
    }
    ck_assert_int_eq(ifd_queue_is_closed(q), 1);
    ifd_queue_destroy(q);
}
END_TEST

static void collect_tag(void *p, void *arg)
{
    item it;
    memcpy(&it, p, sizeof it);
    uint64_t **cursor = arg;
    **cursor = item_valid(&it) ? it.tag : UINT64_MAX;
    (*cursor)++;
}

START_TEST(test_abort_wakes_blocked_push_and_drain)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 8);
    ifd_queue *q = make_queue(cap);
    fill(q, 50, cap);
    int n = (int)rand_between(&rng, 1, 4);
    op_thread p[4];
    for (int i = 0; i < n; i++)
        op_start(&p[i], q, 1, 1000 + (uint64_t)i, -1);
    for (int i = 0; i < n; i++)
        op_wait_blocked(&p[i], "push on a full queue");
    ifd_queue_abort(q);
    for (int i = 0; i < n; i++) {
        op_join_woken(&p[i], "push after abort");
        RASSERT(p[i].rc == IFD_ESTOPPED, "blocked push %d after abort gave %s", i,
                ifd_errname(p[i].rc));
    }
    /* Aborted: pops fail at once even with items inside, and so do pushes. */
    item it = make_item(1);
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
    ifd_queue *q = make_queue(cap);
    size_t k = (size_t)rand_between(&rng, 1, (int64_t)cap);
    fill(q, 0, k);
    ifd_queue_close(q);
    ifd_queue_abort(q);
    item it;
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_ESTOPPED);
    RASSERT(ifd_queue_drain(q, NULL, NULL) == k, "drain(NULL fn) did not count %zu items", k);
    ifd_queue_destroy(q);

    /* Open queue, no abort. */
    q = make_queue(cap);
    fill(q, 0, k);
    uint64_t tags[16];
    uint64_t *cursor = tags;
    ck_assert_uint_eq(ifd_queue_drain(q, collect_tag, &cursor), k);
    for (size_t i = 0; i < k; i++)
        ck_assert_uint_eq(tags[i], i);
    /* Still usable afterwards. */
    fill(q, 100, cap);
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
    ifd_queue *q = make_queue((size_t)rand_between(&rng, 1, 8));
    item it;
    for (int i = 0; i < 3; i++) {
        int64_t wait = rand_between(&rng, 10, 60) * MS;
        int64_t t0 = ifd_clock_ns();
        int rc = ifd_queue_pop_until(q, &it, t0 + wait);
        int64_t el = ifd_clock_ns() - t0;
        RASSERT(rc == IFD_ETIMEDOUT, "pop_until on an empty queue gave %s", ifd_errname(rc));
        RASSERT(el >= wait, "pop_until returned after %" PRId64 " ns, deadline was %" PRId64, el,
                wait);
        RASSERT(el < wait + 5000 * MS, "pop_until took %" PRId64 " ns for a %" PRId64 " deadline",
                el, wait);
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
    fill(q, 5, 1);
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
    ifd_queue *q = make_queue(cap);
    fill(q, 0, cap);
    item it = make_item(99);
    for (int i = 0; i < 3; i++) {
        int64_t wait = rand_between(&rng, 10, 60) * MS;
        int64_t t0 = ifd_clock_ns();
        int rc = ifd_queue_push_until(q, &it, t0 + wait);
        int64_t el = ifd_clock_ns() - t0;
        RASSERT(rc == IFD_ETIMEDOUT, "push_until on a full queue gave %s", ifd_errname(rc));
        RASSERT(el >= wait, "push_until returned after %" PRId64 " ns, deadline was %" PRId64, el,
                wait);
        RASSERT(el < wait + 5000 * MS, "push_until took too long");
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
    item out;
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
    ifd_queue *q = make_queue(cap);

    op_thread c;
    op_start(&c, q, 0, 0, ifd_clock_ns() + 20000 * MS);
    op_wait_blocked(&c, "pop_until on an empty queue");
    fill(q, 31, 1);
    op_join_woken(&c, "pop_until");
    ck_assert_int_eq(c.rc, IFD_OK);
    ck_assert_uint_eq(c.it.tag, 31);

    fill(q, 0, cap);
    op_thread p;
    op_start(&p, q, 1, 77, ifd_clock_ns() + 20000 * MS);
    op_wait_blocked(&p, "push_until on a full queue");
    item it;
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    op_join_woken(&p, "push_until");
    ck_assert_int_eq(p.rc, IFD_OK);
    ifd_queue_destroy(q);

    /* Close wakes a timed pop with IFD_ECLOSED, abort a timed push with IFD_ESTOPPED. */
    q = make_queue(cap);
    op_start(&c, q, 0, 0, ifd_clock_ns() + 20000 * MS);
    op_wait_blocked(&c, "pop_until on an empty queue");
    ifd_queue_close(q);
    op_join_woken(&c, "pop_until after close");
    RASSERT(c.rc == IFD_ECLOSED, "timed pop after close gave %s", ifd_errname(c.rc));
    ifd_queue_destroy(q);

    q = make_queue(cap);
    fill(q, 0, cap);
    op_start(&p, q, 1, 1, ifd_clock_ns() + 20000 * MS);
    op_wait_blocked(&p, "push_until on a full queue");
    ifd_queue_abort(q);
    op_join_woken(&p, "push_until after abort");
    RASSERT(p.rc == IFD_ESTOPPED, "timed push after abort gave %s", ifd_errname(p.rc));
    ifd_queue_destroy(q);
}
END_TEST

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
        item it = make_item(mp_tag(p->id, s));
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
    item it;
    int rc;
    for (;;) {
        rc = c->timed ? ifd_queue_pop_until(c->sh->q, &it, ifd_clock_ns() + 20000 * MS)
                      : ifd_queue_pop(c->sh->q, &it);
        if (rc != IFD_OK)
            break;
        if (!item_valid(&it))
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
        sh.q = make_queue(sh.cap);
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
    atomic_store(&c->tid, self_tid());
    item it;
    int rc;
    while ((rc = ifd_queue_pop(c->q, &it)) == IFD_OK) {
        int n = atomic_load(&c->n);
        if (n < 64)
            c->tags[n] = item_valid(&it) ? it.tag : UINT64_MAX;
        atomic_store(&c->n, n + 1);
    }
    c->last_rc = rc;
    atomic_store(&c->done, 1);
    return NULL;
}

static void counter_consumer_start(counter_consumer *c, ifd_queue *q)
{
    memset(c, 0, sizeof *c);
    c->q = q;
    atomic_init(&c->n, 0);
    atomic_init(&c->tid, 0);
    atomic_init(&c->done, 0);
    ck_assert_int_eq(pthread_create(&c->t, NULL, counter_consumer_main, c), 0);
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
    ifd_queue *q = make_queue(cap);
    ifd_queue_set_wake(q, wake_len, 1);
    counter_consumer c;
    counter_consumer_start(&c, q);
    wait_blocked(&c.tid, &c.done, "consumer on an empty queue");
    for (size_t i = 0; i + 1 < wake_len; i++) {
        fill(q, i, 1);
        ifd_sleep_ns(BLOCK_CHECK_NS / 2);
        RASSERT(atomic_load(&c.n) == 0,
                "consumer woken at %zu items, wake_len %zu (capacity %zu) took %d", i + 1, wake_len,
                cap, atomic_load(&c.n));
    }
    fill(q, wake_len - 1, 1);
    int got = wait_count(&c, (int)wake_len, 10000 * MS);
    RASSERT(got == (int)wake_len,
            "consumer took %d items after wake_len %zu were in (capacity %zu); a woken consumer "
            "drains what is there",
            got, wake_len, cap);
    ifd_queue_close(q);
    RASSERT(wait_flag(&c.done, 10000 * MS), "consumer did not end at close");
    pthread_join(c.t, NULL);
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
    ifd_queue *q = make_queue(cap);
    ifd_queue_set_wake(q, wake_len, 1);
    counter_consumer c;
    counter_consumer_start(&c, q);
    wait_blocked(&c.tid, &c.done, "consumer on an empty queue");

    ifd_queue_kick(q); /* empty: nothing to hand over, and no lasting effect */
    size_t k = (size_t)rand_between(&rng, 1, (int64_t)wake_len - 1);
    fill(q, 0, k);
    ifd_sleep_ns(BLOCK_CHECK_NS);
    RASSERT(atomic_load(&c.n) == 0, "consumer woken by %zu items below wake_len %zu", k, wake_len);
    ifd_queue_kick(q);
    int got = wait_count(&c, (int)k, 10000 * MS);
    RASSERT(got == (int)k, "after kick the consumer took %d of %zu items (wake_len %zu)", got, k,
            wake_len);

    /* Empty again: one item waits for wake_len (or a kick, or close). */
    wait_blocked(&c.tid, &c.done, "consumer on an emptied queue");
    fill(q, k, 1);
    ifd_sleep_ns(BLOCK_CHECK_NS);
    RASSERT(atomic_load(&c.n) == (int)k, "a kick lasted past the queue emptying (wake_len %zu)",
            wake_len);
    ifd_queue_close(q);
    RASSERT(wait_flag(&c.done, 10000 * MS), "consumer did not end at close");
    pthread_join(c.t, NULL);
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
    ifd_queue *q = make_queue(cap);
    ifd_queue_set_wake(q, cap, 1);
    fill(q, 0, 1);
    item it;
    int64_t t0 = ifd_clock_ns();
    ck_assert_int_eq(ifd_queue_pop_until(q, &it, ifd_clock_ns() + 10000 * MS), IFD_OK);
    RASSERT(ifd_clock_ns() - t0 < 1000 * MS, "a pop with an item there waited for wake_len");
    ck_assert_uint_eq(it.tag, 0);

    /* A timed pop below wake_len does not time out empty-handed when an item is there. */
    fill(q, 1, 1);
    ck_assert_int_eq(ifd_queue_pop_until(q, &it, 0), IFD_OK);

    counter_consumer c;
    counter_consumer_start(&c, q);
    wait_blocked(&c.tid, &c.done, "consumer on an empty queue");
    fill(q, 2, 1); /* one item, below wake_len (cap >= 2) */
    ifd_sleep_ns(BLOCK_CHECK_NS);
    RASSERT(atomic_load(&c.n) == 0, "consumer woken below wake_len %zu", cap);
    ifd_queue_abort(q);
    RASSERT(wait_flag(&c.done, 10000 * MS), "abort did not wake a consumer below wake_len");
    pthread_join(c.t, NULL);
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
    ifd_queue *q = make_queue(cap);
    ifd_queue_set_wake(q, cap, 1);
    int64_t wait = rand_between(&rng, 150, 250) * MS;
    int64_t t0 = ifd_clock_ns();
    op_thread c;
    op_start(&c, q, 0, 0, t0 + wait);
    op_wait_blocked(&c, "pop_until on an empty queue");
    fill(q, 7, 1);
    op_join_woken(&c, "pop_until below wake_len");
    int64_t el = ifd_clock_ns() - t0;
    RASSERT(c.rc == IFD_OK && c.it.tag == 7,
            "pop_until with an item below wake_len %zu at its deadline gave %s", cap,
            ifd_errname(c.rc));
    RASSERT(el >= wait, "pop_until took the item below wake_len %zu before its deadline", cap);
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
    ifd_queue *q = make_queue(cap);
    ifd_queue_set_wake(q, 1, wake_free);
    fill(q, 0, cap);
    op_thread p;
    op_start_blocked(&p, q, 1, cap);
    item it;
    for (size_t i = 0; i + 1 < wake_free; i++) {
        ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
        ck_assert_uint_eq(it.tag, i);
        ifd_sleep_ns(BLOCK_CHECK_NS / 2);
        RASSERT(!atomic_load(&p.done), "producer woken at %zu free slots, wake_free %zu (cap %zu)",
                i + 1, wake_free, cap);
    }
    ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    op_join_woken(&p, "push at wake_free");
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
    ifd_queue *q = make_queue(cap);
    ifd_queue_set_wake(q, 1000, 1000);
    counter_consumer c;
    counter_consumer_start(&c, q);
    wait_blocked(&c.tid, &c.done, "consumer on an empty queue");
    fill(q, 0, cap);
    RASSERT(wait_count(&c, (int)cap, 10000 * MS) == (int)cap,
            "wake_len 1000 was not clamped to capacity %zu", cap);
    ifd_queue_close(q);
    RASSERT(wait_flag(&c.done, 10000 * MS), "consumer did not end");
    pthread_join(c.t, NULL);
    ifd_queue_destroy(q);

    q = make_queue(cap);
    ifd_queue_set_wake(q, 1000, 1000);
    fill(q, 0, cap);
    op_thread p;
    op_start_blocked(&p, q, 1, cap);
    item it;
    for (size_t i = 0; i < cap; i++)
        ck_assert_int_eq(ifd_queue_pop(q, &it), IFD_OK);
    op_join_woken(&p, "push with wake_free 1000");
    ck_assert_int_eq(p.rc, IFD_OK);
    ifd_queue_destroy(q);

    q = make_queue(cap);
    ifd_queue_set_wake(q, 0, 0);
    counter_consumer_start(&c, q);
    wait_blocked(&c.tid, &c.done, "consumer on an empty queue");
    fill(q, 0, 1);
    RASSERT(wait_count(&c, 1, 10000 * MS) == 1, "wake_len 0 was not clamped to 1");
    ifd_queue_close(q);
    RASSERT(wait_flag(&c.done, 10000 * MS), "consumer did not end");
    pthread_join(c.t, NULL);
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
        item it = make_item(mp_tag(p->id, s));
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
        sh.q = make_queue(cap);
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
} opq_rec;

static void opq_rec_init(opq_rec *r, int return_after)
{
    memset(r, 0, sizeof *r);
    atomic_init(&r->n, 0);
    atomic_init(&r->ended, 0);
    atomic_init(&r->name_taken, 0);
    r->return_after = return_after;
    r->next_after_stop = -1;
}

static void opq_body(ifd_opq *q, void *arg)
{
    opq_rec *r = arg;
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
    ifd_sleep_ns(BLOCK_CHECK_NS);
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
    ifd_sleep_ns(BLOCK_CHECK_NS);
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
        RASSERT(wait_flag(&e.done, 10000 * MS),
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
    ifd_sleep_ns(BLOCK_CHECK_NS);
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
        ifd_sleep_ns(BLOCK_CHECK_NS);
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

/* ---- main --------------------------------------------------------------------------------- */

static TCase *tcase(Suite *s, const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);
    return tc;
}

int main(void)
{
    Suite *s = suite_create("queue");

    TCase *tc = tcase(s, "basic");
    tcase_add_test(tc, test_create_invalid);
    tcase_add_test(tc, test_fifo_order);
    tcase_add_test(tc, test_item_sizes);

    tc = tcase(s, "blocking");
    tcase_add_test(tc, test_pop_blocks_until_push);
    tcase_add_test(tc, test_push_blocks_until_pop);
    tcase_add_test(tc, test_many_blocked_consumers_woken);

    tc = tcase(s, "close");
    tcase_add_test(tc, test_close_wakes_blocked_pop);
    tcase_add_test(tc, test_close_delivers_pending);
    tcase_add_test(tc, test_close_with_items);
    tcase_add_test(tc, test_close_wakes_blocked_push);

    tc = tcase(s, "abort");
    tcase_add_test(tc, test_abort_wakes_blocked_pop);
    tcase_add_test(tc, test_abort_wakes_blocked_push_and_drain);
    tcase_add_test(tc, test_abort_after_close_and_drain_any_state);

    tc = tcase(s, "timeouts");
    tcase_add_test(tc, test_pop_until_times_out);
    tcase_add_test(tc, test_push_until_times_out);
    tcase_add_test(tc, test_until_woken_before_deadline);

    tc = tcase(s, "concurrency");
    tcase_add_test(tc, test_many_producers_many_consumers);

    tc = tcase(s, "wake");
    tcase_add_test(tc, test_wake_len_batches_consumer);
    tcase_add_test(tc, test_kick_and_close_hand_over_below_wake_len);
    tcase_add_test(tc, test_wake_len_does_not_delay_ready_pops);
    tcase_add_test(tc, test_timed_pop_below_wake_len_at_deadline);
    tcase_add_test(tc, test_wake_free_batches_producer);
    tcase_add_test(tc, test_set_wake_clamps);
    tcase_add_test(tc, test_wake_thresholds_many_threads);

    tc = tcase(s, "opqueue");
    tcase_add_test(tc, test_opq_signals_in_order);
    tcase_add_test(tc, test_opq_join_without_signals);
    tcase_add_test(tc, test_opq_signal_rejects_nonpositive);
    tcase_add_test(tc, test_opq_body_returns_early);
    tcase_add_test(tc, test_opq_signal_once);
    tcase_add_test(tc, test_opq_body_waits_for_signal);

    return tu_run_suite(s);
}
