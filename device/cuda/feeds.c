/*
 * The cuda backend's infeed, outfeed and session-side entry points, and its table
 * (cuda_backend.h lists the backend's files).
 */
#include "core/batch.h"
#include "device/cuda/cuda_backend.h"

#include <string.h>

/* After an abort, read_state still waits this long for a stream that is merely busy. */
#define CU_READ_GRACE_NS (2 * INT64_C(1000000000))

/* ---- the infeed thread ------------------------------------------------------------------------
 */

/*
 * The one host copy: the shard's rows into a free slot's pinned staging, then the host-to-device
 * copy on the copy stream and its event. A slot is free again once the step that read it was
 * enqueued; before reusing it the infeed thread waits (by polling, so abort interrupts it) for
 * that step to finish, which also means the slot's previous copy finished.
 */
static int cu_infeed_enqueue(ifd_device *dev, int replica, const ifd_shard *shard)
{
    cu_dev *cd = dev->priv;
    cu_replica *rep = &cd->reps[replica];
    const ifd_program *p = dev->cfg.program;
    ifd_error err;
    ifd_error_clear(&err);
    if (is_aborted(cd))
        return IFD_ESTOPPED;
    if (shard->rows < 0 || shard->rows > dev->cfg.max_shard_rows) {
        ifd_error_set(&err, IFD_EINTERNAL,
                      "cuda backend: replica %d: a shard of %lld rows, the staging slots hold %lld",
                      replica, (long long)shard->rows, (long long)dev->cfg.max_shard_rows);
        ifd_replicas_fail(&cd->set, "cuda infeed", &err, IFD_EINTERNAL);
        return IFD_EINTERNAL;
    }
    int idx, rc = ifd_queue_pop(rep->in_free, &idx);
    if (rc == IFD_ECLOSED && __atomic_load_n(&cd->hosts_ended, __ATOMIC_ACQUIRE))
        return IFD_EEOF; /* another host's input ended: so did this run's */
    if (rc)
        return IFD_ESTOPPED;
    cu_inslot *s = &rep->in[idx];
    if (shard->batch->flags & IFD_BATCH_STOP) { /* predict's stopping signal: nothing to stage */
        s->stop = 1;
        s->rows = 0;
        rc = ifd_queue_push(rep->in_full, &idx);
        return rc ? IFD_ESTOPPED : IFD_OK;
    }
    CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, &err, fail);
    if (s->used) {
        rc = ifd_cu_wait_event(cd, NULL, s->consumed, 0, &err);
        if (rc)
            goto fail;
    }
    size_t offs[IFD_MAX_INPUTS];
    int in_idx[IFD_MAX_INPUTS], nin;
    size_t bytes = ifd_cu_shard_layout(&dev->cfg, shard->rows, offs, in_idx, &nin);
    /* A batch in registered host memory (a producer's shared-memory pool) is copied to the
     * device tensor by tensor, straight from where the producer wrote it, and let go once the
     * copy is done; any other is staged (one host copy) and let go at once. */
    int direct = (shard->batch->flags & IFD_BATCH_PINNED) != 0;
    int held = 1; /* this call holds a reference on the batch (released at fail_unref) */
    ifd_batch_ref(shard->batch, 1);
    for (int j = 0; j < nin && shard->rows > 0; j++) {
        const ifd_tensor *t = &shard->batch->tensors[j];
        size_t rb = ifd_cu_row_bytes(&p->inputs[in_idx[j]]);
        const unsigned char *src = (const unsigned char *)t->data + (size_t)shard->row0 * rb;
        if (direct)
            CUDA_TRY_GOTO(rep->gpu,
                          cudaMemcpyAsync(s->dev + offs[j], src, (size_t)shard->rows * rb,
                                          cudaMemcpyHostToDevice, rep->xs),
                          rc, &err, fail_unref);
        else
            memcpy(s->host + offs[j], src, (size_t)shard->rows * rb);
    }
    s->rows = shard->rows;
    s->outfeeds = shard->outfeeds;
    ifd_batch_tag_set(&s->from, shard->batch);
    if (!direct && dev->cfg.mode != IFD_MODE_PREDICT) {
        ifd_batch_unref(shard->batch); /* the device reads the staging copy, never the batch */
        held = 0;
    }
    if (!direct && bytes > 0)
        CUDA_TRY_GOTO(rep->gpu,
                      cudaMemcpyAsync(s->dev, s->host, bytes, cudaMemcpyHostToDevice, rep->xs), rc,
                      &err, fail_unref);
    CUDA_TRY_GOTO(rep->gpu, cudaEventRecord(s->copied, rep->xs), rc, &err, fail_unref);
    if (direct && (rc = ifd_cu_wait_event(cd, NULL, s->copied, 0, &err)) != IFD_OK)
        goto fail_unref;
    if (dev->cfg.mode == IFD_MODE_PREDICT) { /* kept until the outfeed routed the predictions */
        s->batch = shard->batch;
        s->row0 = shard->row0;
    } else if (direct) {
        ifd_batch_unref(shard->batch); /* on the device now */
    }
    rc = ifd_queue_push(rep->in_full, &idx);
    return rc ? IFD_ESTOPPED : IFD_OK;

fail_unref:
    if (held)
        ifd_batch_unref(shard->batch);
fail:
    if (ifd_error_is_secondary(rc))
        return rc;
    ifd_error_prefix(&err, "replica %d infeed", replica);
    ifd_replicas_fail(&cd->set, "cuda infeed", &err, rc);
    return rc;
}

static void cu_infeed_flush(ifd_device *dev)
{
    (void)dev; /* the rings hand every shard over at once */
}

static void cu_infeed_end(ifd_device *dev)
{
    cu_dev *cd = dev->priv;
    for (int r = 0; r < cd->replicas; r++)
        ifd_queue_close(cd->reps[r].in_full);
}

/* ---- the outfeed thread -----------------------------------------------------------------------
 */

static double elapsed_ns(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0.0;
    }
    return (double)ms * 1e6;
}

/*
 * Times a finished step on the host clock (docs/cuda.md): the first step of a loop from its begin
 * event, recorded while the GPU was idle (the previous loop was waited for), so at about
 * begin_ns; a later step from the previous step's done event, held for this. The GPU's idle gap
 * before the step (from the previous step's end, or the loop's start, to the step's start) is
 * the time it waited: for a free outfeed slot as long as the host did, the rest for the infeed.
 */
static void time_step(cu_replica *rep, const cu_outslot *o, ifd_outfeed_rec *rec)
{
    cudaEvent_t ref;
    double ref_ns, prev_ns;
    if (o->first || rep->held == NULL) {
        ref = o->begin;
        ref_ns = (double)o->begin_ns;
        prev_ns = (double)o->loop_ns;
    } else {
        ref = rep->held->done;
        ref_ns = prev_ns = (double)rep->last_end_ns;
    }
    double start = ref_ns + elapsed_ns(ref, o->start);
    double end = ref_ns + elapsed_ns(ref, o->done);
    if (end < prev_ns)
        end = prev_ns;
    if (start < prev_ns)
        start = prev_ns;
    if (start > end)
        start = end;
    int64_t gap = (int64_t)(start - prev_ns);
    rec->end_ns = (int64_t)end;
    rec->step_ns = (int64_t)(end - prev_ns);
    rec->outfeed_wait_ns = gap < o->out_wait_ns ? gap : o->out_wait_ns;
    rec->infeed_wait_ns = gap - rec->outfeed_wait_ns;
}

static int cu_outfeed_dequeue(ifd_device *dev, int replica, ifd_outfeed_rec *rec)
{
    cu_dev *cd = dev->priv;
    cu_replica *rep = &cd->reps[replica];
    cu_outslot *o;
    int rc = ifd_queue_pop(rep->out_full, &o);
    if (rc == IFD_ECLOSED)
        return IFD_EEOF;
    if (rc)
        return rc;
    ifd_error err;
    ifd_error_clear(&err);
    CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, &err, fail);
    rc = ifd_cu_wait_event(cd, NULL, o->done, 0, &err);
    if (rc)
        goto fail;
    rec->step = o->step;
    rec->out = *o->host;
    rec->from = o->from;
    rec->batch = o->batch; /* predict: the reference goes to the outfeed thread */
    rec->row0 = o->row0;
    rec->rows = o->rows;
    rec->pred = o->batch ? o->hpred : NULL;     /* valid while o is held: until the next dequeue */
    rec->outfeed = o->has_out ? o->hout : NULL; /* likewise */
    rec->to_sinks = o->to_sinks;
    o->batch = NULL;
    time_step(rep, o, rec);
    rep->last_end_ns = rec->end_ns;
    if (rep->held)
        ifd_queue_push(rep->out_free, &rep->held);
    rep->held = o;
    ifd_replica_stats_add(&rep->base, 1, rec->step_ns, rec->infeed_wait_ns, rec->outfeed_wait_ns);
    if (replica == 0)
        ifd_replicas_publish_step(&cd->set, o->step);
    return IFD_OK;

fail:
    if (o->batch) { /* predict: the record's batch, never routed */
        ifd_batch_unref(o->batch);
        o->batch = NULL;
    }
    ifd_queue_push(rep->out_free, &o);
    if (!ifd_error_is_secondary(rc))
        ifd_replicas_fail(&cd->set, "cuda outfeed", &err, rc);
    return rc;
}

/* ---- the session's thread ----------------------------------------------------------------------
 */

static int cu_read_state(ifd_device *dev, int replica, float *params, float *slots,
                         int64_t *opt_step, ifd_error *err)
{
    cu_dev *cd = dev->priv;
    if (replica < 0 || replica >= cd->replicas)
        return ifd_error_set(err, IFD_EINVAL, "replica: expected 0 to %d, got %d", cd->replicas - 1,
                             replica);
    cu_replica *rep = &cd->reps[replica];
    size_t param_bytes = sizeof(float) * (size_t)dev->cfg.program->nparam_floats;
    size_t slot_bytes = sizeof(float) * (size_t)ifd_replica_slot_floats(&dev->cfg);
    int rc = IFD_OK;
    ifd_error e;
    CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, &e, fail);
    /* Make sure the stream is idle before a blocking copy: after an abort it may never be. */
    CUDA_TRY_GOTO(rep->gpu, cudaEventRecord(rep->sync_ev, rep->cs), rc, &e, fail);
    rc = ifd_cu_wait_event(cd, NULL, rep->sync_ev, CU_READ_GRACE_NS, &e);
    if (rc)
        goto fail;
    if (params)
        CUDA_TRY_GOTO(
            rep->gpu,
            cudaMemcpyAsync(params, rep->st.params, param_bytes, cudaMemcpyDeviceToHost, rep->cs),
            rc, &e, fail);
    if (slots && slot_bytes)
        CUDA_TRY_GOTO(
            rep->gpu,
            cudaMemcpyAsync(slots, rep->st.slot0, slot_bytes, cudaMemcpyDeviceToHost, rep->cs), rc,
            &e, fail);
    if (opt_step)
        CUDA_TRY_GOTO(rep->gpu,
                      cudaMemcpyAsync(opt_step, rep->st.opt_step, sizeof *opt_step,
                                      cudaMemcpyDeviceToHost, rep->cs),
                      rc, &e, fail);
    CUDA_TRY_GOTO(rep->gpu, cudaStreamSynchronize(rep->cs), rc, &e, fail);
    return IFD_OK;
fail:
    if (err)
        *err = e;
    return rc;
}

/* Staged shards (in_full); step records not handed to the outfeed thread, counted from the free
 * slots (one of the nout stays held by the outfeed thread, so outfeed_depth are the ring). */
static void cu_stats(ifd_device *dev, int replica, ifd_device_stats *out)
{
    cu_dev *cd = dev->priv;
    cu_replica *rep = &cd->reps[replica];
    ifd_replicas_stats(dev, replica, out);
    int64_t cap = rep->nout - 1, used = cap - (int64_t)ifd_queue_len(rep->out_free);
    out->infeed_len = (int64_t)ifd_queue_len(rep->in_full);
    out->infeed_cap = rep->nin;
    out->outfeed_len = used < 0 ? 0 : used;
    out->outfeed_cap = cap;
}

/* Wakes every thread blocked on a ring; event polls see the flag. Work already on a GPU stream
 * cannot be interrupted: it runs out, or close aborts the communicators it waits on. */
static void cu_abort(ifd_device *dev)
{
    cu_dev *cd = dev->priv;
    ifd_replicas_abort(&cd->set);
    if (cd->use_flags)
        ifd_cpu_allreduce_abort(&cd->flags);
    for (int r = 0; r < cd->replicas; r++) {
        ifd_queue_abort(cd->reps[r].in_free);
        ifd_queue_abort(cd->reps[r].in_full);
        ifd_queue_abort(cd->reps[r].out_free);
        ifd_queue_abort(cd->reps[r].out_full);
    }
}

/* Host memory batches will live in (a producer's shared-memory pool, which the daemon maps
 * read-only), registered with every context (portable) so that cu_infeed_enqueue copies
 * IFD_BATCH_PINNED batches straight from it. */
static int cu_host_register(ifd_device *dev, void *p, size_t len, ifd_error *err)
{
    cu_dev *cd = dev->priv;
    int gpu = cd->reps[0].gpu;
    cudaError_t e = cudaSetDevice(gpu);
    if (e == cudaSuccess)
        e = cudaHostRegister(p, len, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ifd_cuda_error(err, gpu, "cudaHostRegister", cudaGetErrorString(e));
    }
    return IFD_OK;
}

static void cu_host_unregister(ifd_device *dev, void *p)
{
    (void)dev;
    if (cudaHostUnregister(p) != cudaSuccess)
        (void)cudaGetLastError();
}

const ifd_device_backend ifd_device_backend_cuda = {
    .name = "cuda",
    .priv_size = sizeof(cu_dev),
    .open = ifd_cu_open,
    .close = ifd_cu_close,
    .infeed_enqueue = cu_infeed_enqueue,
    .infeed_flush = cu_infeed_flush,
    .infeed_end = cu_infeed_end,
    .outfeed_dequeue = cu_outfeed_dequeue,
    .run_loop = ifd_replicas_run_loop,
    .read_state = cu_read_state,
    .global_step = ifd_replicas_global_step,
    .stats = cu_stats,
    .abort = cu_abort,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
};
