/*
 * The buffers of tensor messages' data frames (host/publisher.c), kept for the next messages
 * once libzmq has sent them. A message's data goes to libzmq without a copy and libzmq frees it
 * on its I/O thread; freed to malloc, each 64 KiB buffer went back to the kernel (glibc trims a
 * thread arena's top with madvise) and the outfeed thread faulted its pages in again for the
 * next message (bench_outfeed's out16+pub: 4.2 page faults a step on the outfeed thread; 0.1
 * with the pool, whose kept buffers serve 97 % of what it hands out).
 *
 * A pool keeps at most IFD_PUB_TENSOR_POOL_BYTES of buffers that nobody uses, a free list per
 * power-of-two capacity (a buffer is at most twice what was asked, as realloc's doubling gave
 * before, or exactly it when too large to keep); it lives until its
 * owner has destroyed it and every buffer taken from it is back (libzmq may still hold some
 * after the publisher is gone: the socket's linger). Thread-safe: buffers are taken on the
 * outfeed thread and given back on libzmq's I/O thread.
 */
#ifndef IFD_HOST_TENSOR_POOL_H
#define IFD_HOST_TENSOR_POOL_H

#include "host/limits.h"

#include <stddef.h>
#include <stdint.h>

/* Free buffers a pool keeps at most (bytes of their capacity): a loop's burst of messages of
 * bench_outfeed's out16+pub (1.9 MiB) comes back whole. */
#define IFD_PUB_TENSOR_POOL_BYTES ((size_t)4 << 20)
/* The largest capacity a pool rounds up to and keeps: a message of several steps (a single step
 * larger than that gets a buffer of its exact size, never kept, so that ZeroMQ's queue holds no
 * more than the message's bytes for it). */
#define IFD_PUB_TENSOR_POOL_LARGEST IFD_PUB_TENSOR_MESSAGE_BYTES

typedef struct ifd_tensor_pool ifd_tensor_pool;

typedef struct ifd_tensor_pool_stats {
    int64_t taken;  /* buffers handed out */
    int64_t reused; /* of those, kept ones */
    int64_t out;    /* handed out and not back now */
    int64_t kept;   /* free buffers kept now */
    size_t kept_bytes;
} ifd_tensor_pool_stats;

/* NULL when out of memory. */
ifd_tensor_pool *ifd_tensor_pool_create(void);
/* The owner's end: its free buffers are freed, and the pool once the last buffer is back. */
void ifd_tensor_pool_destroy(ifd_tensor_pool *pool);
/* A buffer of at least need bytes, or NULL when out of memory. *cap: its capacity, the power of
 * two at or above need (256 at least), or need itself above IFD_PUB_TENSOR_POOL_LARGEST (such a
 * buffer is never kept). */
char *ifd_tensor_pool_get(ifd_tensor_pool *pool, size_t need, size_t *cap);
/* Gives a buffer back (NULL: nothing); kept unless the pool holds IFD_PUB_TENSOR_POOL_BYTES. */
void ifd_tensor_pool_put(char *data);
/* For libzmq (zmq_msg_init_data's free function): ifd_tensor_pool_put(data). */
void ifd_tensor_pool_free(void *data, void *hint);
void ifd_tensor_pool_get_stats(ifd_tensor_pool *pool, ifd_tensor_pool_stats *st);

#endif
