#include "core/queue.h"

#include "core/thread.h"
#include <infeed/error.h>

#include <stdlib.h>
#include <string.h>

struct ifd_queue {
    ifd_mutex mu;
    ifd_cond not_empty;
    ifd_cond not_full;
    size_t item_size;
    size_t cap;
    size_t head; /* next item to pop */
    size_t len;
    int closed;
    int aborted;
    int waiting_pop;
    int waiting_push;
    size_t wake_len;  /* a blocked consumer is woken at this length, by kick, or at the end */
    size_t wake_free; /* a blocked producer is woken when this many slots are free */
    int kicked;
    size_t held; /* slots of the items the last ifd_queue_take handed out after its first */
    unsigned char *buf;
};

int ifd_queue_create(ifd_queue **out, size_t item_size, size_t capacity)
{
    *out = NULL;
    if (item_size == 0 || capacity == 0)
        return IFD_EINVAL;
    ifd_queue *q = calloc(1, sizeof *q);
    if (q == NULL)
        goto fail_alloc;
    q->buf = malloc(item_size * capacity);
    if (q->buf == NULL)
        goto fail_buf;
    q->item_size = item_size;
    q->cap = capacity;
    q->wake_len = 1;
    q->wake_free = 1;
    ifd_mutex_init(&q->mu);
    ifd_cond_init(&q->not_empty);
    ifd_cond_init(&q->not_full);
    *out = q;
    return IFD_OK;

fail_buf:
    free(q);
fail_alloc:
    return IFD_ENOMEM;
}

void ifd_queue_destroy(ifd_queue *q)
{
    if (q == NULL)
        return;
    ifd_cond_fini(&q->not_full);
    ifd_cond_fini(&q->not_empty);
    ifd_mutex_fini(&q->mu);
    free(q->buf);
    free(q);
}

/* deadline_ns < 0 means wait forever. */
static int queue_push(ifd_queue *q, const void *item, int64_t deadline_ns)
{
    int rc = IFD_OK;
    ifd_mutex_lock(&q->mu);
    for (;;) {
        if (q->aborted) {
            rc = IFD_ESTOPPED;
            goto out;
        }
        if (q->closed) {
            rc = IFD_ECLOSED;
            goto out;
        }
        if (q->len + q->held < q->cap)
            break;
        if (deadline_ns >= 0 && deadline_ns <= ifd_clock_ns()) {
            rc = IFD_ETIMEDOUT; /* without a futex call */
            goto out;
        }
        q->waiting_push++;
        int t = 0;
        if (deadline_ns < 0)
            ifd_cond_wait(&q->not_full, &q->mu);
        else
            t = ifd_cond_wait_until(&q->not_full, &q->mu, deadline_ns);
        q->waiting_push--;
        if (t != 0 && !q->aborted && !q->closed && q->len + q->held == q->cap) {
            rc = IFD_ETIMEDOUT;
            goto out;
        }
    }
    size_t tail = (q->head + q->len) % q->cap;
    memcpy(q->buf + tail * q->item_size, item, q->item_size);
    q->len++;
    int wake = q->waiting_pop && q->len >= q->wake_len;
    ifd_mutex_unlock(&q->mu);
    /* after the unlock, so that the woken thread does not block at once on the mutex */
    if (wake)
        ifd_cond_signal(&q->not_empty);
    return IFD_OK;
out:
    ifd_mutex_unlock(&q->mu);
    return rc;
}

/* Whether the blocked producers are to be woken: once wake_free slots are free. Under the lock;
 * the broadcast comes after the unlock. */
static int wake_producers(const ifd_queue *q)
{
    return q->waiting_push && q->cap - q->len - q->held >= q->wake_free;
}

/* Moves the first min(max, len) items into items (under the lock); returns how many. */
static size_t copy_out(ifd_queue *q, void *items, size_t max)
{
    size_t k = max < q->len ? max : q->len;
    size_t first = q->cap - q->head < k ? q->cap - q->head : k; /* up to the end of buf */
    memcpy(items, q->buf + q->head * q->item_size, first * q->item_size);
    memcpy((unsigned char *)items + first * q->item_size, q->buf, (k - first) * q->item_size);
    q->head = (q->head + k) % q->cap;
    q->len -= k;
    return k;
}

/* Pops up to max items (at least one) into items; *n says how many. take: the slots held by the
 * previous take are freed first, and those of these items after the first stay held. */
static int queue_pop(ifd_queue *q, void *items, size_t max, size_t *n, int take,
                     int64_t deadline_ns)
{
    int rc = IFD_OK, waited = 0, timed_out = 0, wake = 0;
    *n = 0;
    ifd_mutex_lock(&q->mu);
    if (take)
        q->held = 0;
    for (;;) {
        if (q->aborted) {
            rc = IFD_ESTOPPED;
            goto out;
        }
        if (q->len > 0 && (q->len >= q->wake_len || q->kicked || q->closed || !waited || timed_out))
            break;
        if (q->len == 0 && q->closed) {
            rc = IFD_ECLOSED;
            goto out;
        }
        if (wake_producers(q)) /* the slots a take freed, before this thread waits */
            ifd_cond_broadcast(&q->not_full);
        if (q->len == 0 && deadline_ns >= 0 && deadline_ns <= ifd_clock_ns()) {
            rc = IFD_ETIMEDOUT; /* without a futex call */
            goto out;
        }
        q->waiting_pop++;
        waited = 1;
        int t = 0;
        if (deadline_ns < 0)
            ifd_cond_wait(&q->not_empty, &q->mu);
        else
            t = ifd_cond_wait_until(&q->not_empty, &q->mu, deadline_ns);
        q->waiting_pop--;
        if (t != 0 && !q->aborted && !q->closed && q->len == 0) {
            rc = IFD_ETIMEDOUT;
            goto out;
        }
        timed_out = t != 0; /* at the deadline, take an item even below wake_len */
    }
    size_t k = copy_out(q, items, max);
    *n = k;
    if (take)
        q->held = k - 1; /* the first is in use, as a popped item would be */
    if (q->len == 0)
        q->kicked = 0;
    wake = wake_producers(q);
out:
    ifd_mutex_unlock(&q->mu);
    if (wake)
        ifd_cond_broadcast(&q->not_full);
    return rc;
}

int ifd_queue_push(ifd_queue *q, const void *item)
{
    return queue_push(q, item, -1);
}

int ifd_queue_pop(ifd_queue *q, void *item)
{
    size_t n;
    return queue_pop(q, item, 1, &n, 0, -1);
}

int ifd_queue_push_until(ifd_queue *q, const void *item, int64_t deadline_ns)
{
    return queue_push(q, item, deadline_ns < 0 ? 0 : deadline_ns);
}

int ifd_queue_pop_until(ifd_queue *q, void *item, int64_t deadline_ns)
{
    size_t n;
    return queue_pop(q, item, 1, &n, 0, deadline_ns < 0 ? 0 : deadline_ns);
}

int ifd_queue_take(ifd_queue *q, void *items, size_t max, size_t *n)
{
    return queue_pop(q, items, max < 1 ? 1 : max, n, 1, -1);
}

int ifd_queue_take_until(ifd_queue *q, void *items, size_t max, size_t *n, int64_t deadline_ns)
{
    return queue_pop(q, items, max < 1 ? 1 : max, n, 1, deadline_ns < 0 ? 0 : deadline_ns);
}

void ifd_queue_close(ifd_queue *q)
{
    ifd_mutex_lock(&q->mu);
    q->closed = 1;
    ifd_cond_broadcast(&q->not_empty);
    ifd_cond_broadcast(&q->not_full);
    ifd_mutex_unlock(&q->mu);
}

void ifd_queue_abort(ifd_queue *q)
{
    ifd_mutex_lock(&q->mu);
    __atomic_store_n(&q->aborted, 1, __ATOMIC_RELEASE);
    ifd_cond_broadcast(&q->not_empty);
    ifd_cond_broadcast(&q->not_full);
    ifd_mutex_unlock(&q->mu);
}

size_t ifd_queue_drain(ifd_queue *q, void (*fn)(void *item, void *arg), void *arg)
{
    size_t n = 0;
    _Alignas(max_align_t) unsigned char tmp[256];
    unsigned char *item = q->item_size <= sizeof tmp ? tmp : malloc(q->item_size);
    if (item == NULL)
        return 0;
    for (;;) {
        ifd_mutex_lock(&q->mu);
        q->held = 0;
        if (q->len == 0) {
            ifd_mutex_unlock(&q->mu);
            break;
        }
        memcpy(item, q->buf + q->head * q->item_size, q->item_size);
        q->head = (q->head + 1) % q->cap;
        q->len--;
        ifd_cond_broadcast(&q->not_full);
        ifd_mutex_unlock(&q->mu);
        if (fn)
            fn(item, arg);
        n++;
    }
    if (item != tmp)
        free(item);
    return n;
}

static size_t clamp(size_t v, size_t hi)
{
    return v < 1 ? 1 : v > hi ? hi : v;
}

void ifd_queue_set_wake(ifd_queue *q, size_t wake_len, size_t wake_free)
{
    ifd_mutex_lock(&q->mu);
    q->wake_len = clamp(wake_len, q->cap);
    q->wake_free = clamp(wake_free, q->cap);
    ifd_mutex_unlock(&q->mu);
}

void ifd_queue_kick(ifd_queue *q)
{
    ifd_mutex_lock(&q->mu);
    if (q->len > 0)
        q->kicked = 1;
    int wake = q->len > 0 && q->waiting_pop;
    ifd_mutex_unlock(&q->mu);
    if (wake)
        ifd_cond_broadcast(&q->not_empty);
}

size_t ifd_queue_len(ifd_queue *q)
{
    ifd_mutex_lock(&q->mu);
    size_t n = q->len;
    ifd_mutex_unlock(&q->mu);
    return n;
}

size_t ifd_queue_capacity(const ifd_queue *q)
{
    return q->cap;
}

int ifd_queue_is_aborted(ifd_queue *q)
{
    return __atomic_load_n(&q->aborted, __ATOMIC_ACQUIRE);
}

int ifd_queue_is_closed(ifd_queue *q)
{
    ifd_mutex_lock(&q->mu);
    int c = q->closed || q->aborted;
    ifd_mutex_unlock(&q->mu);
    return c;
}
