#include "core/batch.h"
#include "core/log.h"
#include "core/opqueue.h"
#include "infeed/infeed_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SOURCE "infeed"

struct ifd_infeed {
    ifd_infeed_config cfg;
    ifd_opq *opq;
    ifd_shard *shards;
    int64_t batches; /* atomic */
};

int ifd_infeed_mode_inputs(const ifd_program *p, ifd_mode mode, int idx[IFD_MAX_INPUTS])
{
    int n = 0;
    for (int i = 0; i < p->ninputs; i++)
        if (mode != IFD_MODE_PREDICT || !(p->labels & (1u << i)))
            idx[n++] = i;
    return n;
}

int ifd_infeed_check_batch(const ifd_program *p, const ifd_batch *b, int64_t batch_size,
                           ifd_mode mode, ifd_error *err)
{
    char want[96], got[96];
    int idx[IFD_MAX_INPUTS];
    int n = ifd_infeed_mode_inputs(p, mode, idx);
    if (b->ntensors != n)
        return ifd_error_set(err, IFD_ESHAPE, "has %d tensors, the program '%s' takes %d%s",
                             b->ntensors, p->cls->name, n,
                             mode == IFD_MODE_PREDICT ? " in predict mode (no labels)" : "");
    if (mode == IFD_MODE_PREDICT && batch_size > 0 && (b->rows < 1 || b->rows > batch_size))
        return ifd_error_set(err, IFD_ESHAPE,
                             "has %lld rows, expected 1 to %lld (the batch size; predict mode pads "
                             "a partial batch)",
                             (long long)b->rows, (long long)batch_size);
    if (mode != IFD_MODE_PREDICT && batch_size > 0 && b->rows != batch_size)
        return ifd_error_set(err, IFD_ESHAPE, "has %lld rows, the batch size is %lld",
                             (long long)b->rows, (long long)batch_size);
    for (int j = 0; j < n; j++) {
        int i = idx[j];
        const ifd_input_spec *in = &p->inputs[i];
        const ifd_tensor *t = &b->tensors[j];
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
    if (p->cls->check_batch && mode != IFD_MODE_PREDICT)
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
    int rc = ifd_infeed_check_batch(cfg->program, b, cfg->batch_size, cfg->mode, err);
    if (rc == IFD_OK && b->rows < cfg->batch_size) {
        /* predict mode's partial batch: the padded copy replaces it (and holds it) */
        ifd_batch *padded;
        rc = ifd_infeed_pad_batch(cfg->program, cfg->mode, b, cfg->batch_size, &padded, err);
        if (rc == IFD_OK) {
            ifd_batch_unref(b);
            b = padded;
        }
    }
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

/* The end of the input. Predict mode appends the stopping-signal batch first: every replica's
 * loop ends when it dequeues its shard (the seed's _StoppingPredictHook), the batch never
 * reaching a step. Then the rings close. */
static int end_of_input(ifd_infeed *f, ifd_error *err)
{
    const ifd_infeed_config *cfg = &f->cfg;
    IFD_LOG_INFO("infeed: the input ended after %lld batches",
                 (long long)__atomic_load_n(&f->batches, __ATOMIC_RELAXED));
    int rc = IFD_OK;
    if (cfg->mode == IFD_MODE_PREDICT) {
        ifd_batch *stop;
        rc = ifd_infeed_stop_batch(cfg->program, cfg->mode, cfg->batch_size, &stop, err);
        if (rc == IFD_OK) {
            rc = ifd_shard_batch(cfg->input_mode, stop, ifd_device_replicas(cfg->dev), f->shards,
                                 err);
            for (int r = 0; r < ifd_device_replicas(cfg->dev) && rc == IFD_OK; r++)
                if ((rc = ifd_device_infeed_enqueue(cfg->dev, r, &f->shards[r])))
                    ifd_error_set(err, rc, "device infeed aborted");
            ifd_batch_unref(stop);
        }
        ifd_device_infeed_flush(cfg->dev);
    }
    ifd_device_infeed_end(cfg->dev);
    return rc;
}

static void infeed_main(ifd_opq *q, void *arg)
{
    ifd_infeed *f = arg;
    const ifd_infeed_config *cfg = &f->cfg;
    ifd_error err;
    ifd_error_clear(&err);
    int64_t n, loop = 0;
    while (ifd_opq_next(q, &n)) {
        /* predict: one signal, then batches until the stopping signal (_OpSignalOnceQueue) */
        if (cfg->mode == IFD_MODE_PREDICT)
            n = INT64_MAX;
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
            if (rc == IFD_EEOF && (rc = end_of_input(f, &err)) == IFD_OK)
                return;
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
    int rc = ifd_opq_start(&f->opq, "ifd-infeed", infeed_main, f, cfg->mode == IFD_MODE_PREDICT);
    if (rc) {
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
        ifd_opq_join(f->opq);
        ifd_rendezvous_record_done(f->cfg.rv, SOURCE);
    }
}

void ifd_infeed_destroy(ifd_infeed *f)
{
    if (f == NULL)
        return;
    ifd_opq_destroy(f->opq);
    free(f->shards);
    free(f);
}
