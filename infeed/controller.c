#include "core/batch.h"
#include "core/log.h"
#include "core/opqueue.h"
#include "core/thread.h"
#include "infeed/infeed_internal.h"

#include <stdio.h>
#include <stdlib.h>

#define SOURCE "infeed"

struct ifd_infeed {
    ifd_infeed_config cfg;
    ifd_opq *opq;
    ifd_shard *shards;
    int64_t batches; /* atomic */
    /* the initial sleep: ifd_infeed_stop sets stopping and wakes it */
    ifd_mutex sleep_mu;
    ifd_cond sleep_cv;
    int stopping;
};

/* The seed's initial_infeed_sleep_secs. Returns 0 when the infeed is stopped during it. */
static int initial_sleep(ifd_infeed *f)
{
    if (f->cfg.initial_sleep_secs <= 0.0)
        return 1;
    IFD_LOG_INFO("infeed: sleeping %g s before the first batch", f->cfg.initial_sleep_secs);
    int64_t deadline = ifd_clock_ns() + (int64_t)(f->cfg.initial_sleep_secs * 1e9);
    ifd_mutex_lock(&f->sleep_mu);
    while (!f->stopping && ifd_clock_ns() < deadline)
        ifd_cond_wait_until(&f->sleep_cv, &f->sleep_mu, deadline);
    int go = !f->stopping;
    ifd_mutex_unlock(&f->sleep_mu);
    return go;
}

int ifd_infeed_check_batch(const ifd_program *p, const ifd_batch *b, int64_t batch_size,
                           ifd_error *err)
{
    char want[96], got[96];
    if (b->ntensors != p->ninputs)
        return ifd_error_set(err, IFD_ESHAPE, "has %d tensors, the program '%s' takes %d",
                             b->ntensors, p->cls->name, p->ninputs);
    if (batch_size > 0 && b->rows != batch_size)
        return ifd_error_set(err, IFD_ESHAPE, "has %lld rows, the batch size is %lld",
                             (long long)b->rows, (long long)batch_size);
    for (int i = 0; i < p->ninputs; i++) {
        const ifd_input_spec *in = &p->inputs[i];
        const ifd_tensor *t = &b->tensors[i];
        if (t->dtype != in->dtype)
            return ifd_error_set(err, IFD_EDTYPE, "tensor '%s' has dtype %s, expected %s", in->name,
                                 ifd_dtype_name(t->dtype), ifd_dtype_name(in->dtype));
        ifd_shape expect = {.rank = in->rank + 1};
        expect.dims[0] = b->rows;
        for (int d = 0; d < in->rank; d++)
            expect.dims[d + 1] = in->dims[d];
        if (!ifd_shape_equal(&t->shape, &expect))
            return ifd_error_set(err, IFD_ESHAPE, "tensor '%s' has shape %s, expected %s", in->name,
                                 ifd_shape_format(&t->shape, got, sizeof got),
                                 ifd_shape_format(&expect, want, sizeof want));
        if (t->data == NULL && b->rows > 0)
            return ifd_error_set(err, IFD_EINVAL, "tensor '%s' has no data", in->name);
    }
    if (p->cls->check_batch)
        return p->cls->check_batch(p, b->tensors, b->rows, err);
    return IFD_OK;
}

/* One batch: check, shard, push. Takes its own reference for the time it pushes, so the batch
 * is released only when the last replica is done with it and the infeed has let go. */
static int feed_batch(ifd_infeed *f, ifd_batch *b, ifd_error *err)
{
    const ifd_infeed_config *cfg = &f->cfg;
    int replicas = ifd_device_replicas(cfg->dev);
    ifd_batch_ref(b, 1);
    int rc = ifd_infeed_check_batch(cfg->program, b, cfg->batch_size, err);
    if (rc == IFD_OK)
        rc = ifd_shard_batch(cfg->input_mode, b, replicas, f->shards, err);
    if (rc) {
        ifd_error_prefix(err, "batch %lld from producer '%s'", (long long)b->seq,
                         b->producer ? b->producer : "(in-process)");
        ifd_batch_unref(b);
        return rc;
    }
    for (int r = 0; r < replicas && rc == IFD_OK; r++)
        rc = ifd_device_infeed_enqueue(cfg->dev, r, &f->shards[r]);
    if (rc)
        ifd_error_set(err, rc, "device infeed aborted");
    ifd_batch_unref(b);
    return rc;
}

static void infeed_main(ifd_opq *q, void *arg)
{
    ifd_infeed *f = arg;
    const ifd_infeed_config *cfg = &f->cfg;
    ifd_error err;
    ifd_error_clear(&err);
    int64_t n, loop = 0;
    if (!initial_sleep(f))
        return;
    while (ifd_opq_next(q, &n)) {
        IFD_LOG_DEBUG("infeed: loop %lld: enqueue %lld batches", (long long)loop, (long long)n);
        for (int64_t i = 0; i < n; i++) {
            ifd_batch *b = NULL;
            int rc = IFD_ETIMEDOUT;
            if (cfg->src.ops->try_next)
                rc = cfg->src.ops->try_next(cfg->src.ctx, &b, &err);
            if (rc == IFD_ETIMEDOUT) {
                ifd_device_infeed_flush(cfg->dev);
                rc = cfg->src.ops->next(cfg->src.ctx, &b, &err);
            }
            if (rc == IFD_EEOF) {
                IFD_LOG_INFO("infeed: the input ended after %lld batches",
                             (long long)__atomic_load_n(&f->batches, __ATOMIC_RELAXED));
                ifd_device_infeed_end(cfg->dev);
                return;
            }
            if (rc == IFD_OK)
                rc = feed_batch(f, b, &err);
            if (rc) {
                if (err.code != rc)
                    ifd_error_set(&err, rc, "%s", ifd_strerror(rc));
                ifd_rendezvous_record_error(cfg->rv, SOURCE, &err);
                return;
            }
            __atomic_add_fetch(&f->batches, 1, __ATOMIC_RELAXED);
        }
        ifd_device_infeed_flush(cfg->dev);
        loop++;
    }
}

int ifd_infeed_start(ifd_infeed **out, const ifd_infeed_config *cfg)
{
    *out = NULL;
    ifd_infeed *f = calloc(1, sizeof *f);
    if (f == NULL)
        return IFD_ENOMEM;
    f->cfg = *cfg;
    f->shards = calloc((size_t)ifd_device_replicas(cfg->dev), sizeof *f->shards);
    if (f->shards == NULL) {
        free(f);
        return IFD_ENOMEM;
    }
    ifd_mutex_init(&f->sleep_mu);
    ifd_cond_init(&f->sleep_cv);
    int rc = ifd_opq_start(&f->opq, "ifd-infeed", infeed_main, f, cfg->mode == IFD_MODE_PREDICT);
    if (rc) {
        ifd_cond_fini(&f->sleep_cv);
        ifd_mutex_fini(&f->sleep_mu);
        free(f->shards);
        free(f);
        return rc;
    }
    *out = f;
    return IFD_OK;
}

int ifd_infeed_signal(ifd_infeed *f, int64_t n)
{
    return ifd_opq_signal(f->opq, n);
}

void ifd_infeed_stop(ifd_infeed *f)
{
    if (f) {
        ifd_mutex_lock(&f->sleep_mu);
        f->stopping = 1;
        ifd_cond_broadcast(&f->sleep_cv);
        ifd_mutex_unlock(&f->sleep_mu);
        ifd_opq_join(f->opq);
        ifd_rendezvous_record_done(f->cfg.rv, SOURCE);
    }
}

void ifd_infeed_destroy(ifd_infeed *f)
{
    if (f == NULL)
        return;
    ifd_opq_destroy(f->opq);
    ifd_cond_fini(&f->sleep_cv);
    ifd_mutex_fini(&f->sleep_mu);
    free(f->shards);
    free(f);
}
