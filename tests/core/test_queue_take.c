/*
 * Pops in bursts (ifd_queue_take, core/queue.h): the items come in order, every item once, and
 * the slots of the items a take handed out after its first stay full for the producers until the
 * consumer's next take (or a drain), so the queue plus the consumer's unbegun items never exceed
 * the capacity.
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

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* How many non-blocking pushes succeed now (tags from *next on). */
static size_t push_while_free(ifd_queue *q, uint64_t *next)
{
    size_t n = 0;
    for (;;) {
        tu_item it = tu_item_make(*next);
        int rc = ifd_queue_push_until(q, &it, 0);
        if (rc == IFD_ETIMEDOUT)
            return n;
        ck_assert_int_eq(rc, IFD_OK);
        (*next)++;
        n++;
    }
}

/* One thread: each take hands out min(max, len) items in order and frees exactly the slots the
 * previous take held; the pushes that then fit are exactly cap - len - (taken - 1). */
START_TEST(test_take_holds_slots_until_next_take)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 20; round++) {
        size_t cap = (size_t)rand_between(&rng, 1, 12);
        ifd_queue *q = tu_queue_make(cap);
        uint64_t next = 0, want = 0;
        tu_queue_fill(q, 0, cap);
        next = cap;
        tu_item items[16];
        for (int t = 0; t < 8; t++) {
            size_t max = (size_t)rand_between(&rng, 1, 14), n = 0;
            size_t len = ifd_queue_len(q);
            ck_assert_int_eq(ifd_queue_take_until(q, items, max, &n, 0), IFD_OK);
            size_t expect = max < len ? max : len;
            RASSERT(n == expect, "cap %zu: take of %zu from %zu items gave %zu", cap, max, len, n);
            for (size_t i = 0; i < n; i++) {
                RASSERT(tu_item_valid(&items[i]), "item %zu corrupt", i);
                RASSERT(items[i].tag == want, "cap %zu take %d: item %zu is %llu, expected %llu",
                        cap, t, i, (unsigned long long)items[i].tag, (unsigned long long)want);
                want++;
            }
            RASSERT(ifd_queue_len(q) == len - n, "len %zu after taking %zu of %zu",
                    ifd_queue_len(q), n, len);
            size_t fit = push_while_free(q, &next);
            RASSERT(fit == cap - (len - n) - (n - 1),
                    "cap %zu: %zu pushes fit after a take of %zu from %zu items, expected %zu", cap,
                    fit, n, len, cap - (len - n) - (n - 1));
        }
        ifd_queue_destroy(q);
    }
}
END_TEST

/* A drain frees the held slots; an abort is seen by is_aborted and fails the next take. */
START_TEST(test_take_drain_and_abort)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 2, 12);
    size_t max = (size_t)rand_between(&rng, 2, (int64_t)cap);
    ifd_queue *q = tu_queue_make(cap);
    tu_queue_fill(q, 0, cap);
    tu_item items[12];
    size_t n;
    ck_assert_int_eq(ifd_queue_take(q, items, max, &n), IFD_OK);
    ck_assert_uint_eq(n, max);
    ck_assert_uint_eq(ifd_queue_drain(q, NULL, NULL), cap - max);
    uint64_t next = cap;
    RASSERT(push_while_free(q, &next) == cap, "cap %zu: a drain left held slots (take %zu)", cap,
            max);
    ck_assert(!ifd_queue_is_aborted(q));
    ck_assert_int_eq(ifd_queue_take(q, items, max, &n), IFD_OK);
    ifd_queue_abort(q);
    ck_assert(ifd_queue_is_aborted(q));
    ck_assert_int_eq(ifd_queue_take(q, items, max, &n), IFD_ESTOPPED);
    ck_assert_uint_eq(n, 0);
    ifd_queue_destroy(q);
}
END_TEST

/* Closed with items: takes hand out what is left, then IFD_ECLOSED. */
START_TEST(test_take_after_close)
{
    ifd_rng rng;
    seed_rng(&rng);
    size_t cap = (size_t)rand_between(&rng, 1, 12), fill = (size_t)rand_between(&rng, 0, 12);
    fill = fill > cap ? cap : fill;
    ifd_queue *q = tu_queue_make(cap);
    tu_queue_fill(q, 0, fill);
    ifd_queue_close(q);
    tu_item items[12];
    size_t got = 0, n;
    int rc;
    while ((rc = ifd_queue_take(q, items, (size_t)rand_between(&rng, 1, 12), &n)) == IFD_OK)
        for (size_t i = 0; i < n; i++, got++)
            ck_assert_uint_eq(items[i].tag, got);
    ck_assert_int_eq(rc, IFD_ECLOSED);
    RASSERT(got == fill, "%zu of %zu items taken after close", got, fill);
    ifd_queue_destroy(q);
}
END_TEST

/* ---- producers against one consumer that takes in bursts ------------------------------------ */

#define TK_PRODUCERS 4

typedef struct tk_shared {
    ifd_queue *q;
    size_t cap;
    atomic_int producers_left;
} tk_shared;

typedef struct tk_producer {
    pthread_t t;
    tk_shared *sh;
    uint32_t id, count;
    int rc;
} tk_producer;

static void *tk_producer_main(void *arg)
{
    tk_producer *p = arg;
    p->rc = IFD_OK;
    for (uint32_t s = 0; s < p->count && p->rc == IFD_OK; s++) {
        tu_item it = tu_item_make(((uint64_t)p->id << 32) | s);
        p->rc = ifd_queue_push(p->sh->q, &it);
    }
    if (atomic_fetch_sub(&p->sh->producers_left, 1) == 1)
        ifd_queue_close(p->sh->q);
    return NULL;
}

START_TEST(test_take_many_producers)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 8; round++) {
        tk_shared sh;
        sh.cap = (size_t)rand_between(&rng, 1, 16);
        sh.q = tu_queue_make(sh.cap);
        ifd_queue_set_wake(sh.q, (size_t)rand_between(&rng, 1, (int64_t)sh.cap),
                           (size_t)rand_between(&rng, 1, (int64_t)sh.cap));
        size_t max = (size_t)rand_between(&rng, 1, (int64_t)sh.cap + 2);
        int timed = (int)rand_between(&rng, 0, 1);
        int np = (int)rand_between(&rng, 1, TK_PRODUCERS);
        atomic_init(&sh.producers_left, np);
        tk_producer prod[TK_PRODUCERS];
        uint32_t next[TK_PRODUCERS] = {0};
        size_t total = 0;
        for (int i = 0; i < np; i++) {
            prod[i] = (tk_producer){
                .sh = &sh, .id = (uint32_t)i, .count = (uint32_t)rand_between(&rng, 0, 3000)};
            total += prod[i].count;
            ck_assert_int_eq(pthread_create(&prod[i].t, NULL, tk_producer_main, &prod[i]), 0);
        }
        char what[128];
        snprintf(what, sizeof what, "round %d: cap %zu, take %zu, %s, %d producers", round, sh.cap,
                 max, timed ? "timed" : "blocking", np);
        tu_item items[18];
        size_t got = 0, n;
        int rc;
        for (;;) {
            rc = timed ? ifd_queue_take_until(sh.q, items, max, &n, ifd_clock_ns() + 20000 * MS)
                       : ifd_queue_take(sh.q, items, max, &n);
            if (rc != IFD_OK)
                break;
            RASSERT(n >= 1 && n <= max, "%s: a take gave %zu", what, n);
            /* until the next take, the producers see n - 1 slots full besides the queue's */
            size_t len = ifd_queue_len(sh.q);
            RASSERT(len + n - 1 <= sh.cap, "%s: %zu queued and %zu taken over capacity", what, len,
                    n - 1);
            for (size_t i = 0; i < n; i++, got++) {
                RASSERT(tu_item_valid(&items[i]), "%s: item corrupt", what);
                uint32_t id = (uint32_t)(items[i].tag >> 32), seq = (uint32_t)items[i].tag;
                RASSERT(id < (uint32_t)np && seq == next[id],
                        "%s: producer %u item %u, expected %u", what, id, seq,
                        id < (uint32_t)np ? next[id] : 0);
                next[id]++;
            }
        }
        RASSERT(rc == IFD_ECLOSED, "%s: the last take returned %s", what, ifd_errname(rc));
        RASSERT(got == total, "%s: %zu items taken, %zu pushed", what, got, total);
        for (int i = 0; i < np; i++) {
            pthread_join(prod[i].t, NULL);
            ck_assert_int_eq(prod[i].rc, IFD_OK);
        }
        ifd_queue_destroy(sh.q);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("queue_take");
    TCase *tc = tu_tcase(s, "take", 30);
    tcase_add_test(tc, test_take_holds_slots_until_next_take);
    tcase_add_test(tc, test_take_drain_and_abort);
    tcase_add_test(tc, test_take_after_close);
    tc = tu_tcase(s, "concurrency", 60);
    tcase_add_test(tc, test_take_many_producers);
    return tu_run_suite(s);
}
