/* Helpers of the queue suites (tests/core/test_queue*.c): items whose bytes can be checked, and
 * a thread that does one push or pop that the test can see blocked and woken. */
#ifndef IFD_TEST_QUEUE_ITEMS_H
#define IFD_TEST_QUEUE_ITEMS_H

#include "core/queue.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* An item with a payload, so that copying by value is checked byte for byte. */
typedef struct tu_item {
    uint64_t tag;
    uint64_t check;
    unsigned char pad[13];
} tu_item;

tu_item tu_item_make(uint64_t tag);
/* Whether the payload is the one tu_item_make(it->tag) wrote. */
int tu_item_valid(const tu_item *it);

/* A thread that does one push or pop, then raises done. */
typedef struct tu_op {
    pthread_t t;
    ifd_queue *q;
    tu_item it;
    int64_t deadline_ns; /* < 0: the blocking call, else the _until call */
    int rc;
    int64_t back_ns; /* the clock when the call returned */
    atomic_int tid;  /* its kernel id (tests/util/wait.h) */
    atomic_int done;
} tu_op;

/* Starts a push (push 1) of the item tagged tag, or a pop. */
void tu_op_start(tu_op *o, ifd_queue *q, int push, uint64_t tag, int64_t deadline_ns);
/* Fails unless the push or pop blocks (tu_wait_blocked). */
void tu_op_wait_blocked(tu_op *o, const char *what);
/* Starts a blocking push or pop that must block. */
void tu_op_start_blocked(tu_op *o, ifd_queue *q, int push, uint64_t tag);
/* Starts n pushes (of tags first_tag, first_tag + 1, ...) or n pops that must all block. */
void tu_ops_start_blocked(tu_op *ops, int n, ifd_queue *q, int push, uint64_t first_tag);
/* Waits (10 s at most) for the thread to finish after it was woken, then joins it. */
void tu_op_join_woken(tu_op *o, const char *what);

/* A queue of tu_item. */
ifd_queue *tu_queue_make(size_t capacity);
/* Pushes tags first..first+n-1 without blocking. */
void tu_queue_fill(ifd_queue *q, uint64_t first, size_t n);

#endif
