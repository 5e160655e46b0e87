/*
 * The training step shared by every backend (the seed's TowerOptimizer and _distributed_apply):
 *
 *   program step on the replica's shard, loss scaled by `scale` (1/R for MEAN, 1 for SUM)
 *   -> all-reduce of the gradients (sum, deterministic)
 *   -> optimizer update of this replica's mirror
 *   -> global_step += 1, outfeed record (loss, correct, count)
 *
 * It is written against two tables the backend fills: the program op set (ifd_ops) and the
 * replication ops below. On cpu they run at once; on cuda they enqueue work on the replica's
 * stream (and the whole step is captured in a graph), so nothing here may read device memory.
 */
#ifndef IFD_DEVICE_STEP_H
#define IFD_DEVICE_STEP_H

#include <infeed/infeed.h>

typedef struct ifd_replica_state ifd_replica_state;

typedef struct ifd_step_ops {
    /* In place: buf = sum over replicas of buf, in replica order, so every mirror gets the same
     * bits. Collective: every replica calls it once per step. IFD_OK, IFD_ESTOPPED (aborted),
     * IFD_EEOF (a peer's input ended), or another error with err filled (IFD_EINTERNAL on cpu for
     * a vector other than the gradients it was set up with). */
    int (*allreduce_sum)(void *ctx, float *buf, int64_t n, ifd_error *err);
    /* Before the all-reduce (device memory): when out->loss is not finite, out->loss_nonfinite =
     * 1 and grads[0] = NaN, so that the all-reduced gradients of every replica (and host) are
     * not finite and every one skips the step; else out->loss_nonfinite = 0. */
    void (*guard_loss)(void *ctx, ifd_step_out *out, float *grads);
    /* After the all-reduce: out->skipped = 1 when an element of grads[0..n) is not finite, else
     * 0, and out->grad_norm = their L2 norm (device memory; one pass: on cpu the sum of squares
     * in float lanes, again in double where that is not finite, within 1.5e-5 relative). Every
     * mirror holds the same sum, so every one decides alike. */
    void (*check_grads)(void *ctx, const float *grads, int64_t n, ifd_step_out *out);
    /* One optimizer update of st's mirror (n elements), unless out->skipped is nonzero (device
     * memory): then params, slots and everything else are left alone. *st->opt_step (device
     * memory) counts the updates this mirror's slots have seen: Adam's t is *opt_step + 1 (the
     * optimizer's own count, as TensorFlow's beta-power accumulators, not the global step: a
     * run resumed at step 1000 with fresh slots starts at t = 1), and the learning rate is the
     * schedule's at *opt_step (device/math.h, ifd_math_lr_at). Read only. The gradients are
     * scaled by ifd_math_clip_scale(out->grad_norm, opt->clip_norm) (the grads vector itself is
     * left alone); adamw decays every element outside st->nodecay. Writes out->learning_rate
     * (the rate used, skipped or not) and out->param_norm (the L2 norm of the parameters
     * after it). */
    void (*optimizer_apply)(void *ctx, const ifd_optimizer *opt, const ifd_replica_state *st,
                            int64_t n, ifd_step_out *out);
    /* *step += 1, *opt_step += 1 unless out->skipped, and out->count = rows (device memory).
     * step and opt_step are NULL in eval and predict steps: out->count = rows only. */
    void (*finish_step)(void *ctx, int64_t *step, int64_t *opt_step, ifd_step_out *out,
                        int64_t rows);
} ifd_step_ops;

/* One replica's mirror, in device memory. */
struct ifd_replica_state {
    float *params;
    float *grads;
    float *slot0; /* momentum / adam m */
    float *slot1; /* adam v */
    float *workspace;
    int64_t *step;     /* the global step */
    int64_t *opt_step; /* updates the optimizer slots have seen */
    /* The current step's outfeed tensors (ifd_step_args.outfeeds), set by the backend before
     * each train or eval step; NULL: the step writes none. */
    void *const *outfeeds;
    /* AdamW's parameters left out of weight decay (IFD_PARAM_NO_DECAY): nnodecay sorted,
     * disjoint element ranges [nodecay[2j], nodecay[2j+1]) (ifd_optimizer_nodecay_ranges), in
     * device memory; 0 and NULL: every element decays. */
    const int64_t *nodecay;
    int64_t nnodecay;
};

/* Optimizer slot vectors the kind needs (0, 1 or 2). */
int ifd_optimizer_slots(ifd_optimizer_kind kind);
/* The element ranges of the parameters params[0..nparams) flagged IFD_PARAM_NO_DECAY (a
 * program's p->params), sorted, adjacent ones merged: [lo, hi) pairs into ranges (room for
 * 2 * nparams); returns their count. */
int64_t ifd_optimizer_nodecay_ranges(const ifd_param_spec *params, int nparams, int64_t *ranges);

/* One training step of one replica. A program that returns a code reserved for the runtime's
 * own stop (stopped, canceled, closed, input ended) gets IFD_EINTERNAL instead, so that it
 * cannot pass for a consequence of someone else's error. */
int ifd_step_train(const ifd_program *p, const ifd_ops *ops, const ifd_step_ops *sops, void *sctx,
                   const ifd_replica_state *st, const ifd_optimizer *opt, float scale,
                   const ifd_tensor *inputs, int64_t rows, ifd_step_out *out, ifd_error *err);

/* The program inputs a batch carries in mode: all of them, or in predict mode those that are not
 * labels. Writes their indices into p->inputs to idx, in spec order; returns how many. */
int ifd_step_inputs(const ifd_program *p, ifd_mode mode, int idx[IFD_MAX_INPUTS]);

/* One eval step of one replica: the program's loss and metrics (no gradients, no all-reduce, no
 * update; the global step stays); out->loss is the shard's mean loss (scale 1). */
int ifd_step_eval(const ifd_program *p, const ifd_ops *ops, const ifd_step_ops *sops, void *sctx,
                  const ifd_replica_state *st, const ifd_tensor *inputs, int64_t rows,
                  ifd_step_out *out, ifd_error *err);
/* One predict step: the program's predict_step writes pred ([rows, predict_cols], device
 * memory) from inputs, the shard's non-label tensors in spec order; out->count = rows. */
int ifd_step_predict(const ifd_program *p, const ifd_ops *ops, const ifd_step_ops *sops, void *sctx,
                     const ifd_replica_state *st, const ifd_tensor *inputs, int64_t rows,
                     float *pred, ifd_step_out *out, ifd_error *err);

/* The cpu implementations, for the cpu backend and for tests that run a program directly. */
/* ctx: the replica's team (device/cpu/team.h) that shares its large products, or NULL. */
void ifd_cpu_ops_init(ifd_ops *ops, void *ctx);
/* A product of at least this many multiply-adds is split over the team, in about
 * IFD_TEAM_GEMM_BLOCKS blocks a thread. */
#define IFD_TEAM_GEMM_MACS (1 << 20)
/* The automatic team size's cap: the products of the built-in programs are too small to gain
 * from more threads, which would only spin and wake. */
#define IFD_TEAM_AUTO_MAX 8
#define IFD_TEAM_GEMM_BLOCKS 2
/* The threads each of `replicas` replicas runs its large products and its update on (its team,
 * device/cpu/team.h): requested when above 0 (ifd_config.replica_threads), else the CPUs
 * this process may run on (its affinity) divided by the replicas, at least 1 and at most
 * IFD_TEAM_AUTO_MAX. OpenBLAS then runs
 * every call on its caller (1 thread: the team splits the products), unless
 * OPENBLAS_NUM_THREADS is set: OpenBLAS then does as it says and the auto count is 1, so that
 * the two do not multiply. Process-wide for OpenBLAS (it has no per-call setting).
 *
 * Why a team rather than OpenBLAS's own threads (measured side by side with bench/peers.py:
 * bench/README.md, "team of 2"): OpenBLAS splits a 32-row product in ways that pack the same
 * operand on both threads and its workers spin on sched_yield between calls; the team splits
 * only products large enough to gain, along the side that keeps packing small, lets a helper
 * slowed by the producer on its core take fewer blocks, and sleeps when there is no work. */
int ifd_cpu_replica_threads(int replicas, int requested);
/* One update of n elements at the schedule's rate for *opt_step: no clipping, and (adamw) every
 * element decays. */
void ifd_cpu_optimizer_apply(void *ctx, const ifd_optimizer *opt, const int64_t *opt_step,
                             int64_t n, float *params, const float *grads, float *slot0,
                             float *slot1);
/* The step's passes over the parameter vector run in blocks of IFD_TEAM_UPDATE_BLOCK floats
 * (whole cache lines) shared by a team (device/cpu/team.h; NULL: on the caller); ifd_cpu_blocks
 * is their count. Each block's sum of squares (in double, in a fixed order) is taken while the
 * block is in cache, and the blocks' are added in block order: the same bits with any team. */
#define IFD_TEAM_UPDATE_BLOCK 8192
int64_t ifd_cpu_blocks(int64_t n);
/* As ifd_cpu_optimizer_apply (elementwise: the bits are those of one call), unless *skip is
 * nonzero, and *param_norm (NULL: not wanted) = the L2 norm of params after it. partial:
 * ifd_cpu_blocks(n) doubles of scratch for a team (NULL: on the caller alone). No clipping,
 * and every element decays (adamw). */
void ifd_cpu_optimizer_apply_on(void *team, const ifd_optimizer *opt, const int64_t *opt_step,
                                int64_t n, float *params, const float *grads, float *slot0,
                                float *slot1, const float *skip, double *partial,
                                float *param_norm);
/* The cpu's optimizer_apply (ifd_step_ops) over a team; partial as above. */
void ifd_cpu_update_on(void *team, const ifd_optimizer *opt, const ifd_replica_state *st, int64_t n,
                       double *partial, ifd_step_out *out);
/* The cpu's check_grads over a team: out->skipped and out->grad_norm from one pass; returns
 * the sum of squares. partial as above. */
double ifd_cpu_check_grads_on(void *team, const float *grads, int64_t n, double *partial,
                              ifd_step_out *out);
void ifd_cpu_finish_step(void *ctx, int64_t *step, int64_t *opt_step, ifd_step_out *out,
                         int64_t rows);
/* The cpu's guard_loss (ctx unused). */
void ifd_cpu_guard_loss(void *ctx, ifd_step_out *out, float *grads);
/* guard_loss, check_grads, optimizer_apply and finish_step on the caller's thread (no team);
 * allreduce_sum is the caller's to set. For tests that run a step directly. */
void ifd_cpu_step_ops_init(ifd_step_ops *sops);

#endif
