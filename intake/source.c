/* The bounded batch queue, usable as a batch source: one FIFO, or one per replica for per-core
 * input. */
#include "core/batch.h"
#include "core/queue.h"
#include <infeed/infeed.h>

#include <stdlib.h>

struct ifd_batch_queue {
    int lanes;       /* 1, or the replicas of a per-replica queue */
    int per_replica; /* made with ifd_batch_queue_create_per_replica */
    ifd_queue **q;   /* lanes queues of ifd_batch * */
};

int ifd_batch_queue_create_per_replica(ifd_batch_queue **out, size_t capacity, int replicas)
{
    *out = NULL;
    if (replicas < 1)
        return IFD_EINVAL;
    ifd_batch_queue *bq = calloc(1, sizeof *bq);
    if (bq == NULL)
        return IFD_ENOMEM;
    bq->q = calloc((size_t)replicas, sizeof *bq->q);
    if (bq->q == NULL) {
        free(bq);
        return IFD_ENOMEM;
    }
    for (; bq->lanes < replicas; bq->lanes++) {
        int rc = ifd_queue_create(&bq->q[bq->lanes], sizeof(ifd_batch *), capacity);
        if (rc) {
            ifd_batch_queue_destroy(bq);
            return rc;
        }
    }
    bq->per_replica = 1;
    *out = bq;
    return IFD_OK;
}

int ifd_batch_queue_create(ifd_batch_queue **out, size_t capacity)
{
    int rc = ifd_batch_queue_create_per_replica(out, capacity, 1);
    if (rc == IFD_OK)
        (*out)->per_replica = 0;
    return rc;
}

static void release_left(void *item, void *arg)
{
    (void)arg;
    ifd_batch *b = *(ifd_batch **)item;
    ifd_batch_ref(b, 1);
    ifd_batch_unref(b);
}

void ifd_batch_queue_destroy(ifd_batch_queue *bq)
{
    if (bq == NULL)
        return;
    for (int i = 0; i < bq->lanes; i++) {
        ifd_queue_drain(bq->q[i], release_left, NULL);
        ifd_queue_destroy(bq->q[i]);
    }
    free(bq->q);
    free(bq);
}

int ifd_batch_queue_push(ifd_batch_queue *bq, ifd_batch *b)
{
    int lane = bq->per_replica ? b->replica : 0;
    if (lane < 0 || lane >= bq->lanes)
        return IFD_EINVAL;
    return ifd_queue_push(bq->q[lane], &b);
}

void ifd_batch_queue_close(ifd_batch_queue *bq)
{
    for (int i = 0; i < bq->lanes; i++)
        ifd_queue_close(bq->q[i]);
}

size_t ifd_batch_queue_len(ifd_batch_queue *bq)
{
    size_t n = 0;
    for (int i = 0; i < bq->lanes; i++)
        n += ifd_queue_len(bq->q[i]);
    return n;
}

size_t ifd_batch_queue_len_for(ifd_batch_queue *bq, int replica)
{
    if (replica < 0 || replica >= bq->lanes)
        return 0;
    return ifd_queue_len(bq->q[replica]);
}

/* Pops lane's next batch, blocking when wait, else IFD_ETIMEDOUT at once when it is empty. */
static int bq_pop(ifd_batch_queue *bq, int lane, ifd_batch **out, int wait, ifd_error *err)
{
    if (lane < 0 || lane >= bq->lanes)
        return ifd_error_set(err, IFD_EINVAL,
                             "batch queue: replica %d: expected 0 to %d, the queue's replica "
                             "FIFOs (per-core input takes a queue made by "
                             "ifd_batch_queue_create_per_replica with the session's replicas)",
                             lane, bq->lanes - 1);
    int rc = wait ? ifd_queue_pop(bq->q[lane], out) : ifd_queue_pop_until(bq->q[lane], out, 0);
    if (rc == IFD_ECLOSED)
        return IFD_EEOF;
    if (rc && rc != IFD_ETIMEDOUT)
        ifd_error_set(err, rc, "batch queue aborted");
    return rc;
}

static int bq_check_shared(ifd_batch_queue *bq, ifd_error *err)
{
    if (bq->per_replica)
        return ifd_error_set(err, IFD_EINVAL,
                             "batch queue: a per-replica queue (per-core input) gives batches "
                             "with next_for only; the input mode takes one stream");
    return IFD_OK;
}

static int bq_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    int rc = bq_check_shared(ctx, err);
    return rc ? rc : bq_pop(ctx, 0, out, 1, err);
}

static int bq_try_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    int rc = bq_check_shared(ctx, err);
    return rc ? rc : bq_pop(ctx, 0, out, 0, err);
}

static int bq_next_for(void *ctx, int replica, ifd_batch **out, ifd_error *err)
{
    return bq_pop(ctx, replica, out, 1, err);
}

static int bq_try_next_for(void *ctx, int replica, ifd_batch **out, ifd_error *err)
{
    return bq_pop(ctx, replica, out, 0, err);
}

static void bq_abort(void *ctx)
{
    ifd_batch_queue *bq = ctx;
    for (int i = 0; i < bq->lanes; i++)
        ifd_queue_abort(bq->q[i]);
}

static const ifd_batch_source_ops bq_ops = {
    .next = bq_next,
    .abort = bq_abort,
    .try_next = bq_try_next,
    .next_for = bq_next_for,
    .try_next_for = bq_try_next_for,
};

ifd_batch_source ifd_batch_queue_source(ifd_batch_queue *bq)
{
    ifd_batch_source s = {.ops = &bq_ops, .ctx = bq};
    return s;
}
