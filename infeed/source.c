/* The bounded batch queue, usable as a batch source. */
#include "core/batch.h"
#include "core/queue.h"
#include "infeed/infeed.h"

#include <stdlib.h>

struct ifd_batch_queue {
    ifd_queue *q; /* ifd_batch * */
};

int ifd_batch_queue_create(ifd_batch_queue **out, size_t capacity)
{
    *out = NULL;
    ifd_batch_queue *bq = calloc(1, sizeof *bq);
    if (bq == NULL)
        return IFD_ENOMEM;
    int rc = ifd_queue_create(&bq->q, sizeof(ifd_batch *), capacity);
    if (rc) {
        free(bq);
        return rc;
    }
    *out = bq;
    return IFD_OK;
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
    ifd_queue_drain(bq->q, release_left, NULL);
    ifd_queue_destroy(bq->q);
    free(bq);
}

int ifd_batch_queue_push(ifd_batch_queue *bq, ifd_batch *b)
{
    return ifd_queue_push(bq->q, &b);
}

void ifd_batch_queue_close(ifd_batch_queue *bq)
{
    ifd_queue_close(bq->q);
}

size_t ifd_batch_queue_len(ifd_batch_queue *bq)
{
    return ifd_queue_len(bq->q);
}

static int bq_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    ifd_batch_queue *bq = ctx;
    int rc = ifd_queue_pop(bq->q, out);
    if (rc == IFD_ECLOSED)
        return IFD_EEOF;
    if (rc)
        ifd_error_set(err, rc, "batch queue aborted");
    return rc;
}

static int bq_try_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    ifd_batch_queue *bq = ctx;
    int rc = ifd_queue_pop_until(bq->q, out, 0);
    if (rc == IFD_ECLOSED)
        return IFD_EEOF;
    if (rc && rc != IFD_ETIMEDOUT)
        ifd_error_set(err, rc, "batch queue aborted");
    return rc;
}

static void bq_abort(void *ctx)
{
    ifd_batch_queue *bq = ctx;
    ifd_queue_abort(bq->q);
}

static const ifd_batch_source_ops bq_ops = {
    .next = bq_next, .abort = bq_abort, .try_next = bq_try_next};

ifd_batch_source ifd_batch_queue_source(ifd_batch_queue *bq)
{
    ifd_batch_source s = {.ops = &bq_ops, .ctx = bq};
    return s;
}
