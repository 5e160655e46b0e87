#include "host/tensor_pool.h"

#include "core/thread.h"

#include <stdlib.h>

/* Capacities are powers of two from 2^POOL_MIN_SHIFT; a free list a capacity. Buffers larger
 * than IFD_PUB_TENSOR_POOL_LARGEST are never kept. */
enum { POOL_MIN_SHIFT = 8, POOL_CLASSES = 40 };

/* Before each buffer's data (32 bytes: the data keeps malloc's 16-byte alignment). */
typedef struct tbuf {
    struct tbuf *next;
    ifd_tensor_pool *pool;
    size_t cap;
    int cls; /* its free list, or -1: never kept */
} tbuf;

struct ifd_tensor_pool {
    ifd_mutex mu;
    tbuf *free[POOL_CLASSES];
    size_t kept_bytes;
    int64_t kept, out; /* free buffers; buffers handed out and not back */
    int closed;        /* the owner is gone */
    int64_t taken, reused;
};

ifd_tensor_pool *ifd_tensor_pool_create(void)
{
    ifd_tensor_pool *pool = calloc(1, sizeof *pool);
    if (pool)
        ifd_mutex_init(&pool->mu);
    return pool;
}

static void free_kept(ifd_tensor_pool *pool)
{
    for (int c = 0; c < POOL_CLASSES; c++)
        while (pool->free[c]) {
            tbuf *b = pool->free[c];
            pool->free[c] = b->next;
            free(b);
        }
    pool->kept = 0;
    pool->kept_bytes = 0;
}

/* Frees the pool when its owner is gone and no buffer is out (under mu, which it releases). */
static void unlock_or_free(ifd_tensor_pool *pool)
{
    int last = pool->closed && pool->out == 0;
    ifd_mutex_unlock(&pool->mu);
    if (last) {
        ifd_mutex_fini(&pool->mu);
        free(pool);
    }
}

void ifd_tensor_pool_destroy(ifd_tensor_pool *pool)
{
    if (pool == NULL)
        return;
    ifd_mutex_lock(&pool->mu);
    free_kept(pool);
    pool->closed = 1;
    unlock_or_free(pool);
}

char *ifd_tensor_pool_get(ifd_tensor_pool *pool, size_t need, size_t *cap)
{
    int cls = POOL_MIN_SHIFT;
    while (cls < POOL_CLASSES && ((size_t)1 << cls) < need)
        cls++;
    size_t size = cls < POOL_CLASSES ? (size_t)1 << cls : need;
    if (size > IFD_PUB_TENSOR_POOL_LARGEST) {
        size = need;
        cls = -1;
    }
    ifd_mutex_lock(&pool->mu);
    tbuf *b = cls >= 0 ? pool->free[cls] : NULL;
    if (b) {
        pool->free[cls] = b->next;
        pool->kept--;
        pool->kept_bytes -= b->cap;
        pool->reused++;
    }
    pool->taken++;
    pool->out++;
    ifd_mutex_unlock(&pool->mu);
    if (b == NULL) {
        b = malloc(sizeof *b + size);
        if (b == NULL) {
            ifd_mutex_lock(&pool->mu);
            pool->taken--;
            pool->out--;
            ifd_mutex_unlock(&pool->mu); /* the owner holds the pool: it is not closed */
            return NULL;
        }
        *b = (tbuf){.pool = pool, .cap = size, .cls = cls};
    }
    *cap = b->cap;
    return (char *)(b + 1);
}

void ifd_tensor_pool_put(char *data)
{
    if (data == NULL)
        return;
    tbuf *b = (tbuf *)data - 1;
    ifd_tensor_pool *pool = b->pool;
    ifd_mutex_lock(&pool->mu);
    pool->out--;
    if (!pool->closed && b->cls >= 0 && pool->kept_bytes + b->cap <= IFD_PUB_TENSOR_POOL_BYTES) {
        b->next = pool->free[b->cls];
        pool->free[b->cls] = b;
        pool->kept++;
        pool->kept_bytes += b->cap;
        b = NULL;
    }
    unlock_or_free(pool);
    free(b);
}

void ifd_tensor_pool_free(void *data, void *hint)
{
    (void)hint;
    ifd_tensor_pool_put(data);
}

void ifd_tensor_pool_get_stats(ifd_tensor_pool *pool, ifd_tensor_pool_stats *st)
{
    ifd_mutex_lock(&pool->mu);
    *st = (ifd_tensor_pool_stats){.taken = pool->taken,
                                  .reused = pool->reused,
                                  .out = pool->out,
                                  .kept = pool->kept,
                                  .kept_bytes = pool->kept_bytes};
    ifd_mutex_unlock(&pool->mu);
}
