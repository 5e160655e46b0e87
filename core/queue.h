/*
 * A bounded blocking FIFO of fixed-size items, copied in and out by value (a ring buffer guarded
 * by one mutex). Any number of producers and consumers.
 *
 * Closing and aborting:
 * - ifd_queue_close: no more pushes (they fail with IFD_ECLOSED); pops drain what is left, then
 *   fail with IFD_ECLOSED. This is the end of a stream.
 * - ifd_queue_abort: every blocked or later push and pop fails at once with IFD_ESTOPPED, even
 *   with items still inside. This is the error path. ifd_queue_drain gives the items that were
 *   left back to their owner.
 * Both wake every blocked thread, and both are idempotent and may be called from any thread.
 *
 * Hand-offs in bursts (hysteresis), off by default: with ifd_queue_set_wake,
 * - a consumer blocked on an empty queue is woken once wake_len items are in, or by
 *   ifd_queue_kick, close or abort; a producer that sets wake_len > 1 must kick before it stops
 *   pushing for a while, or the items below wake_len wait;
 * - a producer blocked on a full queue is woken once wake_free slots are free;
 * so that a fast consumer and a producer do not pay one wake-up per item.
 */
#ifndef IFD_CORE_QUEUE_H
#define IFD_CORE_QUEUE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ifd_queue ifd_queue;

int ifd_queue_create(ifd_queue **out, size_t item_size, size_t capacity);
void ifd_queue_destroy(ifd_queue *q);

/* Blocks while the queue is full. IFD_OK, IFD_ECLOSED or IFD_ESTOPPED. */
int ifd_queue_push(ifd_queue *q, const void *item);
/* Blocks while the queue is empty. IFD_OK, IFD_ECLOSED (closed and drained) or IFD_ESTOPPED. */
int ifd_queue_pop(ifd_queue *q, void *item);
/* As above, giving up with IFD_ETIMEDOUT at the monotonic deadline (ifd_clock_ns); a deadline in
 * the past makes them non-blocking. */
int ifd_queue_push_until(ifd_queue *q, const void *item, int64_t deadline_ns);
int ifd_queue_pop_until(ifd_queue *q, void *item, int64_t deadline_ns);

/* Pops in bursts, for the queue's one consumer: up to max items (at least one; *n says how many)
 * into items[], in order, under one lock, waiting as ifd_queue_pop does; same results as pop's.
 * The slots of the items after the first stay held (a push sees them full) until the consumer's
 * next take, which frees them first (as does a drain): the queue plus the items the consumer has
 * taken and not begun never hold more than capacity, as with pops one at a time. The consumer
 * checks ifd_queue_is_aborted before it uses an item taken earlier. */
int ifd_queue_take(ifd_queue *q, void *items, size_t max, size_t *n);
int ifd_queue_take_until(ifd_queue *q, void *items, size_t max, size_t *n, int64_t deadline_ns);

void ifd_queue_close(ifd_queue *q);
void ifd_queue_abort(ifd_queue *q);
/* Pops every item left (whatever the state) and hands each to fn. Returns how many. */
size_t ifd_queue_drain(ifd_queue *q, void (*fn)(void *item, void *arg), void *arg);

/* Hysteresis (both clamped to 1..capacity; 1 and 1 by default). */
void ifd_queue_set_wake(ifd_queue *q, size_t wake_len, size_t wake_free);
/* Wakes a blocked consumer if the queue holds any item; it drains them even below wake_len
 * until the queue is empty again. */
void ifd_queue_kick(ifd_queue *q);

/* Items in the queue; those taken (ifd_queue_take) are not. */
size_t ifd_queue_len(ifd_queue *q);
size_t ifd_queue_capacity(const ifd_queue *q);
int ifd_queue_is_closed(ifd_queue *q);
/* Whether ifd_queue_abort was called (no lock taken). */
int ifd_queue_is_aborted(ifd_queue *q);

#endif
