/*
 * The cuda backend: one replica per visible GPU, driven by one host thread each (as the cpu
 * backend), so that every NCCL communicator and every stream capture belongs to one thread.
 *
 * Per replica: a compute stream (the step, the outfeed copy) and a copy stream (host-to-device
 * shards); a ring of infeed_depth input slots, each a pinned staging buffer, a device buffer of
 * the same size, the step's outfeed record in device memory and two events ("copied" on the copy
 * stream, "consumed" on the compute stream), and in predict mode a device buffer for the step's
 * predictions, the shard's batch (referenced) and the stopping-signal flag; a ring of outfeed
 * slots, each a pinned step record and the events that time it (predict mode: and pinned
 * predictions and the batch, passed on to the outfeed thread). Slots move between two queues per
 * ring (free and full), so no step allocates and every wait on the host is a bounded queue or an
 * event poll that abort interrupts. docs/cuda.md describes the design; device/device.h the
 * contract.
 */
#include "core/batch.h"
#include "core/log.h"
#include "core/queue.h"
#include "core/thread.h"
#include "device/cpu/allreduce.h"
#include "device/cuda/cuda_internal.h"
#include "device/device.h"
#include "device/replicas.h"
#include "infeed/hosts.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <limits.h>
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU_ALIGN 256
/* cuBLAS workspace per handle, set explicitly so that a captured GEMM never allocates (the
 * cuBLAS documentation recommends 32 MiB on Hopper, 4 MiB before). */
#define CU_BLAS_WORKSPACE (32u << 20)
/* After an abort, read_state still waits this long for a stream that is merely busy. */
#define CU_READ_GRACE_NS (2 * INT64_C(1000000000))

typedef struct cu_dev cu_dev;

/* One input slot of a replica's infeed ring. */
typedef struct cu_inslot {
    unsigned char *host;  /* pinned staging */
    unsigned char *dev;   /* the step reads its inputs here */
    ifd_step_out *dout;   /* and writes its outfeed record here */
    cudaEvent_t copied;   /* copy stream: the shard is on the device */
    cudaEvent_t consumed; /* compute stream: the step that read it finished */
    int used;             /* consumed has been recorded */
    int64_t rows;
    cudaGraphExec_t graph; /* the step captured with this slot's pointers, or NULL */
    /* predict mode */
    float *dpred;     /* the step's predictions, [max_shard_rows, predict_cols] on the device */
    ifd_batch *batch; /* the shard's batch, referenced until its record reaches the outfeed */
    int64_t row0;
    int stop; /* the stopping signal: the loop ends here, no step reads the slot */
} cu_inslot;

/* One outfeed slot. The step's record is copied into host; the events time the step. */
typedef struct cu_outslot {
    ifd_step_out *host; /* pinned */
    cudaEvent_t begin;  /* recorded before the step waits for its shard */
    cudaEvent_t start;  /* the step begins (its shard is on the device) */
    cudaEvent_t done;   /* the step and the copy of its record finished */
    int64_t step;
    int first;           /* the first step of its loop */
    int64_t loop_ns;     /* host clock when its loop began */
    int64_t begin_ns;    /* host clock when begin was recorded */
    int64_t out_wait_ns; /* host time blocked for this free slot */
    /* predict mode: the predictions copied back (pinned), and the batch they belong to, handed
     * to the outfeed thread with its reference */
    float *hpred;
    ifd_batch *batch;
    int64_t row0, rows;
} cu_outslot;

typedef struct cu_replica {
    ifd_replica base; /* first: the replica thread (device/replicas.h) */
    int gpu;
    cu_dev *cd;
    cudaStream_t cs; /* compute */
    cudaStream_t xs; /* copies */
    cublasHandle_t blas;
    ncclComm_t comm; /* NULL with one replica on one host */
    void *blas_ws;
    float *dmem;     /* params, grads, slot0, slot1, workspace */
    int64_t *dsteps; /* step, opt_step */
    ifd_replica_state st;
    int nin, nout;
    cu_inslot *in;
    cu_outslot *out;
    ifd_step_out *dout;     /* nin device records */
    ifd_step_out *out_host; /* nout pinned records */
    ifd_queue *in_free;     /* int: slots the infeed thread may fill */
    ifd_queue *in_full;     /* int: staged slots, in order */
    ifd_queue *out_free;    /* cu_outslot * */
    ifd_queue *out_full;    /* cu_outslot *: enqueued steps, in order */
    cudaEvent_t loop_end;   /* the last step of a loop */
    cudaEvent_t sync_ev;    /* read_state */
    ifd_ops ops;
    int op_rc; /* first failure of an op in the current step (ops return nothing) */
    ifd_error op_err;
    int warmed;       /* one step ran without a graph */
    int64_t step;     /* replica thread: the global step after its last enqueued step */
    int64_t enqueued; /* replica thread: steps enqueued this run */
    int64_t start_ns; /* replica thread: when the current loop began */
    /* outfeed thread: the last record handed out stays held, so that its done event can time
     * the next step */
    cu_outslot *held;
    int64_t last_end_ns;
    /* base.stats are written by the outfeed thread as steps are seen to finish */
} cu_replica;

_Static_assert(offsetof(cu_replica, base) == 0, "ifd_replica comes first");

struct cu_dev {
    ifd_replicas set; /* first: run_loop, global_step and stats are the set's; the global step is
                       * replica 0's last finished step */
    ifd_device *dev;
    int replicas;
    cu_replica *reps;
    ifd_step_ops sops;
    int graphs;          /* IFD_CUDA_GRAPHS */
    int64_t graph_rows;  /* shards of this many rows run as graphs */
    size_t in_bytes;     /* staging bytes per slot */
    int64_t pred_floats; /* predict: floats of one step's predictions at most; else 0 */
    int64_t eof_step;    /* atomic: the lowest step at which a replica's input ended */
    /* Several hosts (train and eval): before a step touches its GPU, the replicas exchange the
     * hosts' flags (the cpu backend's host exchange with no vector), so that a host whose input
     * ended stops every host at that step and no host waits in an NCCL call for it. */
    ifd_cpu_allreduce flags;
    int use_flags;
    int hosts_ended; /* atomic: the flags said another host's input ended */
};

_Static_assert(offsetof(cu_dev, set) == 0, "ifd_replicas comes first");

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

static inline int is_aborted(cu_dev *cd)
{
    return ifd_replicas_aborted(&cd->set);
}

static void store_min64(int64_t *p, int64_t v)
{
    int64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < cur &&
           !__atomic_compare_exchange_n(p, &cur, v, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

/*
 * Waits for ev on the host by polling (a short spin, then sleeps growing to 100 us), so that
 * abort interrupts it: a blocking cudaEventSynchronize could not be, and a step whose all-reduce
 * waits for a peer that will never come never finishes. After an abort it keeps polling for
 * grace_ns before it gives up with IFD_ESTOPPED. rep may be NULL; when given, a wait for a step
 * beyond the one at which some replica's input ended fails at once instead of hanging.
 */
static int wait_event(cu_dev *cd, cu_replica *rep, cudaEvent_t ev, int64_t grace_ns, ifd_error *err)
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

/* ---- the op set (include/infeed/program.h) on the compute stream ---------------------------- */

static void op_fail(cu_replica *rep, int code, const char *what, const char *text)
{
    if (rep->op_rc == IFD_OK)
        rep->op_rc =
            ifd_error_set(&rep->op_err, code, "cuda backend: GPU %d: %s: %s", rep->gpu, what, text);
}

static void op_check(cu_replica *rep, cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        op_fail(rep, IFD_ECUDA, what, cudaGetErrorString(e));
    }
}

static int ld(int64_t v)
{
    return v > 1 ? (int)v : 1;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and m, n
 * and keep the row-major leading dimensions (as cblas with CblasRowMajor). */
static void cu_gemm(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, const float *b, float beta, float *c)
{
    cu_replica *rep = ctx;
    if (rep->op_rc)
        return;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
        op_fail(rep, IFD_EINVAL, "cublasSgemm", "a dimension exceeds INT_MAX");
        return;
    }
    cublasStatus_t st = cublasSgemm(rep->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha,
                                    b, ld(tb ? k : n), a, ld(ta ? m : k), &beta, c, ld(n));
    if (st != CUBLAS_STATUS_SUCCESS)
        op_fail(rep, IFD_ECUDA, "cublasSgemm", cublasGetStatusString(st));
}

static void cu_bias_add(void *ctx, int64_t rows, int64_t cols, const float *bias, float *x)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_bias_add(rep->cs, rows, cols, bias, x), "bias_add kernel");
}

static void cu_col_sum(void *ctx, int64_t rows, int64_t cols, const float *x, float *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_col_sum(rep->cs, rows, cols, x, out), "col_sum kernel");
}

static void cu_relu(void *ctx, int64_t n, const float *x, float *y)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_relu(rep->cs, n, x, y), "relu kernel");
}

static void cu_relu_grad(void *ctx, int64_t n, const float *y, const float *dy, float *dx)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_relu_grad(rep->cs, n, y, dy, dx), "relu_grad kernel");
}

static void cu_tanh(void *ctx, int64_t n, const float *x, float *y)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_tanh(rep->cs, n, x, y), "tanh kernel");
}

static void cu_tanh_grad(void *ctx, int64_t n, const float *y, const float *dy, float *dx)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_tanh_grad(rep->cs, n, y, dy, dx), "tanh_grad kernel");
}

static void cu_l2_decay(void *ctx, int64_t n, float decay, float scale, const float *w, float *grad,
                        ifd_step_out *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_l2_decay(rep->cs, n, decay, scale, w, grad, out), "l2_decay kernel");
}

static void cu_softmax_xent(void *ctx, int64_t rows, int64_t k, const float *logits,
                            const int32_t *labels, float scale, float *dlogits, ifd_step_out *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_softmax_xent(rep->cs, rows, k, logits, labels, scale, dlogits, out),
                 "softmax_xent kernel");
}

static void cu_softmax(void *ctx, int64_t rows, int64_t k, const float *logits, float *probs)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_softmax(rep->cs, rows, k, logits, probs), "softmax kernel");
}

static void cu_squared_error(void *ctx, int64_t rows, int64_t k, const float *pred, const float *y,
                             float scale, float *dpred, ifd_step_out *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_squared_error(rep->cs, rows, k, pred, y, scale, dpred, out),
                 "squared_error kernel");
}

/* ---- the replication ops (device/step.h) ----------------------------------------------------- */

static int cu_allreduce_sum(void *ctx, float *buf, int64_t n, ifd_error *err)
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

static void cu_optimizer_apply(void *ctx, const ifd_optimizer *opt, const int64_t *opt_step,
                               int64_t n, float *params, const float *grads, float *slot0,
                               float *slot1)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep,
                 ifd_cuda_optimizer_apply(rep->cs, opt, opt_step, n, params, grads, slot0, slot1),
                 "optimizer kernel");
}

static void cu_finish_step(void *ctx, int64_t *step, int64_t *opt_step, ifd_step_out *out,
                           int64_t rows)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        op_check(rep, ifd_cuda_finish_step(rep->cs, step, opt_step, out, rows),
                 "finish_step kernel");
}

/* ---- input layout ---------------------------------------------------------------------------- */

static size_t row_bytes(const ifd_input_spec *in)
{
    size_t n = ifd_dtype_size(in->dtype);
    for (int d = 0; d < in->rank; d++)
        n *= (size_t)in->dims[d];
    return n;
}

/* A shard of rows rows in a slot: the j-th input the mode takes (ifd_step_inputs: predict mode
 * takes no labels) at offs[j], packed, each aligned to CU_ALIGN, so that one copy moves the whole
 * shard. Writes the inputs' indices to idx and their count to *n; returns the bytes used. */
static size_t shard_layout(const ifd_device_config *cfg, int64_t rows, size_t *offs, int *idx,
                           int *n)
{
    const ifd_program *p = cfg->program;
    size_t off = 0;
    *n = ifd_step_inputs(p, cfg->mode, idx);
    for (int j = 0; j < *n; j++) {
        offs[j] = off;
        off += (size_t)rows * row_bytes(&p->inputs[idx[j]]);
        off = (off + CU_ALIGN - 1) / CU_ALIGN * CU_ALIGN;
    }
    return off;
}

static void shard_views(const ifd_device_config *cfg, const cu_inslot *s, ifd_tensor *views)
{
    size_t offs[IFD_MAX_INPUTS];
    int idx[IFD_MAX_INPUTS], n;
    shard_layout(cfg, s->rows, offs, idx, &n);
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
    if (s->graph == NULL) {
        cudaGraph_t g = NULL;
        CUDA_TRY_GOTO(rep->gpu, cudaStreamBeginCapture(rep->cs, cudaStreamCaptureModeThreadLocal),
                      rc, &rep->base.err, fail);
        rc = enqueue_step(rep, s);
        cudaError_t e = cudaStreamEndCapture(rep->cs, &g);
        if (e == cudaSuccess && rc == IFD_OK) {
            e = cudaGraphInstantiate(&s->graph, g, 0);
            if (e != cudaSuccess) {
                s->graph = NULL;
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
    CUDA_TRY_GOTO(rep->gpu, cudaGraphLaunch(s->graph, rep->cs), rc, &rep->base.err, fail);
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
        wrc = wait_event(cd, rep, rep->loop_end, 0, &e);
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

static const ifd_replica_ops cu_replica_ops = {
    .thread_init = cu_thread_init,
    .loop_begin = cu_loop_begin,
    .step = cu_step,
    .loop_end = cu_loop_end,
    .input_ended = cu_input_ended,
};

/* ---- open and close ---------------------------------------------------------------------------
 */

static int replica_open(cu_dev *cd, cu_replica *rep, int index, const float *init, ifd_error *err)
{
    const ifd_device_config *cfg = &cd->dev->cfg;
    const ifd_program *p = cfg->program;
    int64_t np = p->nparam_floats;
    int gpu = index, rc = IFD_OK;
    rep->gpu = gpu;
    rep->cd = cd;
    rep->step = cfg->initial_step;
    rep->nin = cfg->infeed_depth;
    rep->nout = cfg->outfeed_depth + 1; /* one stays held by the outfeed thread */
    rep->in = calloc((size_t)rep->nin, sizeof *rep->in);
    rep->out = calloc((size_t)rep->nout, sizeof *rep->out);
    if (rep->in == NULL || rep->out == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "cuda backend: replica %d slots", index);

    CUDA_TRY_GOTO(gpu, cudaSetDevice(gpu), rc, err, out);
    CUDA_TRY_GOTO(gpu, cudaStreamCreateWithFlags(&rep->cs, cudaStreamNonBlocking), rc, err, out);
    CUDA_TRY_GOTO(gpu, cudaStreamCreateWithFlags(&rep->xs, cudaStreamNonBlocking), rc, err, out);
    BLAS_TRY_GOTO(gpu, cublasCreate(&rep->blas), rc, err, out);
    BLAS_TRY_GOTO(gpu, cublasSetStream(rep->blas, rep->cs), rc, err, out);
    BLAS_TRY_GOTO(gpu, cublasSetMathMode(rep->blas, CUBLAS_DEFAULT_MATH), rc, err, out);
    CUDA_TRY_GOTO(gpu, cudaMalloc(&rep->blas_ws, CU_BLAS_WORKSPACE), rc, err, out);
    BLAS_TRY_GOTO(gpu, cublasSetWorkspace(rep->blas, rep->blas_ws, CU_BLAS_WORKSPACE), rc, err,
                  out);

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
    int64_t steps[2] = {cfg->initial_step, cfg->init_opt_step};
    CUDA_TRY_GOTO(gpu, cudaMalloc((void **)&rep->dsteps, sizeof steps), rc, err, out);
    CUDA_TRY_GOTO(gpu, cudaMemcpy(rep->dsteps, steps, sizeof steps, cudaMemcpyHostToDevice), rc,
                  err, out);
    ifd_replica_mem_carve(&rep->st, rep->dmem, np);
    rep->st.step = &rep->dsteps[0];
    rep->st.opt_step = &rep->dsteps[1];

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
        CUDA_TRY_GOTO(gpu, cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming), rc, err,
                      out);
        CUDA_TRY_GOTO(gpu, cudaEventCreateWithFlags(&s->consumed, cudaEventDisableTiming), rc, err,
                      out);
    }
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
        CUDA_TRY_GOTO(gpu, cudaEventCreate(&o->begin), rc, err, out);
        CUDA_TRY_GOTO(gpu, cudaEventCreate(&o->start), rc, err, out);
        CUDA_TRY_GOTO(gpu, cudaEventCreate(&o->done), rc, err, out);
    }
    CUDA_TRY_GOTO(gpu, cudaEventCreateWithFlags(&rep->loop_end, cudaEventDisableTiming), rc, err,
                  out);
    CUDA_TRY_GOTO(gpu, cudaEventCreateWithFlags(&rep->sync_ev, cudaEventDisableTiming), rc, err,
                  out);
    /* The cudaMemset and cudaMemcpy calls above run on the legacy default stream, which the
     * non-blocking streams do not wait for, and may still be in flight when they return (memset of
     * device memory, copies from pageable memory): wait for them before any stream reads dmem. */
    CUDA_TRY_GOTO(gpu, cudaDeviceSynchronize(), rc, err, out);

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

    rep->ops.ctx = rep;
    rep->ops.gemm = cu_gemm;
    rep->ops.bias_add = cu_bias_add;
    rep->ops.col_sum = cu_col_sum;
    rep->ops.relu = cu_relu;
    rep->ops.relu_grad = cu_relu_grad;
    rep->ops.tanh = cu_tanh;
    rep->ops.tanh_grad = cu_tanh_grad;
    rep->ops.l2_decay = cu_l2_decay;
    rep->ops.softmax_xent = cu_softmax_xent;
    rep->ops.softmax = cu_softmax;
    rep->ops.squared_error = cu_squared_error;
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
 * it), and gets rank 0's ncclUniqueId, over the LOOP channel (cu_open runs on the session's
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
    if (rep->blas)
        cublasDestroy(rep->blas);
    cudaFree(rep->blas_ws);
    if (rep->xs)
        cudaStreamDestroy(rep->xs);
    if (rep->cs)
        cudaStreamDestroy(rep->cs);
    (void)cudaGetLastError();
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

static void cu_close(ifd_device *dev)
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
            if (rep->in[i].graph) {
                cudaSetDevice(rep->gpu);
                cudaGraphExecDestroy(rep->in[i].graph);
                rep->in[i].graph = NULL;
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

/* IFD_CUDA_GRAPHS=0|1 (default 1). */
static int graphs_setting(int *out, ifd_error *err)
{
    const char *v = getenv("IFD_CUDA_GRAPHS");
    *out = 1;
    if (v == NULL || *v == '\0')
        return IFD_OK;
    if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0) {
        *out = v[0] == '1';
        return IFD_OK;
    }
    return ifd_error_set(err, IFD_EINVAL,
                         "cuda backend: environment variable IFD_CUDA_GRAPHS: expected 0 or 1, "
                         "got '%s'",
                         v);
}

static int cu_open(ifd_device *dev, ifd_error *err)
{
    cu_dev *cd = dev->priv;
    const ifd_device_config *cfg = &dev->cfg;
    const ifd_program *p = cfg->program;
    cd->dev = dev;
    cd->replicas = cfg->replicas;
    cd->eof_step = INT64_MAX;
    int rc = graphs_setting(&cd->graphs, err);
    if (rc)
        return rc;

    int visible = 0;
    cudaError_t e = cudaGetDeviceCount(&visible);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ifd_error_set(err, IFD_ECUDA, "cuda backend: no usable GPU: cudaGetDeviceCount: %s",
                             cudaGetErrorString(e));
    }
    if (visible == 0)
        return ifd_error_set(err, IFD_ECUDA,
                             "cuda backend: no usable GPU: cudaGetDeviceCount: 0 devices visible");
    if (cfg->replicas < 1 || cfg->replicas > visible) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        return ifd_error_set(err, IFD_EINVAL,
                             "cuda backend: replicas: %d requested, but %d GPU%s visible "
                             "(CUDA_VISIBLE_DEVICES=%s); one replica runs per GPU",
                             cfg->replicas, visible, visible == 1 ? " is" : "s are",
                             cvd ? cvd : "(unset)");
    }
    size_t offs[IFD_MAX_INPUTS];
    int idx[IFD_MAX_INPUTS], nin;
    cd->in_bytes = shard_layout(cfg, cfg->max_shard_rows, offs, idx, &nin);
    cd->pred_floats = cfg->mode == IFD_MODE_PREDICT ? cfg->max_shard_rows * p->predict_cols : 0;
    if (cd->in_bytes == 0)
        cd->in_bytes = CU_ALIGN;
    cd->graph_rows = cfg->max_shard_rows % cfg->replicas == 0 ? cfg->max_shard_rows / cfg->replicas
                                                              : -1; /* the per-host shard */
    cd->sops.allreduce_sum = cu_allreduce_sum;
    cd->sops.optimizer_apply = cu_optimizer_apply;
    cd->sops.finish_step = cu_finish_step;

    float *init = malloc(sizeof(float) * (size_t)(p->nparam_floats + 1));
    cd->reps = calloc((size_t)cd->replicas, sizeof *cd->reps);
    if (init == NULL || cd->reps == NULL) {
        free(init);
        free(cd->reps);
        cd->reps = NULL;
        return ifd_error_set(err, IFD_ENOMEM, "cuda backend: %d replicas", cd->replicas);
    }
    ifd_replicas_init(&cd->set, dev, cd->reps, sizeof *cd->reps, &cu_replica_ops, 0);
    const float *start = ifd_replica_initial_params(cfg, init);
    for (int r = 0; r < cd->replicas; r++) {
        rc = replica_open(cd, &cd->reps[r], r, start, err);
        if (rc)
            goto fail;
    }
    const ifd_hosts *hosts = ifd_hosts_many(cfg->hosts) ? cfg->hosts : NULL;
    if (hosts && cfg->mode != IFD_MODE_PREDICT) { /* predict runs per host */
        if (ifd_cpu_allreduce_init(&cd->flags, cd->replicas, 0) != IFD_OK) {
            rc = ifd_error_set(err, IFD_ENOMEM, "cuda backend: the hosts' step flags");
            goto fail;
        }
        cd->use_flags = 1;
        if (ifd_cpu_allreduce_set_hosts(&cd->flags, hosts) != IFD_OK) {
            rc = ifd_error_set(err, IFD_ENOMEM, "cuda backend: the hosts' step flags");
            goto fail;
        }
    }
    if (hosts && cfg->mode == IFD_MODE_TRAIN) {
        ncclUniqueId id;
        rc = hosts_nccl_id(cd, hosts, &id, err);
        if (rc == IFD_OK)
            rc = nccl_open(cd, &id, hosts->size * cd->replicas, hosts->rank * cd->replicas, err);
        if (rc)
            goto fail;
    } else if (cd->replicas > 1) {
        ncclUniqueId id;
        NCCL_TRY_GOTO(-1, ncclGetUniqueId(&id), rc, err, fail);
        rc = nccl_open(cd, &id, cd->replicas, 0, err);
        if (rc)
            goto fail;
    }
    for (int r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, fail);
        CUDA_TRY_GOTO(rep->gpu, cudaStreamSynchronize(rep->cs), rc, err, fail);
    }
    for (int r = 0; r < cd->replicas; r++) {
        char tname[32];
        snprintf(tname, sizeof tname, "ifd-gpu%d", r);
        if (ifd_replicas_start(&cd->set, r, tname)) {
            rc = ifd_error_set(err, IFD_ENOMEM, "cuda backend: cannot start replica thread %d", r);
            goto fail;
        }
    }
    free(init);
    IFD_LOG_INFO("cuda backend: %d replicas on %d visible GPUs, %lld parameters, graphs %s",
                 cd->replicas, visible, (long long)p->nparam_floats, cd->graphs ? "on" : "off");
    return IFD_OK;

fail:
    free(init);
    /* Nothing ran yet, but an init that failed half-way leaves communicators best aborted. */
    ifd_replicas_abort(&cd->set);
    cu_close(dev);
    return rc;
}

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
        rc = wait_event(cd, NULL, s->consumed, 0, &err);
        if (rc)
            goto fail;
    }
    size_t offs[IFD_MAX_INPUTS];
    int in_idx[IFD_MAX_INPUTS], nin;
    size_t bytes = shard_layout(&dev->cfg, shard->rows, offs, in_idx, &nin);
    /* A batch in registered host memory (a producer's shared-memory pool) is copied to the
     * device tensor by tensor, straight from where the producer wrote it, and let go once the
     * copy is done; any other is staged (one host copy) and let go at once. */
    int direct = (shard->batch->flags & IFD_BATCH_PINNED) != 0;
    int held = 1; /* this call holds a reference on the batch (released at fail_unref) */
    ifd_batch_ref(shard->batch, 1);
    for (int j = 0; j < nin && shard->rows > 0; j++) {
        const ifd_tensor *t = &shard->batch->tensors[j];
        size_t rb = row_bytes(&p->inputs[in_idx[j]]);
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
    if (!direct && dev->cfg.mode != IFD_MODE_PREDICT) {
        ifd_batch_unref(shard->batch); /* the device reads the staging copy, never the batch */
        held = 0;
    }
    if (!direct && bytes > 0)
        CUDA_TRY_GOTO(rep->gpu,
                      cudaMemcpyAsync(s->dev, s->host, bytes, cudaMemcpyHostToDevice, rep->xs), rc,
                      &err, fail_unref);
    CUDA_TRY_GOTO(rep->gpu, cudaEventRecord(s->copied, rep->xs), rc, &err, fail_unref);
    if (direct && (rc = wait_event(cd, NULL, s->copied, 0, &err)) != IFD_OK)
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
    rc = wait_event(cd, NULL, o->done, 0, &err);
    if (rc)
        goto fail;
    rec->step = o->step;
    rec->out = *o->host;
    rec->batch = o->batch; /* predict: the reference goes to the outfeed thread */
    rec->row0 = o->row0;
    rec->rows = o->rows;
    rec->pred = o->batch ? o->hpred : NULL; /* valid while o is held: until the next dequeue */
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
    rc = wait_event(cd, NULL, rep->sync_ev, CU_READ_GRACE_NS, &e);
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
    .open = cu_open,
    .close = cu_close,
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
