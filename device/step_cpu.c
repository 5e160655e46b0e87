/* The cpu backend's step ops (device/step.h): the optimizer's update and the finite check of a
 * step's gradients, each on the replica's team in blocks whose sums keep one order; the step's
 * end; and how many threads a replica's team gets. The op set is device/ops_cpu.c. */
#include "device/cpu/team.h"
#include "device/math.h"
#include "device/nn_cpu.h"
#include "device/step.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* One update's scalars, the same for every element: the schedule's rate, Adam's step size, the
 * clipping factor, and the ranges left out of weight decay. */
typedef struct update_plan {
    const ifd_optimizer *opt;
    float lr, lr_t, scale;
    const int64_t *nodecay;
    int64_t nnodecay;
} update_plan;

static update_plan plan_update(const ifd_optimizer *opt, const int64_t *opt_step,
                               const float *grad_norm, const int64_t *nodecay, int64_t nnodecay)
{
    update_plan u = {.opt = opt, .scale = 1.0f, .nodecay = nodecay, .nnodecay = nnodecay};
    u.lr = ifd_math_lr_at((int)opt->lr_schedule, opt->learning_rate, opt->min_learning_rate,
                          opt->warmup_steps, opt->decay_steps, *opt_step);
    if (opt->kind == IFD_OPT_ADAM || opt->kind == IFD_OPT_ADAMW)
        u.lr_t = ifd_math_adam_lr(u.lr, opt->beta1, opt->beta2, *opt_step + 1);
    if (grad_norm)
        u.scale = ifd_math_clip_scale(*grad_norm, opt->clip_norm);
    return u;
}

/* Elements [lo, hi) with weight decay wd (adamw; 0: left out). The optimizer's scalars are read
 * into locals first: read through o inside the loops, they might alias the vectors, and GCC
 * leaves such a loop scalar. This file is built with -fno-math-errno (CMakeLists.txt), which
 * lets Adam's sqrtf be a vector square root: the same correctly rounded bits; IFD_NN_WIDE adds
 * AVX-512 and AVX2 builds. */
IFD_NN_WIDE static void update_elems(const update_plan *u, float wd, int64_t lo, int64_t hi,
                                     float *params, const float *grads, float *slot0, float *slot1)
{
    const ifd_optimizer *o = u->opt;
    float lr = u->lr, s = u->scale, lr_t = u->lr_t, mu = o->momentum;
    float b1 = o->beta1, b2 = o->beta2, eps = o->epsilon;
    switch (o->kind) {
    case IFD_OPT_SGD:
        for (int64_t i = lo; i < hi; i++)
            ifd_math_sgd(&params[i], grads[i] * s, lr);
        break;
    case IFD_OPT_MOMENTUM:
        for (int64_t i = lo; i < hi; i++)
            ifd_math_momentum(&params[i], &slot0[i], grads[i] * s, lr, mu);
        break;
    case IFD_OPT_ADAM:
        for (int64_t i = lo; i < hi; i++)
            ifd_math_adam(&params[i], &slot0[i], &slot1[i], grads[i] * s, lr_t, b1, b2, eps);
        break;
    case IFD_OPT_ADAMW:
        for (int64_t i = lo; i < hi; i++)
            ifd_math_adamw(&params[i], &slot0[i], &slot1[i], grads[i] * s, lr_t, b1, b2, eps, wd,
                           lr);
        break;
    }
}

/* Elements [lo, hi) of the vectors: the stretches between the ranges left out of decay with
 * the optimizer's weight_decay, those ranges with none. */
static void update_range(const update_plan *u, int64_t lo, int64_t hi, float *params,
                         const float *grads, float *slot0, float *slot1)
{
    float wd = u->opt->kind == IFD_OPT_ADAMW ? u->opt->weight_decay : 0.0f;
    int64_t at = lo;
    for (int64_t j = 0; j < u->nnodecay && at < hi; j++) {
        int64_t a = u->nodecay[2 * j], b = u->nodecay[2 * j + 1];
        if (b <= at)
            continue;
        if (a > at) {
            update_elems(u, wd, at, a < hi ? a : hi, params, grads, slot0, slot1);
            at = a < hi ? a : hi;
        }
        if (at < hi) {
            update_elems(u, 0.0f, at, b < hi ? b : hi, params, grads, slot0, slot1);
            at = b < hi ? b : hi;
        }
    }
    if (at < hi)
        update_elems(u, wd, at, hi, params, grads, slot0, slot1);
}

void ifd_cpu_optimizer_apply(void *ctx, const ifd_optimizer *opt, const int64_t *opt_step,
                             int64_t n, float *params, const float *grads, float *slot0,
                             float *slot1)
{
    (void)ctx;
    update_plan u = plan_update(opt, opt_step, NULL, NULL, 0);
    update_range(&u, 0, n, params, grads, slot0, slot1);
}

/*
 * Sums of squares: one pass gives both the finiteness check and the L2 norm. A block is summed
 * in float lanes, then in double; the norm is within 1.5e-5 relative of the exact one (a few
 * 1e-7 in practice). A block whose float sum is not finite is summed again in double, where a
 * float's square is exact and no sum overflows (below 1e231 elements): finite exactly when
 * every element is. The order (lanes, then blocks of IFD_TEAM_UPDATE_BLOCK in order) depends on
 * n alone, so the bits do not depend on the team.
 */
/* In double: exact squares, a sum that never overflows. */
static double sum_squares_double(const float *x, int64_t n)
{
    double a[4] = {0}, s = 0.0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            a[j] += (double)x[i + j] * (double)x[i + j];
    for (; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s + ((a[0] + a[1]) + (a[2] + a[3]));
}

/* A block's sum of squares: in float lanes (16 of them, each adding at most 512 squares of a
 * block: a relative error of a few 1e-7 in practice, 3e-5 at worst), then in double; when the
 * float sum is not finite (an element that is not, or squares beyond float's range) the block
 * is summed again in double, which tells the two apart. */
typedef float ifd_v4f __attribute__((vector_size(16)));

static double sum_squares(const float *x, int64_t n)
{
    ifd_v4f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        ifd_v4f d0, d1, d2, d3;
        memcpy(&d0, x + i, sizeof d0);
        memcpy(&d1, x + i + 4, sizeof d1);
        memcpy(&d2, x + i + 8, sizeof d2);
        memcpy(&d3, x + i + 12, sizeof d3);
        a0 += d0 * d0;
        a1 += d1 * d1;
        a2 += d2 * d2;
        a3 += d3 * d3;
    }
    double s = 0.0;
    for (int j = 0; j < 4; j++)
        s += ((double)a0[j] + (double)a1[j]) + ((double)a2[j] + (double)a3[j]);
    for (; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return isfinite(s) ? s : sum_squares_double(x, n);
}

static int64_t block_len(int64_t n, int64_t i)
{
    int64_t lo = i * IFD_TEAM_UPDATE_BLOCK;
    return n - lo < IFD_TEAM_UPDATE_BLOCK ? n - lo : IFD_TEAM_UPDATE_BLOCK;
}

int64_t ifd_cpu_blocks(int64_t n)
{
    return (n + IFD_TEAM_UPDATE_BLOCK - 1) / IFD_TEAM_UPDATE_BLOCK;
}

/* The update (when update) and the sum of squares of what follows it, block by block: of the
 * gradients (update 0, check) or of the parameters after the update. */
typedef struct block_split {
    const update_plan *plan;
    int64_t n;
    float *params, *slot0, *slot1;
    const float *grads;
    int update;      /* 1: update params, then sum theirs; 0: sum x's */
    const float *x;  /* update 0 */
    double *partial; /* one sum a block */
} block_split;

static double block_sum(const block_split *u, int64_t i)
{
    int64_t lo = i * IFD_TEAM_UPDATE_BLOCK, len = block_len(u->n, i);
    if (!u->update)
        return sum_squares(u->x + lo, len);
    update_range(u->plan, lo, lo + len, u->params, u->grads, u->slot0, u->slot1);
    return sum_squares(u->params + lo, len); /* the block is in L1 still */
}

static void block_run(void *arg, int64_t i)
{
    const block_split *u = arg;
    u->partial[i] = block_sum(u, i);
}

/* Runs u's blocks (on team when worth it) and sums their sums in block order. partial:
 * ifd_cpu_blocks(n) doubles, or NULL for the caller alone (the same bits either way). */
static double blocks_run(void *team, block_split *u, double *partial)
{
    int64_t blocks = ifd_cpu_blocks(u->n);
    double total = 0.0;
    if (partial == NULL || ifd_team_threads(team) == 1 || blocks <= 2) {
        for (int64_t i = 0; i < blocks; i++)
            total += block_sum(u, i);
        return total;
    }
    u->partial = partial;
    ifd_team_run(team, blocks, block_run, u);
    for (int64_t i = 0; i < blocks; i++)
        total += partial[i];
    return total;
}

double ifd_cpu_check_grads_on(void *team, const float *grads, int64_t n, double *partial,
                              ifd_step_out *out)
{
    block_split u = {.n = n, .x = grads, .update = 0};
    double s = blocks_run(team, &u, partial);
    out->skipped = isfinite(s) ? 0.0f : 1.0f;
    out->grad_norm = (float)sqrt(s);
    return s;
}

/* The update of u (unless skip) and the norm of the parameters after it. */
static void update_blocks(void *team, const update_plan *u, const ifd_replica_state *st, int64_t n,
                          const float *skip, double *partial, float *param_norm)
{
    block_split b = {.plan = u,
                     .n = n,
                     .params = st->params,
                     .slot0 = st->slot0,
                     .slot1 = st->slot1,
                     .grads = st->grads,
                     .update = skip == NULL || *skip == 0.0f,
                     .x = st->params};
    double s = blocks_run(team, &b, partial);
    if (param_norm)
        *param_norm = (float)sqrt(s);
}

void ifd_cpu_optimizer_apply_on(void *team, const ifd_optimizer *opt, const int64_t *opt_step,
                                int64_t n, float *params, const float *grads, float *slot0,
                                float *slot1, const float *skip, double *partial, float *param_norm)
{
    update_plan u = plan_update(opt, opt_step, NULL, NULL, 0);
    ifd_replica_state st = {
        .params = params, .grads = (float *)grads, .slot0 = slot0, .slot1 = slot1};
    update_blocks(team, &u, &st, n, skip, partial, param_norm);
}

void ifd_cpu_update_on(void *team, const ifd_optimizer *opt, const ifd_replica_state *st, int64_t n,
                       double *partial, ifd_step_out *out)
{
    update_plan u = plan_update(opt, st->opt_step, &out->grad_norm, st->nodecay, st->nnodecay);
    out->learning_rate = u.lr;
    update_blocks(team, &u, st, n, &out->skipped, partial, &out->param_norm);
}

void ifd_cpu_finish_step(void *ctx, int64_t *step, int64_t *opt_step, ifd_step_out *out,
                         int64_t rows)
{
    (void)ctx;
    if (step)
        *step += 1;
    if (opt_step && out->skipped == 0.0f)
        *opt_step += 1;
    out->count = (float)rows;
}

void ifd_cpu_guard_loss(void *ctx, ifd_step_out *out, float *grads)
{
    (void)ctx;
    int bad = !isfinite(out->loss);
    out->loss_nonfinite = bad ? 1.0f : 0.0f;
    if (bad)
        grads[0] = NAN;
}

/* OpenBLAS's own: stops and joins its server threads (what its fork handler calls before every
 * fork; a later multithreaded call starts them again). Weak: another BLAS lacks it. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

int ifd_cpu_replica_threads(int replicas, int requested)
{
    if (getenv("OPENBLAS_NUM_THREADS"))
        return 1;
    openblas_set_num_threads(1);
    /* On one thread OpenBLAS never hands its servers work, but each spins on sched_yield for
     * about 2^28 cycles after it starts (at load) or after its last job before it sleeps: at the
     * daemon's start about 0.15 s of a core, while the first batches arrive (bench/README.md,
     * "4 KiB against the 0.8 target"). */
    if (blas_thread_shutdown_)
        blas_thread_shutdown_();
    int n = requested;
    if (n <= 0) {
        cpu_set_t set;
        int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        n = replicas > 0 ? cpus / replicas : 1;
        if (n > IFD_TEAM_AUTO_MAX)
            n = IFD_TEAM_AUTO_MAX;
    }
    return n < 1 ? 1 : n;
}

static void plain_check_grads(void *ctx, const float *grads, int64_t n, ifd_step_out *out)
{
    (void)ctx;
    ifd_cpu_check_grads_on(NULL, grads, n, NULL, out);
}

static void plain_optimizer_apply(void *ctx, const ifd_optimizer *opt, const ifd_replica_state *st,
                                  int64_t n, ifd_step_out *out)
{
    (void)ctx;
    ifd_cpu_update_on(NULL, opt, st, n, NULL, out);
}

void ifd_cpu_step_ops_init(ifd_step_ops *sops)
{
    sops->guard_loss = ifd_cpu_guard_loss;
    sops->check_grads = plain_check_grads;
    sops->optimizer_apply = plain_optimizer_apply;
    sops->finish_step = ifd_cpu_finish_step;
}
