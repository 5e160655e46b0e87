/*
 * The cpu backend: one thread per replica; "device memory" is host memory. Each replica has its
 * own mirror of the parameters and optimizer slots, a bounded infeed ring of shards and an
 * outfeed ring built from two queues of record slots (free and full), so no step allocates.
 */
#include "core/log.h"
#include "core/queue.h"
#include "core/thread.h"
#include "device/cpu/allreduce.h"
#include "device/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_dev cpu_dev;

typedef struct cpu_replica {
    int index;
    char name[24];
    cpu_dev *cd;
    ifd_thread thread;
    ifd_queue *infeed;   /* ifd_shard */
    ifd_queue *out_free; /* ifd_outfeed_rec * */
    ifd_queue *out_full; /* ifd_outfeed_rec * */
    ifd_outfeed_rec *slots;
    float *mem; /* params, grads, slot0, slot1, workspace */
    ifd_replica_state st;
    int64_t step;
    int64_t opt_step;
    ifd_ops ops;
    ifd_tensor views[IFD_MAX_INPUTS];
    /* stats, written by the replica thread, read by any thread (ifd_device_stats) */
    int64_t n_steps, loop_ns, infeed_wait_ns, outfeed_wait_ns;
    int64_t pending_in_ns, pending_out_ns; /* this step's waits, published with its time */
    /* result of the current loop, guarded by cd->mu */
    int64_t done_steps;
    int status;
    ifd_error err;
} cpu_replica;

struct cpu_dev {
    ifd_device *dev;
    int replicas;
    cpu_replica *reps;
    ifd_cpu_allreduce ar;
    ifd_step_ops sops;
    ifd_mutex mu;
    ifd_cond cmd_cv;
    ifd_cond done_cv;
    int64_t generation;
    int64_t loop_n;
    int ndone;
    int quit;
    int aborted;      /* atomic */
    int64_t gstep;    /* atomic: replica 0's step */
    int infeed_ended; /* atomic */
};

static inline int64_t load64(const int64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void add64(int64_t *p, int64_t v)
{
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

static int cpu_allreduce_sum(void *ctx, float *buf, int64_t n, ifd_error *err)
{
    cpu_replica *rep = ctx;
    ifd_cpu_allreduce *ar = &rep->cd->ar;
    if (buf != ar->bufs[rep->index] || n != ar->n)
        return ifd_error_set(err, IFD_EINTERNAL,
                             "all-reduce: the cpu backend reduces the %lld gradient floats bound "
                             "at open, got a different vector (%lld floats)",
                             (long long)ar->n, (long long)n);
    int rc = ifd_cpu_allreduce_run(ar, rep->index);
    if (rc == IFD_ESTOPPED)
        ifd_error_set(err, rc, "all-reduce aborted");
    else if (rc == IFD_EEOF)
        ifd_error_set(err, rc, "all-reduce: a peer replica's input ended");
    return rc;
}

/* Pops the next shard, counting the time spent blocked. */
static int pop_shard(cpu_replica *rep, ifd_shard *sh)
{
    int rc = ifd_queue_pop_until(rep->infeed, sh, 0);
    if (rc != IFD_ETIMEDOUT)
        return rc;
    /* About to wait for input: hand the finished steps to the outfeed thread first, or their
     * summaries would wait for the next input. */
    ifd_queue_kick(rep->out_full);
    int64_t t0 = ifd_clock_ns();
    rc = ifd_queue_pop(rep->infeed, sh);
    rep->pending_in_ns += ifd_clock_ns() - t0;
    return rc;
}

static int pop_slot(cpu_replica *rep, ifd_outfeed_rec **slot)
{
    int rc = ifd_queue_pop_until(rep->out_free, slot, 0);
    if (rc != IFD_ETIMEDOUT)
        return rc;
    ifd_queue_kick(rep->out_full); /* the outfeed thread must drain to free a slot */
    int64_t t0 = ifd_clock_ns();
    rc = ifd_queue_pop(rep->out_free, slot);
    rep->pending_out_ns += ifd_clock_ns() - t0;
    return rc;
}

/* One step. IFD_OK, IFD_EEOF (no more input), IFD_ESTOPPED or an error in rep->err. *last is
 * when the previous step ended; it becomes when this one did. */
static int replica_step(cpu_replica *rep, int64_t *last)
{
    cpu_dev *cd = rep->cd;
    const ifd_device_config *cfg = &cd->dev->cfg;
    const ifd_program *p = cfg->program;
    ifd_shard sh;
    int rc = pop_shard(rep, &sh);
    if (rc == IFD_ECLOSED)
        return IFD_EEOF;
    if (rc)
        return rc;
    for (int i = 0; i < p->ninputs; i++)
        ifd_tensor_rows(&sh.batch->tensors[i], sh.row0, sh.row0 + sh.rows, &rep->views[i]);
    ifd_outfeed_rec *slot;
    rc = pop_slot(rep, &slot);
    if (rc) {
        ifd_batch_unref(sh.batch);
        return rc;
    }
    rc = ifd_step_train(p, &rep->ops, &cd->sops, rep, &rep->st, &cfg->optimizer, cfg->loss_scale,
                        rep->views, sh.rows, &slot->out, &rep->err);
    ifd_batch_unref(sh.batch);
    if (rc) {
        ifd_queue_push(rep->out_free, &slot);
        if (!ifd_error_is_secondary(rc) && rc != IFD_EEOF)
            ifd_error_prefix(&rep->err, "step %lld", (long long)(rep->step + 1));
        return rc;
    }
    int64_t now = ifd_clock_ns();
    slot->step = rep->step;
    slot->end_ns = now;
    slot->step_ns = now - *last;
    slot->infeed_wait_ns = rep->pending_in_ns;
    slot->outfeed_wait_ns = rep->pending_out_ns;
    if (rep->index == 0)
        __atomic_store_n(&cd->gstep, rep->step, __ATOMIC_RELEASE);
    add64(&rep->n_steps, 1);
    add64(&rep->infeed_wait_ns, rep->pending_in_ns);
    add64(&rep->outfeed_wait_ns, rep->pending_out_ns);
    add64(&rep->loop_ns, now - *last);
    rep->pending_in_ns = rep->pending_out_ns = 0;
    *last = now;
    return ifd_queue_push(rep->out_full, &slot);
}

typedef struct loop_wait {
    cpu_dev *cd;
    int64_t seen;
} loop_wait;

static int next_loop_ready(void *arg)
{
    loop_wait *w = arg;
    return __atomic_load_n(&w->cd->generation, __ATOMIC_ACQUIRE) != w->seen ||
           __atomic_load_n(&w->cd->quit, __ATOMIC_ACQUIRE);
}

static void *replica_main(void *arg)
{
    cpu_replica *rep = arg;
    cpu_dev *cd = rep->cd;
    int64_t seen = 0;
    for (;;) {
        /* The next loop usually follows within microseconds: spin before sleeping. */
        loop_wait w = {cd, seen};
        ifd_spin_until(next_loop_ready, &w, IFD_SPIN_NS);
        ifd_mutex_lock(&cd->mu);
        while (!cd->quit && cd->generation == seen)
            ifd_cond_wait(&cd->cmd_cv, &cd->mu);
        if (cd->quit) {
            ifd_mutex_unlock(&cd->mu);
            break;
        }
        seen = cd->generation;
        int64_t n = cd->loop_n;
        ifd_mutex_unlock(&cd->mu);

        /* Loop time is counted step by step so that summaries taken mid-loop see it. */
        int64_t last = ifd_clock_ns(), done = 0;
        int rc = IFD_OK;
        ifd_error_clear(&rep->err);
        while (done < n) {
            rc = replica_step(rep, &last);
            if (rc)
                break;
            done++;
        }
        /* A step that did not finish (input ended, stopped, failed) still spent its time. */
        add64(&rep->infeed_wait_ns, rep->pending_in_ns);
        add64(&rep->outfeed_wait_ns, rep->pending_out_ns);
        add64(&rep->loop_ns, ifd_clock_ns() - last);
        rep->pending_in_ns = rep->pending_out_ns = 0;
        /* The outfeed thread is woken in bursts; the end of a loop hands over the rest. */
        ifd_queue_kick(rep->out_full);
        if (rc == IFD_EEOF) {
            /* The input ended: peers stop at the same step instead of waiting for us, and the
             * outfeed thread learns there is nothing more once it has drained what we wrote. */
            ifd_cpu_allreduce_leave(&cd->ar);
            ifd_queue_close(rep->out_full);
        } else if (rc && !ifd_error_is_secondary(rc)) {
            if (rep->err.code != rc)
                ifd_error_set(&rep->err, rc, "%s", ifd_strerror(rc));
            if (cd->dev->cfg.on_error)
                cd->dev->cfg.on_error(cd->dev->cfg.on_error_arg, rep->name, &rep->err);
            /* Peers may be waiting for this replica in the all-reduce: an error ends the run,
             * so stop the device whether or not anyone listens to on_error. */
            cd->dev->be->abort(cd->dev);
        }
        ifd_mutex_lock(&cd->mu);
        rep->done_steps = done;
        rep->status = rc;
        __atomic_store_n(&cd->ndone, cd->ndone + 1, __ATOMIC_RELEASE);
        ifd_cond_broadcast(&cd->done_cv);
        ifd_mutex_unlock(&cd->mu);
    }
    return NULL;
}

static int replica_open(cpu_dev *cd, cpu_replica *rep, int index, const float *init, ifd_error *err)
{
    const ifd_device_config *cfg = &cd->dev->cfg;
    const ifd_program *p = cfg->program;
    int64_t np = p->nparam_floats;
    int64_t ws = p->cls->workspace_floats(p, cfg->max_shard_rows);
    rep->index = index;
    rep->cd = cd;
    rep->step = cfg->initial_step;
    snprintf(rep->name, sizeof rep->name, "replica %d", index);
    ifd_cpu_ops_init(&rep->ops, rep);

    rep->mem = calloc((size_t)(4 * np + ws + 1), sizeof(float));
    rep->slots = calloc((size_t)cfg->outfeed_depth, sizeof *rep->slots);
    if (rep->mem == NULL || rep->slots == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: replica %d: %lld parameter floats",
                             index, (long long)np);
    rep->st.params = rep->mem;
    rep->st.grads = rep->mem + np;
    rep->st.slot0 = rep->mem + 2 * np;
    rep->st.slot1 = rep->mem + 3 * np;
    rep->st.workspace = rep->mem + 4 * np;
    rep->st.step = &rep->step;
    rep->st.opt_step = &rep->opt_step;
    memcpy(rep->st.params, init, sizeof(float) * (size_t)np);
    ifd_cpu_allreduce_bind(&cd->ar, index, rep->st.grads);

    if (ifd_queue_create(&rep->infeed, sizeof(ifd_shard), (size_t)cfg->infeed_depth) ||
        ifd_queue_create(&rep->out_free, sizeof(ifd_outfeed_rec *), (size_t)cfg->outfeed_depth) ||
        ifd_queue_create(&rep->out_full, sizeof(ifd_outfeed_rec *), (size_t)cfg->outfeed_depth))
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: replica %d rings", index);
    /* Hand-offs in bursts of half a ring: see core/queue.h. */
    ifd_queue_set_wake(rep->infeed, (size_t)cfg->infeed_depth / 2, (size_t)cfg->infeed_depth / 2);
    ifd_queue_set_wake(rep->out_full, (size_t)cfg->outfeed_depth / 2, 1);
    for (int i = 0; i < cfg->outfeed_depth; i++) {
        ifd_outfeed_rec *slot = &rep->slots[i];
        ifd_queue_push(rep->out_free, &slot);
    }
    char tname[32];
    snprintf(tname, sizeof tname, "ifd-replica%d", index);
    if (ifd_thread_start(&rep->thread, tname, replica_main, rep))
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: cannot start replica thread %d", index);
    return IFD_OK;
}

static void unref_shard(void *item, void *arg)
{
    (void)arg;
    ifd_batch_unref(((ifd_shard *)item)->batch);
}

static void cpu_close(ifd_device *dev)
{
    cpu_dev *cd = dev->priv;
    if (cd->reps == NULL)
        return;
    ifd_mutex_lock(&cd->mu);
    __atomic_store_n(&cd->quit, 1, __ATOMIC_RELEASE);
    ifd_cond_broadcast(&cd->cmd_cv);
    ifd_mutex_unlock(&cd->mu);
    for (int r = 0; r < cd->replicas; r++)
        ifd_thread_join(&cd->reps[r].thread);
    for (int r = 0; r < cd->replicas; r++) {
        cpu_replica *rep = &cd->reps[r];
        if (rep->infeed) {
            size_t left = ifd_queue_drain(rep->infeed, unref_shard, NULL);
            if (left)
                IFD_LOG_DEBUG("replica %d: released %zu unconsumed shards", r, left);
        }
        ifd_queue_destroy(rep->infeed);
        ifd_queue_destroy(rep->out_free);
        ifd_queue_destroy(rep->out_full);
        free(rep->slots);
        free(rep->mem);
    }
    free(cd->reps);
    cd->reps = NULL;
    ifd_cpu_allreduce_fini(&cd->ar);
    ifd_cond_fini(&cd->done_cv);
    ifd_cond_fini(&cd->cmd_cv);
    ifd_mutex_fini(&cd->mu);
}

static int cpu_open(ifd_device *dev, ifd_error *err)
{
    cpu_dev *cd = dev->priv;
    const ifd_device_config *cfg = &dev->cfg;
    const ifd_program *p = cfg->program;
    cd->dev = dev;
    cd->replicas = cfg->replicas;
    cd->gstep = cfg->initial_step;
    cd->sops.allreduce_sum = cpu_allreduce_sum;
    cd->sops.optimizer_apply = ifd_cpu_optimizer_apply;
    cd->sops.finish_step = ifd_cpu_finish_step;
    ifd_mutex_init(&cd->mu);
    ifd_cond_init(&cd->cmd_cv);
    ifd_cond_init(&cd->done_cv);

    int rc = IFD_OK;
    float *init = malloc(sizeof(float) * (size_t)(p->nparam_floats + 1));
    cd->reps = calloc((size_t)cd->replicas, sizeof *cd->reps);
    if (init == NULL || cd->reps == NULL ||
        ifd_cpu_allreduce_init(&cd->ar, cd->replicas, p->nparam_floats)) {
        free(init);
        free(cd->reps);
        cd->reps = NULL;
        ifd_cond_fini(&cd->done_cv);
        ifd_cond_fini(&cd->cmd_cv);
        ifd_mutex_fini(&cd->mu);
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: %d replicas of %lld parameter floats",
                             cd->replicas, (long long)p->nparam_floats);
    }
    p->cls->init_params(p, init, cfg->seed);
    for (int r = 0; r < cd->replicas; r++) {
        rc = replica_open(cd, &cd->reps[r], r, init, err);
        if (rc)
            goto fail;
    }
    free(init);
    IFD_LOG_INFO("cpu backend: %d replicas, %lld parameters", cd->replicas,
                 (long long)p->nparam_floats);
    return IFD_OK;

fail:
    free(init);
    cpu_close(dev);
    return rc;
}

static int cpu_infeed_enqueue(ifd_device *dev, int replica, const ifd_shard *shard)
{
    cpu_dev *cd = dev->priv;
    ifd_batch_ref(shard->batch, 1);
    int rc = ifd_queue_push(cd->reps[replica].infeed, shard);
    if (rc)
        ifd_batch_unref(shard->batch);
    return rc == IFD_ECLOSED ? IFD_ESTOPPED : rc;
}

static void cpu_infeed_flush(ifd_device *dev)
{
    cpu_dev *cd = dev->priv;
    for (int r = 0; r < cd->replicas; r++)
        ifd_queue_kick(cd->reps[r].infeed);
}

static void cpu_infeed_end(ifd_device *dev)
{
    cpu_dev *cd = dev->priv;
    __atomic_store_n(&cd->infeed_ended, 1, __ATOMIC_RELEASE);
    for (int r = 0; r < cd->replicas; r++)
        ifd_queue_close(cd->reps[r].infeed);
}

static int cpu_outfeed_dequeue(ifd_device *dev, int replica, ifd_outfeed_rec *rec)
{
    cpu_dev *cd = dev->priv;
    cpu_replica *rep = &cd->reps[replica];
    ifd_outfeed_rec *slot;
    int rc = ifd_queue_pop(rep->out_full, &slot);
    if (rc == IFD_ECLOSED)
        return IFD_EEOF;
    if (rc)
        return rc;
    *rec = *slot;
    ifd_queue_push(rep->out_free, &slot);
    return IFD_OK;
}

static int cpu_run_loop(ifd_device *dev, int64_t n, int64_t *steps_done, ifd_error *err)
{
    cpu_dev *cd = dev->priv;
    *steps_done = 0;
    if (__atomic_load_n(&cd->aborted, __ATOMIC_ACQUIRE))
        return ifd_error_set(err, IFD_ESTOPPED, "device aborted");
    ifd_mutex_lock(&cd->mu);
    cd->loop_n = n;
    __atomic_store_n(&cd->ndone, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&cd->generation, cd->generation + 1, __ATOMIC_RELEASE);
    ifd_cond_broadcast(&cd->cmd_cv);
    while (cd->ndone < cd->replicas)
        ifd_cond_wait(&cd->done_cv, &cd->mu);
    int64_t done = n;
    int rc = IFD_OK;
    for (int r = 0; r < cd->replicas; r++) {
        cpu_replica *rep = &cd->reps[r];
        if (rep->done_steps < done)
            done = rep->done_steps;
        int s = rep->status;
        /* Rank: a real error, then stopped, then end of input. */
        if (s && (rc == IFD_OK || rc == IFD_EEOF ||
                  (ifd_error_is_secondary(rc) && !ifd_error_is_secondary(s) && s != IFD_EEOF))) {
            rc = s;
            if (err)
                *err = rep->err;
        }
    }
    ifd_mutex_unlock(&cd->mu);
    *steps_done = done;
    if (rc == IFD_EEOF)
        ifd_error_set(err, IFD_EEOF, "the input ended after %lld of %lld steps", (long long)done,
                      (long long)n);
    return rc;
}

static int cpu_read_params(ifd_device *dev, int replica, float *out, ifd_error *err)
{
    cpu_dev *cd = dev->priv;
    if (replica < 0 || replica >= cd->replicas)
        return ifd_error_set(err, IFD_EINVAL, "replica: expected 0 to %d, got %d", cd->replicas - 1,
                             replica);
    memcpy(out, cd->reps[replica].st.params,
           sizeof(float) * (size_t)dev->cfg.program->nparam_floats);
    return IFD_OK;
}

static int64_t cpu_global_step(ifd_device *dev)
{
    cpu_dev *cd = dev->priv;
    return __atomic_load_n(&cd->gstep, __ATOMIC_ACQUIRE);
}

static void cpu_stats(ifd_device *dev, int replica, ifd_device_stats *out)
{
    cpu_replica *rep = &((cpu_dev *)dev->priv)->reps[replica];
    out->steps = load64(&rep->n_steps);
    out->loop_ns = load64(&rep->loop_ns);
    out->infeed_wait_ns = load64(&rep->infeed_wait_ns);
    out->outfeed_wait_ns = load64(&rep->outfeed_wait_ns);
}

static void cpu_abort(ifd_device *dev)
{
    cpu_dev *cd = dev->priv;
    __atomic_store_n(&cd->aborted, 1, __ATOMIC_RELEASE);
    ifd_cpu_allreduce_abort(&cd->ar);
    for (int r = 0; r < cd->replicas; r++) {
        ifd_queue_abort(cd->reps[r].infeed);
        ifd_queue_abort(cd->reps[r].out_free);
        ifd_queue_abort(cd->reps[r].out_full);
    }
}

const ifd_device_backend ifd_device_backend_cpu = {
    .name = "cpu",
    .priv_size = sizeof(cpu_dev),
    .open = cpu_open,
    .close = cpu_close,
    .infeed_enqueue = cpu_infeed_enqueue,
    .infeed_flush = cpu_infeed_flush,
    .infeed_end = cpu_infeed_end,
    .outfeed_dequeue = cpu_outfeed_dequeue,
    .run_loop = cpu_run_loop,
    .read_params = cpu_read_params,
    .global_step = cpu_global_step,
    .stats = cpu_stats,
    .abort = cpu_abort,
};
