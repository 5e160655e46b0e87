/*
 * The cuda backend's replica threads (cuda_backend.h lists the backend's files): the replication
 * ops on the compute stream, the input layout, the step and the callbacks of device/replicas.h
 * (the op set the step calls is in ops.c).
 */
#include "core/batch.h"
#include "core/thread.h"
#include "device/cuda/cuda_backend.h"

/* ---- the replication ops (device/step.h) ----------------------------------------------------- */

int ifd_cu_allreduce_sum(void *ctx, float *buf, int64_t n, ifd_error *err)
{
    cu_replica *rep = ctx;
    if (rep->comm == NULL)
        return IFD_OK; /* one replica: the sum is the vector itself */
    if (is_aborted(rep->cd))
        return ifd_error_set(err, IFD_ESTOPPED, "all-reduce aborted");
    ncclResult_t r = ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum, rep->comm, rep->cs);
    if (r != ncclSuccess)
        return ifd_error_set(err, IFD_ENCCL, "cuda backend: GPU %d: ncclAllReduce: %s (%s)",
                             rep->gpu, ncclGetErrorString(r), ncclGetLastError(rep->comm));
    return IFD_OK;
}

void ifd_cu_guard_loss(void *ctx, ifd_step_out *out, float *grads)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_guard_loss(rep->cs, out, grads), "guard_loss kernel");
}

void ifd_cu_check_grads(void *ctx, const float *grads, int64_t n, ifd_step_out *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_check_grads(rep->cs, grads, n, out), "check_grads kernel");
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_l2_norm(rep->cs, n, grads, &out->grad_norm),
                        "l2_norm kernel");
}

void ifd_cu_optimizer_apply(void *ctx, const ifd_optimizer *opt, const ifd_replica_state *st,
                            int64_t n, ifd_step_out *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep,
                        ifd_cuda_optimizer_apply(rep->cs, opt, st->opt_step, n, st->params,
                                                 st->grads, st->slot0, st->slot1, st->nodecay,
                                                 st->nnodecay, out),
                        "optimizer kernel");
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_l2_norm(rep->cs, n, st->params, &out->param_norm),
                        "l2_norm kernel");
}

void ifd_cu_finish_step(void *ctx, int64_t *step, int64_t *opt_step, ifd_step_out *out,
                        int64_t rows)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_finish_step(rep->cs, step, opt_step, out, rows),
                        "finish_step kernel");
}

/* ---- input layout ---------------------------------------------------------------------------- */

size_t ifd_cu_row_bytes(const ifd_input_spec *in)
{
    size_t n = ifd_dtype_size(in->dtype);
    for (int d = 0; d < in->rank; d++)
        n *= (size_t)in->dims[d];
    return n;
}

/* A shard of rows rows in a slot: the j-th input the mode takes (ifd_step_inputs: predict mode
 * takes no labels) at offs[j], packed, each aligned to CU_ALIGN, so that one copy moves the whole
 * shard. Writes the inputs' indices to idx and their count to *n; returns the bytes used. */
size_t ifd_cu_shard_layout(const ifd_device_config *cfg, int64_t rows, size_t *offs, int *idx,
                           int *n)
{
    const ifd_program *p = cfg->program;
    size_t off = 0;
    *n = ifd_step_inputs(p, cfg->mode, idx);
    for (int j = 0; j < *n; j++) {
        offs[j] = off;
        off += (size_t)rows * ifd_cu_row_bytes(&p->inputs[idx[j]]);
        off = (off + CU_ALIGN - 1) / CU_ALIGN * CU_ALIGN;
    }
    return off;
}

static void shard_views(const ifd_device_config *cfg, const cu_inslot *s, ifd_tensor *views)
{
    size_t offs[IFD_MAX_INPUTS];
    int idx[IFD_MAX_INPUTS], n;
    ifd_cu_shard_layout(cfg, s->rows, offs, idx, &n);
    for (int j = 0; j < n; j++) {
        const ifd_input_spec *in = &cfg->program->inputs[idx[j]];
        int64_t dims[IFD_MAX_RANK] = {s->rows};
        for (int d = 0; d < in->rank; d++)
            dims[d + 1] = in->dims[d];
        ifd_tensor_init(&views[j], in->dtype, in->rank + 1, dims, s->dev + offs[j]);
    }
}

/* ---- the replica thread ---------------------------------------------------------------------- */

/* The shared step (device/step.h) enqueued on the compute stream. */
static int enqueue_step(cu_replica *rep, cu_inslot *s)
{
    const ifd_device_config *cfg = &rep->cd->dev->cfg;
    ifd_tensor views[IFD_MAX_INPUTS];
    shard_views(cfg, s, views);
    rep->st.outfeeds = rep->cd->out_bytes > 0 && (s->outfeeds & IFD_SHARD_OUTFEEDS)
                           ? (void *const *)s->dtens
                           : NULL;
    rep->op_rc = IFD_OK;
    int rc;
    switch (cfg->mode) {
    case IFD_MODE_EVAL:
        rc = ifd_step_eval(cfg->program, &rep->ops, &rep->cd->sops, rep, &rep->st, views, s->rows,
                           s->dout, &rep->base.err);
        break;
    case IFD_MODE_PREDICT: /* into the slot's own buffer, so that a captured graph can reuse it */
        rc = ifd_step_predict(cfg->program, &rep->ops, &rep->cd->sops, rep, &rep->st, views,
                              s->rows, s->dpred, s->dout, &rep->base.err);
        break;
    default:
        rc = ifd_step_train(cfg->program, &rep->ops, &rep->cd->sops, rep, &rep->st, &cfg->optimizer,
                            cfg->loss_scale, views, s->rows, s->dout, &rep->base.err);
        break;
    }
    if (rep->op_rc) {
        rep->base.err = rep->op_err;
        return rep->op_rc;
    }
    return rc;
}

/*
 * The step as a graph when it can be one. NCCL requires that every rank makes the same choice at
 * every step (captured or not, and which capture), so the choice depends only on what all
 * replicas share: the first step of each replica runs directly (it initialises cuBLAS and loads
 * the kernels outside any capture), later steps whose shard has graph_rows rows run the graph of
 * their slot, captured on the slot's first such use; other row counts run directly. Replicas use
 * their slots in the same order and, with per-host input, get shards of the same size.
 */
static int run_step(cu_replica *rep, cu_inslot *s)
{
    cu_dev *cd = rep->cd;
    int rc = IFD_OK;
    int use_graph = cd->graphs && rep->warmed && s->rows == cd->graph_rows;
    rep->warmed = 1;
    if (!use_graph)
        return enqueue_step(rep, s);
    cudaGraphExec_t *graph = &s->graph[(s->outfeeds & IFD_SHARD_OUTFEEDS) ? 1 : 0];
    if (*graph == NULL) {
        cudaGraph_t g = NULL;
        CUDA_TRY_GOTO(rep->gpu, cudaStreamBeginCapture(rep->cs, cudaStreamCaptureModeThreadLocal),
                      rc, &rep->base.err, fail);
        rc = enqueue_step(rep, s);
        cudaError_t e = cudaStreamEndCapture(rep->cs, &g);
        if (e == cudaSuccess && rc == IFD_OK) {
            e = cudaGraphInstantiate(graph, g, 0);
            if (e != cudaSuccess) {
                *graph = NULL;
                (void)cudaGetLastError();
                rc = ifd_cuda_error(&rep->base.err, rep->gpu, "cudaGraphInstantiate",
                                    cudaGetErrorString(e));
            }
        } else if (e != cudaSuccess) {
            (void)cudaGetLastError();
            if (rc == IFD_OK)
                rc = ifd_cuda_error(&rep->base.err, rep->gpu, "cudaStreamEndCapture",
                                    cudaGetErrorString(e));
        }
        if (g)
            cudaGraphDestroy(g);
        if (rc)
            return rc;
    }
    CUDA_TRY_GOTO(rep->gpu, cudaGraphLaunch(*graph, rep->cs), rc, &rep->base.err, fail);
    return IFD_OK;
fail:
    return rc;
}

/* Enqueues one step. The host waits only for the shard to be staged and for a free outfeed slot;
 * the GPU orders the rest with events. IFD_OK, IFD_EEOF, IFD_ESTOPPED or an error in
 * rep->base.err. */
static int replica_step(cu_replica *rep, int first, int64_t loop_ns)
{
    const ifd_device_config *cfg = &rep->cd->dev->cfg;
    int idx;
    cu_outslot *o;
    int rc = ifd_queue_pop(rep->in_full, &idx);
    if (rc == IFD_ECLOSED)
        return IFD_EEOF;
    if (rc)
        return rc;
    if (rep->in[idx].stop) { /* predict's stopping signal: the loop ends here */
        rep->in[idx].stop = 0;
        ifd_queue_push(rep->in_free, &idx);
        return IFD_EEOF;
    }
    if (rep->cd->use_flags && (rc = ifd_cpu_allreduce_run(&rep->cd->flags, rep->base.index))) {
        ifd_queue_push(rep->in_free, &idx); /* the step runs on no host */
        if (rc == IFD_EEOF)
            return IFD_EEOF;
        if (rc == IFD_ESTOPPED || rep->base.index != 0) {
            ifd_error_set(&rep->base.err, IFD_ESTOPPED, "the hosts' step collective stopped");
            return IFD_ESTOPPED;
        }
        rep->base.err = rep->cd->flags.host_err; /* replica 0's failed collective */
        return rc;
    }
    int64_t t0 = ifd_clock_ns();
    rc = ifd_queue_pop(rep->out_free, &o);
    if (rc)
        return rc;
    cu_inslot *s = &rep->in[idx];
    o->first = first;
    o->from = s->from;
    o->loop_ns = loop_ns;
    o->begin_ns = ifd_clock_ns();
    o->out_wait_ns = o->begin_ns - t0;
    CUDA_TRY_GOTO(rep->gpu, cudaEventRecord(o->begin, rep->cs), rc, &rep->base.err, fail);
    CUDA_TRY_GOTO(rep->gpu, cudaStreamWaitEvent(rep->cs, s->copied, 0), rc, &rep->base.err, fail);
    CUDA_TRY_GOTO(rep->gpu, cudaEventRecord(o->start, rep->cs), rc, &rep->base.err, fail);
    rc = run_step(rep, s);
    if (rc)
        goto fail;
    CUDA_TRY_GOTO(rep->gpu, cudaEventRecord(s->consumed, rep->cs), rc, &rep->base.err, fail);
    s->used = 1;
    CUDA_TRY_GOTO(
        rep->gpu,
        cudaMemcpyAsync(o->host, s->dout, sizeof *o->host, cudaMemcpyDeviceToHost, rep->cs), rc,
        &rep->base.err, fail);
    o->has_out = rep->cd->out_bytes > 0 && (s->outfeeds & IFD_SHARD_OUTFEEDS);
    o->to_sinks = (s->outfeeds & IFD_SHARD_TO_SINKS) != 0;
    if (o->has_out) /* the step's tensors, with its record */
        CUDA_TRY_GOTO(rep->gpu,
                      cudaMemcpyAsync(o->hout, s->dtens[0], (size_t)rep->cd->out_bytes,
                                      cudaMemcpyDeviceToHost, rep->cs),
                      rc, &rep->base.err, fail);
    o->rows = s->rows;
    if (s->batch) { /* predict: the predictions come back with the record, and the batch too */
        size_t bytes = sizeof(float) * (size_t)(s->rows * cfg->program->predict_cols);
        if (bytes)
            CUDA_TRY_GOTO(
                rep->gpu,
                cudaMemcpyAsync(o->hpred, s->dpred, bytes, cudaMemcpyDeviceToHost, rep->cs), rc,
                &rep->base.err, fail);
    }
    CUDA_TRY_GOTO(rep->gpu, cudaEventRecord(o->done, rep->cs), rc, &rep->base.err, fail);
    if (s->batch) { /* only now: on a failure above the reference stays with the input slot */
        o->batch = s->batch;
        o->row0 = s->row0;
        o->rows = s->rows;
        s->batch = NULL;
    }
    if (cfg->mode == IFD_MODE_TRAIN) /* eval and predict leave the global step */
        rep->step++;
    rep->enqueued++;
    o->step = rep->step;
    /* Neither push blocks: each queue holds every slot of its ring. */
    ifd_queue_push(rep->in_free, &idx);
    return ifd_queue_push(rep->out_full, &o);

fail:
    ifd_queue_push(rep->out_free, &o);
    if (!ifd_error_is_secondary(rc) && rc != IFD_EEOF)
        ifd_replica_step_error(&rep->base, cfg->mode, rep->step, rep->enqueued);
    return rc;
}

/* ---- the replica thread's callbacks (device/replicas.h) -------------------------------------- */

/* The thread drives its GPU: every call it makes is on that device. */
static int cu_thread_init(ifd_replica *base, ifd_error *err)
{
    cu_replica *rep = (cu_replica *)base;
    int rc = IFD_OK;
    CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, out);
out:
    return rc;
}

static void cu_loop_begin(ifd_replica *base, int64_t start_ns)
{
    ((cu_replica *)base)->start_ns = start_ns;
}

static int cu_step(ifd_replica *base, int64_t nth)
{
    cu_replica *rep = (cu_replica *)base;
    return replica_step(rep, nth == 0, rep->start_ns);
}

static void store_min64(int64_t *p, int64_t v)
{
    int64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < cur &&
           !__atomic_compare_exchange_n(p, &cur, v, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

/* run_loop returns once the loop's last step finished: wait for it, not for each. */
static int cu_loop_end(ifd_replica *base, int rc, int64_t done)
{
    cu_replica *rep = (cu_replica *)base;
    cu_dev *cd = rep->cd;
    if (rc == IFD_EEOF)
        store_min64(&cd->eof_step, rep->step);
    if (done > 0 && (rc == IFD_OK || rc == IFD_EEOF)) {
        ifd_error e;
        int wrc = IFD_OK;
        CUDA_TRY_GOTO(rep->gpu, cudaEventRecord(rep->loop_end, rep->cs), wrc, &e, waited);
        wrc = ifd_cu_wait_event(cd, rep, rep->loop_end, 0, &e);
    waited:
        if (wrc) {
            rc = wrc;
            rep->base.err = e;
        } else if (rep->base.index == 0) {
            ifd_replicas_publish_step(&cd->set, rep->step);
        }
    }
    return rc;
}

/* The outfeed thread learns there is nothing more once it drained what we wrote. Several hosts:
 * the others learn it from the flags; when another host's input ended, this host's infeed thread
 * may wait for a free slot: it is told the input ended (cu_infeed_enqueue). */
static void cu_input_ended(ifd_replica *base)
{
    cu_replica *rep = (cu_replica *)base;
    cu_dev *cd = rep->cd;
    if (cd->use_flags) {
        if (cd->flags.ended_host >= 0) {
            __atomic_store_n(&cd->hosts_ended, 1, __ATOMIC_RELEASE);
            ifd_queue_close(rep->in_free);
        }
        ifd_cpu_allreduce_leave(&cd->flags);
    }
    ifd_queue_close(rep->out_full);
}

const ifd_replica_ops ifd_cu_replica_ops = {
    .thread_init = cu_thread_init,
    .loop_begin = cu_loop_begin,
    .step = cu_step,
    .loop_end = cu_loop_end,
    .input_ended = cu_input_ended,
};
