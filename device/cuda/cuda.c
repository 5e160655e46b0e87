/*
 * The cuda backend (cuda_backend.h lists its files): errors, the event wait that abort interrupts,
 * and open and close.
 */
#include "core/batch.h"
#include "core/log.h"
#include "core/thread.h"
#include "device/cuda/cuda_backend.h"
#include "device/cuda/opset.h"
#include <infeed/hosts.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuBLAS workspace per handle, set explicitly so that a captured GEMM never allocates (the
 * cuBLAS documentation recommends 32 MiB on Hopper, 4 MiB before). */
#define CU_BLAS_WORKSPACE (32u << 20)

/* ---- errors ----------------------------------------------------------------------------- */

/* "cudaMalloc(&p, n)" -> "cudaMalloc" */
static void call_name(const char *expr, char *out, size_t len)
{
    size_t n = strcspn(expr, "(");
    if (n >= len)
        n = len - 1;
    memcpy(out, expr, n);
    out[n] = '\0';
}

static int lib_error(ifd_error *err, int code, int gpu, const char *expr, const char *text)
{
    char name[64];
    call_name(expr, name, sizeof name);
    if (gpu < 0)
        return ifd_error_set(err, code, "cuda backend: %s: %s", name, text);
    return ifd_error_set(err, code, "cuda backend: GPU %d: %s: %s", gpu, name, text);
}

int ifd_cuda_error(ifd_error *err, int gpu, const char *expr, const char *text)
{
    return lib_error(err, IFD_ECUDA, gpu, expr, text);
}

int ifd_nccl_error(ifd_error *err, int gpu, const char *expr, const char *text)
{
    return lib_error(err, IFD_ENCCL, gpu, expr, text);
}

#define BLAS_TRY_GOTO(gpu, call, rc, err, label)                                                   \
    do {                                                                                           \
        cublasStatus_t blas_try_s_ = (call);                                                       \
        if (blas_try_s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            (rc) = ifd_cuda_error((err), (gpu), #call, cublasGetStatusString(blas_try_s_));        \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/*
 * Waits for ev on the host by polling (a short spin, then sleeps growing to 100 us), so that
 * abort interrupts it: a blocking cudaEventSynchronize could not be, and a step whose all-reduce
 * waits for a peer that will never come never finishes. After an abort it keeps polling for
 * grace_ns before it gives up with IFD_ESTOPPED. rep may be NULL; when given, a wait for a step
 * beyond the one at which some replica's input ended fails at once instead of hanging.
 */
int ifd_cu_wait_event(cu_dev *cd, cu_replica *rep, cudaEvent_t ev, int64_t grace_ns, ifd_error *err)
{
    int64_t sleep_ns = 1000, give_up = 0;
    int gpu = rep ? rep->gpu : -1;
    for (int i = 0;; i++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return IFD_OK;
        (void)cudaGetLastError(); /* cudaErrorNotReady must not linger as the last error */
        if (e != cudaErrorNotReady)
            return ifd_cuda_error(err, gpu, "cudaEventQuery", cudaGetErrorString(e));
        if (is_aborted(cd)) {
            int64_t now = ifd_clock_ns();
            if (give_up == 0)
                give_up = now + grace_ns;
            if (now >= give_up)
                return ifd_error_set(err, IFD_ESTOPPED, "device aborted");
        }
        if (rep && rep->step > __atomic_load_n(&cd->eof_step, __ATOMIC_ACQUIRE))
            return ifd_error_set(err, IFD_EINTERNAL,
                                 "cuda backend: replica %d enqueued step %lld but a peer's input "
                                 "ended at step %lld; its all-reduce can never finish (shards "
                                 "must come to every replica alike)",
                                 rep->base.index, (long long)rep->step,
                                 (long long)__atomic_load_n(&cd->eof_step, __ATOMIC_ACQUIRE));
        if (i < 64) {
            ifd_cpu_relax();
            continue;
        }
        ifd_sleep_ns(sleep_ns);
        if (sleep_ns < 100000)
            sleep_ns *= 2;
    }
}

/* ---- open and close ---------------------------------------------------------------------------
 */

/* The replica's streams and its cuBLAS handle (on its stream, with a workspace of its own). */
static int replica_streams(cu_replica *rep, ifd_error *err)
{
    int gpu = rep->gpu, rc = IFD_OK;
    CUDA_TRY_GOTO(gpu, cudaSetDevice(gpu), rc, err, out);
    CUDA_TRY_GOTO(gpu, cudaStreamCreateWithFlags(&rep->cs, cudaStreamNonBlocking), rc, err, out);
    CUDA_TRY_GOTO(gpu, cudaStreamCreateWithFlags(&rep->xs, cudaStreamNonBlocking), rc, err, out);
    BLAS_TRY_GOTO(gpu, cublasCreate(&rep->blas), rc, err, out);
    BLAS_TRY_GOTO(gpu, cublasSetStream(rep->blas, rep->cs), rc, err, out);
    BLAS_TRY_GOTO(gpu, cublasSetMathMode(rep->blas, CUBLAS_DEFAULT_MATH), rc, err, out);
    CUDA_TRY_GOTO(gpu, cudaMalloc(&rep->blas_ws, CU_BLAS_WORKSPACE), rc, err, out);
    BLAS_TRY_GOTO(gpu, cublasSetWorkspace(rep->blas, rep->blas_ws, CU_BLAS_WORKSPACE), rc, err,
                  out);
out:
    return rc;
}

/* The replica's device state: parameters (init), gradients, slots (cfg->init_slots or zeros),
 * scratch, and the step counters, carved as the step body expects (device/step.h). */
static int replica_state(cu_dev *cd, cu_replica *rep, const float *init, ifd_error *err)
{
    const ifd_device_config *cfg = &cd->dev->cfg;
    int64_t np = cfg->program->nparam_floats;
    int gpu = rep->gpu, rc = IFD_OK;
    size_t mem_floats = (size_t)ifd_replica_mem_floats(cfg);
    CUDA_TRY_GOTO(gpu, cudaMalloc((void **)&rep->dmem, mem_floats * sizeof(float)), rc, err, out);
    CUDA_TRY_GOTO(gpu, cudaMemset(rep->dmem, 0, mem_floats * sizeof(float)), rc, err, out);
    CUDA_TRY_GOTO(gpu,
                  cudaMemcpy(rep->dmem, init, (size_t)np * sizeof(float), cudaMemcpyHostToDevice),
                  rc, err, out);
    if (cfg->init_slots)
        CUDA_TRY_GOTO(gpu,
                      cudaMemcpy(rep->dmem + 2 * np, cfg->init_slots,
                                 (size_t)ifd_replica_slot_floats(cfg) * sizeof(float),
                                 cudaMemcpyHostToDevice),
                      rc, err, out);
    /* the step counters, then AdamW's ranges left out of decay */
    size_t nsteps = 2 + 2 * (size_t)cfg->program->nparams;
    int64_t *steps = malloc(nsteps * sizeof *steps);
    if (steps == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "cuda backend: GPU %d: step counters", gpu);
    steps[0] = cfg->initial_step;
    steps[1] = cfg->init_opt_step;
    int64_t nodecay =
        ifd_optimizer_nodecay_ranges(cfg->program->params, cfg->program->nparams, steps + 2);
    CUDA_TRY_GOTO(gpu, cudaMalloc((void **)&rep->dsteps, nsteps * sizeof *steps), rc, err,
                  free_steps);
    CUDA_TRY_GOTO(gpu,
                  cudaMemcpy(rep->dsteps, steps, nsteps * sizeof *steps, cudaMemcpyHostToDevice),
                  rc, err, free_steps);
    ifd_replica_mem_carve(&rep->st, rep->dmem, np);
    rep->st.step = &rep->dsteps[0];
    rep->st.opt_step = &rep->dsteps[1];
    rep->st.nodecay = &rep->dsteps[2];
    rep->st.nnodecay = nodecay;
free_steps:
    free(steps);
out:
    return rc;
}

/* The infeed slots: pinned staging, device input, predictions, step outputs and their events. */
static int replica_in_slots(cu_dev *cd, cu_replica *rep, ifd_error *err)
{
    int gpu = rep->gpu, rc = IFD_OK;
    CUDA_TRY_GOTO(gpu, cudaMalloc((void **)&rep->dout, (size_t)rep->nin * sizeof(ifd_step_out)), rc,
                  err, out);
    CUDA_TRY_GOTO(gpu, cudaMemset(rep->dout, 0, (size_t)rep->nin * sizeof(ifd_step_out)), rc, err,
                  out);
    for (int i = 0; i < rep->nin; i++) {
        cu_inslot *s = &rep->in[i];
        s->dout = &rep->dout[i];
        CUDA_TRY_GOTO(gpu, cudaHostAlloc((void **)&s->host, cd->in_bytes, cudaHostAllocPortable),
                      rc, err, out);
        CUDA_TRY_GOTO(gpu, cudaMalloc((void **)&s->dev, cd->in_bytes), rc, err, out);
        if (cd->pred_floats)
            CUDA_TRY_GOTO(gpu,
                          cudaMalloc((void **)&s->dpred, (size_t)cd->pred_floats * sizeof(float)),
                          rc, err, out);
        if (cd->out_bytes > 0) {
            CUDA_TRY_GOTO(gpu, cudaMalloc(&s->dtens[0], (size_t)cd->out_bytes), rc, err, out);
            CUDA_TRY_GOTO(gpu, cudaMemset(s->dtens[0], 0, (size_t)cd->out_bytes), rc, err, out);
            for (int t = 1; t < cd->dev->cfg.program->noutfeeds; t++)
                s->dtens[t] = (unsigned char *)s->dtens[0] + cd->out_offs[t];
        }
        CUDA_TRY_GOTO(gpu, cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming), rc, err,
                      out);
        CUDA_TRY_GOTO(gpu, cudaEventCreateWithFlags(&s->consumed, cudaEventDisableTiming), rc, err,
                      out);
    }
out:
    return rc;
}

/* The outfeed slots (pinned step outputs and predictions, timing events) and the loop's events. */
static int replica_out_slots(cu_dev *cd, cu_replica *rep, ifd_error *err)
{
    int gpu = rep->gpu, rc = IFD_OK;
    CUDA_TRY_GOTO(gpu,
                  cudaHostAlloc((void **)&rep->out_host, (size_t)rep->nout * sizeof(ifd_step_out),
                                cudaHostAllocPortable),
                  rc, err, out);
    for (int i = 0; i < rep->nout; i++) {
        cu_outslot *o = &rep->out[i];
        o->host = &rep->out_host[i];
        if (cd->pred_floats)
            CUDA_TRY_GOTO(gpu,
                          cudaHostAlloc((void **)&o->hpred, (size_t)cd->pred_floats * sizeof(float),
                                        cudaHostAllocPortable),
                          rc, err, out);
        if (cd->out_bytes > 0)
            CUDA_TRY_GOTO(
                gpu, cudaHostAlloc((void **)&o->hout, (size_t)cd->out_bytes, cudaHostAllocPortable),
                rc, err, out);
        CUDA_TRY_GOTO(gpu, cudaEventCreate(&o->begin), rc, err, out);
        CUDA_TRY_GOTO(gpu, cudaEventCreate(&o->start), rc, err, out);
        CUDA_TRY_GOTO(gpu, cudaEventCreate(&o->done), rc, err, out);
    }
    CUDA_TRY_GOTO(gpu, cudaEventCreateWithFlags(&rep->loop_end, cudaEventDisableTiming), rc, err,
                  out);
    CUDA_TRY_GOTO(gpu, cudaEventCreateWithFlags(&rep->sync_ev, cudaEventDisableTiming), rc, err,
                  out);
out:
    return rc;
}

/* The rings of free and full slots, every slot free. */
static int replica_rings(cu_replica *rep, int index, ifd_error *err)
{
    if (ifd_queue_create(&rep->in_free, sizeof(int), (size_t)rep->nin) ||
        ifd_queue_create(&rep->in_full, sizeof(int), (size_t)rep->nin) ||
        ifd_queue_create(&rep->out_free, sizeof(cu_outslot *), (size_t)rep->nout) ||
        ifd_queue_create(&rep->out_full, sizeof(cu_outslot *), (size_t)rep->nout))
        return ifd_error_set(err, IFD_ENOMEM, "cuda backend: replica %d rings", index);
    for (int i = 0; i < rep->nin; i++)
        ifd_queue_push(rep->in_free, &i);
    for (int i = 0; i < rep->nout; i++) {
        cu_outslot *o = &rep->out[i];
        ifd_queue_push(rep->out_free, &o);
    }
    return IFD_OK;
}

/* The op set the program's step calls (replica.c). */
static void replica_ops(cu_replica *rep)
{
    rep->ops.ctx = rep;
    rep->ops.gemm = ifd_cu_gemm;
    rep->ops.bias_add = ifd_cu_bias_add;
    rep->ops.col_sum = ifd_cu_col_sum;
    rep->ops.relu = ifd_cu_relu;
    rep->ops.relu_grad = ifd_cu_relu_grad;
    rep->ops.tanh = ifd_cu_tanh;
    rep->ops.tanh_grad = ifd_cu_tanh_grad;
    rep->ops.l2_decay = ifd_cu_l2_decay;
    rep->ops.softmax_xent = ifd_cu_softmax_xent;
    rep->ops.softmax = ifd_cu_softmax;
    rep->ops.squared_error = ifd_cu_squared_error;
    rep->ops.classify = ifd_cu_classify;
    rep->ops.copy = ifd_cu_copy;
    rep->ops.softmax_xent_classify = ifd_cu_softmax_xent_classify;
    rep->ops.fill = ifd_cu_fill;
    rep->ops.add = ifd_cu_add;
    rep->ops.gemm_strided_batched = ifd_cu_gemm_strided_batched;
    rep->ops.embedding = ifd_cu_embedding;
    rep->ops.embedding_grad = ifd_cu_embedding_grad;
    rep->ops.layernorm = ifd_cu_layernorm;
    rep->ops.layernorm_grad = ifd_cu_layernorm_grad;
    rep->ops.gelu = ifd_cu_gelu;
    rep->ops.gelu_grad = ifd_cu_gelu_grad;
    rep->ops.attention = ifd_cu_attention;
    rep->ops.attention_grad = ifd_cu_attention_grad;
    rep->ops.gemm_bias = ifd_cu_gemm_bias;
}

/* One replica on GPU `index`; what it made is freed by the backend's close whatever failed. */
static int replica_open(cu_dev *cd, cu_replica *rep, int index, const float *init, ifd_error *err)
{
    const ifd_device_config *cfg = &cd->dev->cfg;
    int rc;
    rep->gpu = index;
    rep->cd = cd;
    rep->step = cfg->initial_step;
    rep->nin = cfg->infeed_depth;
    rep->nout = cfg->outfeed_depth + 1; /* one stays held by the outfeed thread */
    rep->in = calloc((size_t)rep->nin, sizeof *rep->in);
    rep->out = calloc((size_t)rep->nout, sizeof *rep->out);
    if (rep->in == NULL || rep->out == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "cuda backend: replica %d slots", index);
    if ((rc = replica_streams(rep, err)) || (rc = replica_state(cd, rep, init, err)) ||
        (rc = replica_in_slots(cd, rep, err)) || (rc = replica_out_slots(cd, rep, err)))
        return rc;
    /* The cudaMemset and cudaMemcpy calls above run on the legacy default stream, which the
     * non-blocking streams do not wait for, and may still be in flight when they return (memset of
     * device memory, copies from pageable memory): wait for them before any stream reads dmem. */
    CUDA_TRY_GOTO(index, cudaDeviceSynchronize(), rc, err, out);
    if ((rc = replica_rings(rep, index, err)))
        return rc;
    replica_ops(rep);
out:
    return rc;
}

/*
 * One communicator per local GPU, created from one ncclUniqueId with ncclCommInitRank inside a
 * group (one thread initialises every local rank). Several hosts: one communicator over every
 * GPU of every host (nranks = hosts x replicas), the id rank 0's (hosts_nccl_id), this host's
 * first rank its first global replica.
 */
static int nccl_open(cu_dev *cd, const ncclUniqueId *id, int nranks, int first_rank, ifd_error *err)
{
    int rc = IFD_OK, r = 0;
    NCCL_TRY_GOTO(-1, ncclGroupStart(), rc, err, out);
    for (r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, end_group);
        NCCL_TRY_GOTO(rep->gpu, ncclCommInitRank(&rep->comm, nranks, *id, first_rank + r), rc, err,
                      end_group);
    }
end_group:;
    ncclResult_t g = ncclGroupEnd();
    if (rc == IFD_OK && g != ncclSuccess)
        rc = ifd_nccl_error(err, -1, "ncclGroupEnd", ncclGetErrorString(g));
    if (rc)
        goto out;
    /* One all-reduce of the gradient vector now: NCCL connects its peers at a communicator's
     * first collective, a host-side handshake that must not happen inside a step or a capture. */
    NCCL_TRY_GOTO(-1, ncclGroupStart(), rc, err, out);
    for (r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        ncclResult_t a =
            ncclAllReduce(rep->st.grads, rep->st.grads, (size_t)cd->dev->cfg.program->nparam_floats,
                          ncclFloat, ncclSum, rep->comm, rep->cs);
        if (a != ncclSuccess && rc == IFD_OK)
            rc = ifd_nccl_error(err, rep->gpu, "ncclAllReduce", ncclGetErrorString(a));
    }
    g = ncclGroupEnd();
    if (rc == IFD_OK && g != ncclSuccess)
        rc = ifd_nccl_error(err, -1, "ncclGroupEnd", ncclGetErrorString(g));
    for (r = 0; rc == IFD_OK && r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, out);
        CUDA_TRY_GOTO(rep->gpu, cudaStreamSynchronize(rep->cs), rc, err, out);
    }
out:
    return rc;
}

/* Several hosts: every host has as many GPUs in the job (the ranks and the batch split assume
 * it), and gets rank 0's ncclUniqueId, over the LOOP channel (ifd_cu_open runs on the session's
 * thread before any loop). */
static int hosts_nccl_id(cu_dev *cd, const ifd_hosts *h, ncclUniqueId *id, ifd_error *err)
{
    int64_t lo = cd->replicas, hi = cd->replicas;
    int rc = h->ops->allreduce_i64(h->ctx, IFD_HOSTS_LOOP, &lo, 1, IFD_HOSTS_MIN, NULL, NULL, err);
    if (rc == IFD_OK)
        rc = h->ops->allreduce_i64(h->ctx, IFD_HOSTS_LOOP, &hi, 1, IFD_HOSTS_MAX, NULL, NULL, err);
    if (rc)
        return rc;
    if (lo != hi)
        return ifd_error_set(err, IFD_EINVAL,
                             "cuda backend: replicas: host %d has %d GPUs in the job, other hosts "
                             "from %lld to %lld; every host needs the same --replicas (one NCCL "
                             "rank a GPU, the global batch split evenly)",
                             h->rank, cd->replicas, (long long)lo, (long long)hi);
    memset(id, 0, sizeof *id);
    if (h->rank == 0) {
        ncclResult_t g = ncclGetUniqueId(id);
        if (g != ncclSuccess)
            rc = ifd_nccl_error(err, -1, "ncclGetUniqueId", ncclGetErrorString(g));
    }
    /* A failed ncclGetUniqueId on rank 0 still sends (zeros), so that no host waits here; rank
     * 0 then fails, and its abort ends the job. */
    ifd_error berr;
    ifd_error_clear(&berr);
    int brc = h->ops->broadcast(h->ctx, IFD_HOSTS_LOOP, id, sizeof *id, 0, NULL, NULL, &berr);
    if (rc == IFD_OK && brc) {
        *err = berr;
        rc = brc;
    }
    return rc;
}

/* What replica_streams made (the caller has waited for the streams). */
static void replica_streams_free(cu_replica *rep)
{
    if (rep->blas)
        cublasDestroy(rep->blas);
    cudaFree(rep->blas_ws);
    if (rep->xs)
        cudaStreamDestroy(rep->xs);
    if (rep->cs)
        cudaStreamDestroy(rep->cs);
    (void)cudaGetLastError();
}

static void replica_free(cu_replica *rep)
{
    if (rep->in == NULL) {
        free(rep->out); /* replica_open's calloc of in failed, or it never ran */
        rep->out = NULL;
        return;
    }
    cudaSetDevice(rep->gpu);
    if (rep->cs)
        cudaStreamSynchronize(rep->cs);
    if (rep->xs)
        cudaStreamSynchronize(rep->xs);
    for (int i = 0; i < rep->nin; i++) {
        cu_inslot *s = &rep->in[i];
        if (s->copied)
            cudaEventDestroy(s->copied);
        if (s->consumed)
            cudaEventDestroy(s->consumed);
        cudaFreeHost(s->host);
        cudaFree(s->dev);
        cudaFree(s->dpred);
        cudaFree(s->dtens[0]);
        if (s->batch) /* predict: a shard no step took */
            ifd_batch_unref(s->batch);
        s->batch = NULL;
    }
    for (int i = 0; i < rep->nout; i++) {
        cu_outslot *o = &rep->out[i];
        if (o->begin)
            cudaEventDestroy(o->begin);
        if (o->start)
            cudaEventDestroy(o->start);
        if (o->done)
            cudaEventDestroy(o->done);
        cudaFreeHost(o->hpred);
        cudaFreeHost(o->hout);
        if (o->batch) /* predict: a record the outfeed thread never took */
            ifd_batch_unref(o->batch);
        o->batch = NULL;
    }
    if (rep->loop_end)
        cudaEventDestroy(rep->loop_end);
    if (rep->sync_ev)
        cudaEventDestroy(rep->sync_ev);
    cudaFreeHost(rep->out_host);
    cudaFree(rep->dout);
    cudaFree(rep->dsteps);
    cudaFree(rep->dmem);
    replica_streams_free(rep);
    ifd_queue_destroy(rep->in_free);
    ifd_queue_destroy(rep->in_full);
    ifd_queue_destroy(rep->out_free);
    ifd_queue_destroy(rep->out_full);
    free(rep->in);
    free(rep->out);
    rep->in = NULL;
    rep->out = NULL;
}

/*
 * Communicators go first. After an abort a step may be stuck in an all-reduce that waits for a
 * peer that never launched its own, which no stream synchronisation would outlive:
 * ncclCommAbort stops such kernels. A clean close finalizes every local rank in one group (the
 * collective flush) and then destroys them locally.
 */
static void nccl_close(cu_dev *cd, int abort_comms)
{
    int have = 0;
    for (int r = 0; r < cd->replicas; r++)
        have |= cd->reps[r].comm != NULL;
    if (!have)
        return;
    if (abort_comms) {
        for (int r = 0; r < cd->replicas; r++) {
            if (cd->reps[r].comm) {
                cudaSetDevice(cd->reps[r].gpu);
                ncclCommAbort(cd->reps[r].comm);
                cd->reps[r].comm = NULL;
            }
        }
        return;
    }
    ncclGroupStart();
    for (int r = 0; r < cd->replicas; r++) {
        if (cd->reps[r].comm) {
            cudaSetDevice(cd->reps[r].gpu);
            ncclCommFinalize(cd->reps[r].comm);
        }
    }
    ncclGroupEnd();
    for (int r = 0; r < cd->replicas; r++) {
        if (cd->reps[r].comm) {
            ncclCommDestroy(cd->reps[r].comm);
            cd->reps[r].comm = NULL;
        }
    }
}

void ifd_cu_close(ifd_device *dev)
{
    cu_dev *cd = dev->priv;
    if (cd->reps == NULL)
        return;
    ifd_replicas_stop(&cd->set);
    /* Graphs that captured an all-reduce hold their communicator: they go before it. A graph
     * still running is freed when it completes. */
    for (int r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        for (int i = 0; rep->in && i < rep->nin; i++) {
            for (int k = 0; k < 2; k++) {
                if (rep->in[i].graph[k]) {
                    cudaSetDevice(rep->gpu);
                    cudaGraphExecDestroy(rep->in[i].graph[k]);
                    rep->in[i].graph[k] = NULL;
                }
            }
        }
    }
    nccl_close(cd, is_aborted(cd));
    if (cd->use_flags) {
        ifd_cpu_allreduce_fini(&cd->flags);
        cd->use_flags = 0;
    }
    for (int r = 0; r < cd->replicas; r++)
        replica_free(&cd->reps[r]);
    ifd_replicas_fini(&cd->set);
    free(cd->reps);
    cd->reps = NULL;
}

/* The GPUs visible here, checked against the replicas asked for (one replica a GPU). */
static int count_gpus(const ifd_device_config *cfg, int *visible, ifd_error *err)
{
    cudaError_t e = cudaGetDeviceCount(visible);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ifd_error_set(err, IFD_ECUDA, "cuda backend: no usable GPU: cudaGetDeviceCount: %s",
                             cudaGetErrorString(e));
    }
    if (*visible == 0)
        return ifd_error_set(err, IFD_ECUDA,
                             "cuda backend: no usable GPU: cudaGetDeviceCount: 0 devices visible");
    if (cfg->replicas < 1 || cfg->replicas > *visible) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        return ifd_error_set(err, IFD_EINVAL,
                             "cuda backend: replicas: %d requested, but %d GPU%s visible "
                             "(CUDA_VISIBLE_DEVICES=%s); one replica runs per GPU",
                             cfg->replicas, *visible, *visible == 1 ? " is" : "s are",
                             cvd ? cvd : "(unset)");
    }
    return IFD_OK;
}

/* Sizes of a replica's slots and the step ops, from the config (no CUDA call). */
static void plan_device(cu_dev *cd, const ifd_device_config *cfg)
{
    size_t offs[IFD_MAX_INPUTS];
    int idx[IFD_MAX_INPUTS], nin;
    cd->in_bytes = ifd_cu_shard_layout(cfg, cfg->max_shard_rows, offs, idx, &nin);
    cd->pred_floats =
        cfg->mode == IFD_MODE_PREDICT ? cfg->max_shard_rows * cfg->program->predict_cols : 0;
    if (cd->in_bytes == 0)
        cd->in_bytes = CU_ALIGN;
    cd->graph_rows = cfg->max_shard_rows % cfg->replicas == 0 ? cfg->max_shard_rows / cfg->replicas
                                                              : -1; /* the per-host shard */
    cd->sops.allreduce_sum = ifd_cu_allreduce_sum;
    cd->sops.guard_loss = ifd_cu_guard_loss;
    cd->sops.check_grads = ifd_cu_check_grads;
    cd->sops.optimizer_apply = ifd_cu_optimizer_apply;
    cd->sops.finish_step = ifd_cu_finish_step;
    cd->out_bytes =
        cfg->mode == IFD_MODE_PREDICT
            ? 0
            : ifd_program_outfeed_layout(cfg->program, cfg->max_shard_rows, cd->out_offs);
}

/* Several hosts: the hosts' step flags (train and eval; predict runs per host), and for
 * training one NCCL communicator over every GPU of every host; one host with several GPUs: a
 * communicator over its own. */
static int open_collectives(cu_dev *cd, const ifd_device_config *cfg, ifd_error *err)
{
    int rc = IFD_OK;
    const ifd_hosts *hosts = ifd_hosts_many(cfg->hosts) ? cfg->hosts : NULL;
    if (hosts && cfg->mode != IFD_MODE_PREDICT) {
        if (ifd_cpu_allreduce_init(&cd->flags, cd->replicas, 0) != IFD_OK)
            return ifd_error_set(err, IFD_ENOMEM, "cuda backend: the hosts' step flags");
        cd->use_flags = 1;
        if (ifd_cpu_allreduce_set_hosts(&cd->flags, hosts) != IFD_OK)
            return ifd_error_set(err, IFD_ENOMEM, "cuda backend: the hosts' step flags");
    }
    ncclUniqueId id;
    if (hosts && cfg->mode == IFD_MODE_TRAIN) {
        rc = hosts_nccl_id(cd, hosts, &id, err);
        if (rc == IFD_OK)
            rc = nccl_open(cd, &id, hosts->size * cd->replicas, hosts->rank * cd->replicas, err);
    } else if (cd->replicas > 1) {
        NCCL_TRY_GOTO(-1, ncclGetUniqueId(&id), rc, err, out);
        rc = nccl_open(cd, &id, cd->replicas, 0, err);
    }
out:
    return rc;
}

/* Every replica's stream idle (what open queued has run), then its thread started. */
static int start_replicas(cu_dev *cd, ifd_error *err)
{
    int rc = IFD_OK;
    for (int r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, out);
        CUDA_TRY_GOTO(rep->gpu, cudaStreamSynchronize(rep->cs), rc, err, out);
    }
    for (int r = 0; r < cd->replicas; r++) {
        char tname[32];
        snprintf(tname, sizeof tname, "ifd-gpu%d", r);
        if (ifd_replicas_start(&cd->set, r, tname))
            return ifd_error_set(err, IFD_ENOMEM, "cuda backend: cannot start replica thread %d",
                                 r);
    }
out:
    return rc;
}

int ifd_cu_open(ifd_device *dev, ifd_error *err)
{
    cu_dev *cd = dev->priv;
    const ifd_device_config *cfg = &dev->cfg;
    const ifd_program *p = cfg->program;
    cd->dev = dev;
    cd->replicas = cfg->replicas;
    cd->eof_step = INT64_MAX;
    cd->graphs = cfg->cuda_graphs != 0;
    int visible = 0, rc = count_gpus(cfg, &visible, err);
    if (rc)
        return rc;
    plan_device(cd, cfg);

    float *init = malloc(sizeof(float) * (size_t)(p->nparam_floats + 1));
    cd->reps = calloc((size_t)cd->replicas, sizeof *cd->reps);
    if (init == NULL || cd->reps == NULL) {
        free(init);
        free(cd->reps);
        cd->reps = NULL;
        return ifd_error_set(err, IFD_ENOMEM, "cuda backend: %d replicas", cd->replicas);
    }
    ifd_replicas_init(&cd->set, dev, cd->reps, sizeof *cd->reps, &ifd_cu_replica_ops, 0);
    const float *start = ifd_replica_initial_params(cfg, init);
    for (int r = 0; r < cd->replicas && rc == IFD_OK; r++)
        rc = replica_open(cd, &cd->reps[r], r, start, err);
    if (rc == IFD_OK)
        rc = open_collectives(cd, cfg, err);
    if (rc == IFD_OK)
        rc = start_replicas(cd, err);
    free(init);
    if (rc) {
        /* Nothing ran yet, but an init that failed half-way leaves communicators best aborted. */
        ifd_replicas_abort(&cd->set);
        ifd_cu_close(dev);
        return rc;
    }
    IFD_LOG_INFO("cuda backend: %d replicas on %d visible GPUs, %lld parameters, graphs %s",
                 cd->replicas, visible, (long long)p->nparam_floats, cd->graphs ? "on" : "off");
    return IFD_OK;
}

/* ---- the op set outside a session (device/cuda/opset.h) ------------------------------------- */

struct ifd_cuda_opset {
    cu_replica rep; /* its streams, cuBLAS handle and op table only */
};

int ifd_cuda_opset_open(int gpu, ifd_cuda_opset **out, ifd_error *err)
{
    *out = NULL;
    ifd_cuda_opset *o = calloc(1, sizeof *o);
    if (o == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "cuda backend: op set");
    o->rep.gpu = gpu;
    int rc = replica_streams(&o->rep, err);
    if (rc != IFD_OK) {
        ifd_cuda_opset_close(o);
        return rc;
    }
    replica_ops(&o->rep);
    *out = o;
    return IFD_OK;
}

const ifd_ops *ifd_cuda_opset_ops(const ifd_cuda_opset *o)
{
    return &o->rep.ops;
}

int ifd_cuda_opset_sync(ifd_cuda_opset *o, ifd_error *err)
{
    cu_replica *rep = &o->rep;
    int rc = IFD_OK;
    CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, out);
    CUDA_TRY_GOTO(rep->gpu, cudaStreamSynchronize(rep->cs), rc, err, out);
out:
    if (rep->op_rc != IFD_OK) { /* an op's failure is the first */
        rc = rep->op_rc;
        *err = rep->op_err;
    }
    rep->op_rc = IFD_OK;
    return rc;
}

void ifd_cuda_opset_close(ifd_cuda_opset *o)
{
    if (o == NULL)
        return;
    cudaSetDevice(o->rep.gpu);
    if (o->rep.cs)
        cudaStreamSynchronize(o->rep.cs);
    replica_streams_free(&o->rep);
    free(o);
}
