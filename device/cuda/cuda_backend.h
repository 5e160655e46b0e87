/*
 * The cuda backend's host C: its state, and what its files share with each other (what they share
 * with the kernels is in cuda_internal.h). Nothing outside device/cuda/ includes this file.
 *
 *   cuda.c      errors, the event wait, open and close of the backend (GPUs, NCCL, the replicas)
 *   replica_open.c  one replica's resources made and freed (streams, cuBLAS, device and pinned
 *               memory, the rings, the op table); the op set outside a session (opset.h)
 *   ops.c       the op set on a replica's compute stream
 *   replica.c   the replica threads: the replication ops, the input layout, the step (directly or
 *               as a graph) and the callbacks of device/replicas.h
 *   feeds.c     the infeed thread (staging shards), the outfeed thread (step records, their
 *               timing), the session's thread (read_state, stats, abort, host memory
 *               registration) and the backend's table
 *   kernels.cu  the kernels and their launchers (cuda_internal.h); nn_kernels.cu the
 *               transformer's; launch.cuh what the two share
 *
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
#ifndef IFD_DEVICE_CUDA_BACKEND_H
#define IFD_DEVICE_CUDA_BACKEND_H

#include "core/queue.h"
#include "device/cpu/allreduce.h"
#include "device/cuda/cuda_internal.h"
#include "device/device.h"
#include "device/replicas.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#define CU_ALIGN 256

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
    /* the step captured with this slot's pointers, or NULL: [1] with the program's outfeed
     * tensors, [0] without (a shard's outfeeds, decided a step) */
    cudaGraphExec_t graph[2];
    int outfeeds; /* the shard's IFD_SHARD_* bits */
    /* predict mode */
    float *dpred; /* the step's predictions, [max_shard_rows, predict_cols] on the device */
    /* train, eval: the step's outfeed tensors (cd->out_bytes from dtens[0], one device block;
     * dtens[i] = dtens[0] + cd->out_offs[i]) */
    void *dtens[IFD_MAX_OUTFEEDS];
    ifd_batch *batch; /* the shard's batch, referenced until its record reaches the outfeed */
    int64_t row0;
    int stop;           /* the stopping signal: the loop ends here, no step reads the slot */
    ifd_batch_tag from; /* the shard's batch, for the record */
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
    /* train, eval: the step's outfeed area copied back (pinned, cd->out_bytes) */
    unsigned char *hout;
    int has_out;  /* hout holds this step's outfeed tensors */
    int to_sinks; /* the shard's IFD_SHARD_TO_SINKS */
    ifd_batch *batch;
    int64_t row0, rows;
    ifd_batch_tag from; /* the shard's batch (its input slot's) */
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
    int64_t *dsteps; /* step, opt_step, then st.nodecay's ranges */
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
    int graphs;          /* ifd_device_config.cuda_graphs */
    int64_t graph_rows;  /* shards of this many rows run as graphs */
    size_t in_bytes;     /* staging bytes per slot */
    int64_t pred_floats; /* predict: floats of one step's predictions at most; else 0 */
    /* train, eval: a step's outfeed area (ifd_program_outfeed_layout; 0: none) */
    int64_t out_bytes;
    int64_t out_offs[IFD_MAX_OUTFEEDS];
    int64_t eof_step; /* atomic: the lowest step at which a replica's input ended */
    /* Several hosts (train and eval): before a step touches its GPU, the replicas exchange the
     * hosts' flags (the cpu backend's host exchange with no vector), so that a host whose input
     * ended stops every host at that step and no host waits in an NCCL call for it. */
    ifd_cpu_allreduce flags;
    int use_flags;
    int hosts_ended; /* atomic: the flags said another host's input ended */
};

_Static_assert(offsetof(cu_dev, set) == 0, "ifd_replicas comes first");

static inline int is_aborted(cu_dev *cd)
{
    return ifd_replicas_aborted(&cd->set);
}

/* ---- cuda.c ---------------------------------------------------------------------------------- */

int ifd_cu_wait_event(cu_dev *cd, cu_replica *rep, cudaEvent_t ev, int64_t grace_ns,
                      ifd_error *err);
int ifd_cu_open(ifd_device *dev, ifd_error *err);
void ifd_cu_close(ifd_device *dev);

/* ---- replica_open.c -------------------------------------------------------------------------- */

/* One replica on GPU `index`; what it made is freed by ifd_cu_replica_free whatever failed. */
int ifd_cu_replica_open(cu_dev *cd, cu_replica *rep, int index, const float *init, ifd_error *err);
void ifd_cu_replica_free(cu_replica *rep);

/* ---- ops.c ----------------------------------------------------------------------------------- */

/* Keeps the first failure of an op in rep->op_rc / op_err (the step reports it). */
void ifd_cu_op_check(cu_replica *rep, cudaError_t e, const char *what);
/* The op set (include/infeed/program.h); ctx is the cu_replica. */
void ifd_cu_gemm(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, const float *b, float beta, float *c);
void ifd_cu_bias_add(void *ctx, int64_t rows, int64_t cols, const float *bias, float *x);
void ifd_cu_gemm_bias(void *ctx, int64_t m, int64_t n, int64_t k, const float *a, const float *b,
                      const float *bias, const float *res, float *c);
void ifd_cu_col_sum(void *ctx, int64_t rows, int64_t cols, const float *x, float *out);
void ifd_cu_relu(void *ctx, int64_t n, const float *x, float *y);
void ifd_cu_relu_grad(void *ctx, int64_t n, const float *y, const float *dy, float *dx);
void ifd_cu_tanh(void *ctx, int64_t n, const float *x, float *y);
void ifd_cu_tanh_grad(void *ctx, int64_t n, const float *y, const float *dy, float *dx);
void ifd_cu_l2_decay(void *ctx, int64_t n, float decay, float scale, const float *w, float *grad,
                     ifd_step_out *out);
void ifd_cu_softmax_xent(void *ctx, int64_t rows, int64_t k, const float *logits,
                         const int32_t *labels, float scale, float *dlogits, ifd_step_out *out);
void ifd_cu_softmax(void *ctx, int64_t rows, int64_t k, const float *logits, float *probs);
void ifd_cu_squared_error(void *ctx, int64_t rows, int64_t k, const float *pred, const float *y,
                          float scale, float *dpred, ifd_step_out *out);
/* The transformer's ops (ABI 4). */
void ifd_cu_fill(void *ctx, int64_t n, float value, float *x);
void ifd_cu_add(void *ctx, int64_t n, float alpha, const float *x, float *y);
void ifd_cu_gemm_strided_batched(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k,
                                 float alpha, const float *a, int64_t stride_a, const float *b,
                                 int64_t stride_b, float beta, float *c, int64_t stride_c,
                                 int64_t batch);
void ifd_cu_embedding(void *ctx, int64_t rows, int64_t dim, const int32_t *ids, const float *table,
                      float *out);
void ifd_cu_embedding_grad(void *ctx, int64_t rows, int64_t dim, const int32_t *ids,
                           const float *dout, float *dtable);
void ifd_cu_layernorm(void *ctx, int64_t rows, int64_t dim, const float *x, const float *gamma,
                      const float *beta, float eps, float *y, float *mean, float *rstd);
void ifd_cu_layernorm_grad(void *ctx, int64_t rows, int64_t dim, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta);
void ifd_cu_gelu(void *ctx, int64_t n, const float *x, float *y);
void ifd_cu_gelu_grad(void *ctx, int64_t n, const float *x, const float *dy, float *dx);
void ifd_cu_attention(void *ctx, int64_t batch, int64_t t, int64_t heads, int64_t dh,
                      const float *qkv, float *probs, float *out);
void ifd_cu_attention_grad(void *ctx, int64_t batch, int64_t t, int64_t heads, int64_t dh,
                           const float *qkv, const float *probs, const float *dout, float *dqkv,
                           float *work);

/* ---- replica.c ------------------------------------------------------------------------------- */

/* The replication ops (device/step.h). */
int ifd_cu_allreduce_sum(void *ctx, float *buf, int64_t n, ifd_error *err);
void ifd_cu_guard_loss(void *ctx, ifd_step_out *out, float *grads);
void ifd_cu_check_grads(void *ctx, const float *grads, int64_t n, ifd_step_out *out);
void ifd_cu_optimizer_apply(void *ctx, const ifd_optimizer *opt, const ifd_replica_state *st,
                            int64_t n, ifd_step_out *out);
void ifd_cu_classify(void *ctx, int64_t rows, int64_t k, const float *logits, int32_t *cls,
                     float *conf);
void ifd_cu_copy(void *ctx, void *dst, const void *src, int64_t bytes);
void ifd_cu_softmax_xent_classify(void *ctx, int64_t rows, int64_t k, const float *logits,
                                  const int32_t *labels, float scale, float *dlogits,
                                  ifd_step_out *out, int32_t *cls, float *conf);
void ifd_cu_finish_step(void *ctx, int64_t *step, int64_t *opt_step, ifd_step_out *out,
                        int64_t rows);
/* The input layout. */
size_t ifd_cu_row_bytes(const ifd_input_spec *in);
size_t ifd_cu_shard_layout(const ifd_device_config *cfg, int64_t rows, size_t *offs, int *idx,
                           int *n);
/* The replica thread's callbacks (device/replicas.h). */
extern const ifd_replica_ops ifd_cu_replica_ops;

#endif
