#include "tests/util/queue_items.h"

#include "core/thread.h"
#include "tests/util/testutil.h"
#include "tests/util/wait.h"

#include <string.h>

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

tu_item tu_item_make(uint64_t tag)
{
    tu_item it;
    memset(&it, 0, sizeof it);
    it.tag = tag;
    it.check = mix(tag);
    for (size_t i = 0; i < sizeof it.pad; i++)
        it.pad[i] = (unsigned char)(tag + i);
    return it;
}

int tu_item_valid(const tu_item *it)
{
    if (it->check != mix(it->tag))
        return 0;
    for (size_t i = 0; i < sizeof it->pad; i++)
        if (it->pad[i] != (unsigned char)(it->tag + i))
            return 0;
    return 1;
}

static void *pop_main(void *arg)
{
    tu_op *o = arg;
    atomic_store(&o->tid, tu_self_tid());
    if (o->deadline_ns < 0)
        o->rc = ifd_queue_pop(o->q, &o->it);
    else
        o->rc = ifd_queue_pop_until(o->q, &o->it, o->deadline_ns);
    o->back_ns = ifd_clock_ns();
    atomic_store(&o->done, 1);
    return NULL;
}

static void *push_main(void *arg)
{
    tu_op *o = arg;
    atomic_store(&o->tid, tu_self_tid());
    if (o->deadline_ns < 0)
        o->rc = ifd_queue_push(o->q, &o->it);
    else
        o->rc = ifd_queue_push_until(o->q, &o->it, o->deadline_ns);
    o->back_ns = ifd_clock_ns();
    atomic_store(&o->done, 1);
    return NULL;
}

void tu_op_start(tu_op *o, ifd_queue *q, int push, uint64_t tag, int64_t deadline_ns)
{
    memset(o, 0, sizeof *o);
    o->q = q;
    o->it = tu_item_make(tag);
    o->deadline_ns = deadline_ns;
    o->rc = -1;
    atomic_init(&o->tid, 0);
    atomic_init(&o->done, 0);
    ck_assert_int_eq(pthread_create(&o->t, NULL, push ? push_main : pop_main, o), 0);
}

void tu_op_wait_blocked(tu_op *o, const char *what)
{
    tu_wait_blocked(&o->tid, &o->done, what);
}

void tu_op_start_blocked(tu_op *o, ifd_queue *q, int push, uint64_t tag)
{
    tu_op_start(o, q, push, tag, -1);
    tu_op_wait_blocked(o, push ? "push" : "pop");
}

void tu_ops_start_blocked(tu_op *ops, int n, ifd_queue *q, int push, uint64_t first_tag)
{
    for (int i = 0; i < n; i++)
        tu_op_start(&ops[i], q, push, first_tag + (uint64_t)i, -1);
    for (int i = 0; i < n; i++)
        tu_op_wait_blocked(&ops[i], push ? "push on a full queue" : "pop on an empty queue");
}

void tu_op_join_woken(tu_op *o, const char *what)
{
    RASSERT(tu_wait_flag(&o->done, 10000 * MS), "%s: blocked thread was not woken within 10 s",
            what);
    pthread_join(o->t, NULL);
}

ifd_queue *tu_queue_make(size_t capacity)
{
    ifd_queue *q = NULL;
    ck_assert_int_eq(ifd_queue_create(&q, sizeof(tu_item), capacity), IFD_OK);
    ck_assert_ptr_nonnull(q);
    return q;
}

void tu_queue_fill(ifd_queue *q, uint64_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        tu_item it = tu_item_make(first + i);
        RASSERT(ifd_queue_push_until(q, &it, 0) == IFD_OK, "fill: push %zu of %zu failed", i, n);
    }
}
