/*
 * The cuda backend (cuda_backend.h lists its files): what one replica holds on its GPU (streams,
 * cuBLAS, device and pinned memory, the slot rings, the op table), made and freed, and the op set
 * outside a session (opset.h), which is a replica's streams and op table only.
 */
#include "core/batch.h"
#include "core/thread.h"
#include "device/cuda/cuda_backend.h"
#include "device/cuda/opset.h"

#include <stdlib.h>
#include <string.h>

/* cuBLAS workspace per handle, set explicitly so that a captured GEMM never allocates (the
 * cuBLAS documentation recommends 32 MiB on Hopper, 4 MiB before). */
#define CU_BLAS_WORKSPACE (32u << 20)

#define BLAS_TRY_GOTO(gpu, call, rc, err, label)                                                   \
    do {                                                                                           \
        cublasStatus_t blas_try_s_ = (call);                                                       \
        if (blas_try_s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            (rc) = ifd_cuda_error((err), (gpu), #call, cublasGetStatusString(blas_try_s_));        \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

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

/* The op set the program's step calls (ops.c). */
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
int ifd_cu_replica_open(cu_dev *cd, cu_replica *rep, int index, const float *init, ifd_error *err)
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

void ifd_cu_replica_free(cu_replica *rep)
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
