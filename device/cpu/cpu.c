/*
 * The cpu backend: one thread per replica; "device memory" is host memory. Each replica has its
 * own mirror of the parameters and optimizer slots, a bounded infeed ring of shards and an
 * outfeed ring built from two queues of record slots (free and full), so no step allocates.
 */
#include "core/log.h"
#include "core/queue.h"
#include "core/thread.h"
#include "device/cpu/allreduce.h"
#include "device/cpu/blas.h"
#include "device/cpu/team.h"
#include "device/device.h"
#include "device/replicas.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_dev cpu_dev;

typedef struct cpu_replica {
    ifd_replica base; /* first: the replica thread (device/replicas.h) */
    cpu_dev *cd;
    ifd_queue *infeed; /* ifd_shard */
    /* Shards taken from the infeed ring in one burst (ifd_queue_take, up to half the ring), so
     * that the replica and the infeed thread do not contend for the ring's lock a step; in_used
     * of in_taken used. in_left (atomic) is what is left, for the stats. */
    ifd_shard *in_hand;
    size_t in_max, in_taken, in_used;
    int64_t in_left;
    ifd_queue *out_free; /* ifd_outfeed_rec * */
    ifd_queue *out_full; /* ifd_outfeed_rec * */
    ifd_outfeed_rec *slots;
    float *pred_mem; /* predict: a [max_shard_rows, predict_cols] block per slot, then one for
                      * the record outfeed_dequeue hands out */
    /* train, eval: outfeed_depth + 1 outfeed areas (out_bytes, the program's outfeed tensors at
     * out_offs): areas[i] is slot i's, spare the one the record outfeed_dequeue handed out holds
     * (a dequeue swaps the slot's filled area with it: nothing copied) */
    unsigned char *out_mem;
    unsigned char **areas, *spare;
    void *out_ptrs[IFD_MAX_OUTFEEDS]; /* the current step's tensors (st.outfeeds) */
    float *mem;                       /* params, grads, slot0, slot1, workspace */
    ifd_replica_state st;
    int64_t step;
    int64_t opt_step;
    ifd_ops ops;
    ifd_team *team;  /* shares the large products and the update; NULL: this thread alone */
    double *partial; /* the team's block sums (ifd_cpu_blocks of the parameters) */
    ifd_tensor views[IFD_MAX_INPUTS];
    int64_t last_ns;                       /* when the previous step ended (or the loop began) */
    int64_t pending_in_ns, pending_out_ns; /* this step's waits, published with its time */
} cpu_replica;

_Static_assert(offsetof(cpu_replica, base) == 0, "ifd_replica comes first");

struct cpu_dev {
    ifd_replicas set; /* first: run_loop, global_step and stats are the set's */
    ifd_device *dev;
    int replicas;
    int threads; /* a replica's team: ifd_cpu_replica_threads */
    cpu_replica *reps;
    ifd_cpu_allreduce ar;
    ifd_step_ops sops;
    int64_t *nodecay; /* the replicas' st.nodecay, shared (read only) */
    int64_t nnodecay;
    int64_t out_bytes; /* a step's outfeed area (0: the program declares none, or predict) */
    int64_t out_offs[IFD_MAX_OUTFEEDS];
    int infeed_ended; /* atomic */
    int hosts_ended;  /* atomic: the hosts' collective ended the input (another host's ended) */
};

_Static_assert(offsetof(cpu_dev, set) == 0, "ifd_replicas comes first");

static int cpu_allreduce_sum(void *ctx, float *buf, int64_t n, ifd_error *err)
{
    cpu_replica *rep = ctx;
    ifd_cpu_allreduce *ar = &rep->cd->ar;
    if (buf != ar->bufs[rep->base.index] || n != ar->n)
        return ifd_error_set(err, IFD_EINTERNAL,
                             "all-reduce: the cpu backend reduces the %lld gradient floats bound "
                             "at open, got a different vector (%lld floats)",
                             (long long)ar->n, (long long)n);
    int rc = ifd_cpu_allreduce_run(ar, rep->base.index);
    if (rc == IFD_ESTOPPED)
        ifd_error_set(err, rc, "all-reduce aborted");
    else if (rc == IFD_EEOF && ar->ended_host >= 0)
        ifd_error_set(err, rc, "all-reduce: the input of host %d ended", ar->ended_host);
    else if (rc == IFD_EEOF)
        ifd_error_set(err, rc, "all-reduce: a peer replica's input ended");
    else if (rc)
        *err = ar->host_err;
    return rc;
}

/* The check and the update on the replica's team. */
static void cpu_check_grads(void *ctx, const float *grads, int64_t n, ifd_step_out *out)
{
    cpu_replica *rep = ctx;
    ifd_cpu_check_grads_on(rep->team, grads, n, rep->partial, out);
}

static void cpu_optimizer_apply(void *ctx, const ifd_optimizer *opt, const ifd_replica_state *st,
                                int64_t n, ifd_step_out *out)
{
    cpu_replica *rep = ctx;
    ifd_cpu_update_on(rep->team, opt, st, n, rep->partial, out);
}

/* Floats of one step's predictions (predict mode; else 0). */
static int64_t pred_floats(const ifd_device_config *cfg)
{
    return cfg->mode == IFD_MODE_PREDICT ? cfg->max_shard_rows * cfg->program->predict_cols : 0;
}

/* The next shard: from the last burst taken, else the ring's next burst, counting the time spent
 * blocked. An abort stops the replica at its next shard either way. */
static int pop_shard(cpu_replica *rep, ifd_shard *sh)
{
    int rc = IFD_OK;
    if (rep->in_used < rep->in_taken) {
        if (ifd_queue_is_aborted(rep->infeed))
            return IFD_ESTOPPED;
        goto hand;
    }
    rc = ifd_queue_take_until(rep->infeed, rep->in_hand, rep->in_max, &rep->in_taken, 0);
    if (rc == IFD_ETIMEDOUT) {
        /* About to wait for input: hand the finished steps to the outfeed thread first, or
         * their summaries would wait for the next input. */
        ifd_queue_kick(rep->out_full);
        int64_t t0 = ifd_clock_ns();
        rc = ifd_queue_take(rep->infeed, rep->in_hand, rep->in_max, &rep->in_taken);
        rep->pending_in_ns += ifd_clock_ns() - t0;
    }
    rep->in_used = 0;
    if (rc)
        return rc;
hand:
    *sh = rep->in_hand[rep->in_used++];
    __atomic_store_n(&rep->in_left, (int64_t)(rep->in_taken - rep->in_used), __ATOMIC_RELAXED);
    return IFD_OK;
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

/* ---- the replica thread's callbacks (device/replicas.h) -------------------------------------- */

static void cpu_loop_begin(ifd_replica *base, int64_t start_ns)
{
    ((cpu_replica *)base)->last_ns = start_ns;
}

/* One step. IFD_OK, IFD_EEOF (no more input), IFD_ESTOPPED or an error in rep->base.err.
 * rep->last_ns is when the previous step ended; it becomes when this one did. */
static int cpu_step(ifd_replica *base, int64_t nth)
{
    (void)nth;
    cpu_replica *rep = (cpu_replica *)base;
    cpu_dev *cd = rep->cd;
    const ifd_device_config *cfg = &cd->dev->cfg;
    const ifd_program *p = cfg->program;
    ifd_shard sh;
    int rc = pop_shard(rep, &sh);
    if (rc == IFD_ECLOSED)
        return IFD_EEOF;
    if (rc)
        return rc;
    if (sh.batch->flags & IFD_BATCH_STOP) { /* predict's stopping signal: the loop ends here */
        ifd_batch_unref(sh.batch);
        return IFD_EEOF;
    }
    for (int i = 0; i < sh.batch->ntensors; i++)
        ifd_tensor_rows(&sh.batch->tensors[i], sh.row0, sh.row0 + sh.rows, &rep->views[i]);
    ifd_outfeed_rec *slot;
    rc = pop_slot(rep, &slot);
    if (rc) {
        ifd_batch_unref(sh.batch);
        return rc;
    }
    slot->batch = NULL;
    slot->rows = sh.rows;
    slot->outfeed = NULL;
    slot->to_sinks = (sh.outfeeds & IFD_SHARD_TO_SINKS) != 0;
    ifd_batch_tag_set(&slot->from, sh.batch);
    if (cd->out_bytes > 0 && (sh.outfeeds & IFD_SHARD_OUTFEEDS)) {
        unsigned char *area = rep->areas[slot - rep->slots];
        for (int i = 0; i < p->noutfeeds; i++)
            rep->out_ptrs[i] = area + cd->out_offs[i];
        slot->outfeed = area;
    }
    rep->st.outfeeds = slot->outfeed ? rep->out_ptrs : NULL;
    switch (cfg->mode) {
    case IFD_MODE_TRAIN:
        rc = ifd_step_train(p, &rep->ops, &cd->sops, rep, &rep->st, &cfg->optimizer,
                            cfg->loss_scale, rep->views, sh.rows, &slot->out, &base->err);
        break;
    case IFD_MODE_EVAL:
        rc = ifd_step_eval(p, &rep->ops, &cd->sops, rep, &rep->st, rep->views, sh.rows, &slot->out,
                           &base->err);
        /* Several hosts: an empty all-reduce carries only the hosts' flags, so a host whose
         * input ended ends this step on every host, as in train mode (the step is dropped). */
        if (rc == IFD_OK && cd->ar.hosts)
            rc = cpu_allreduce_sum(rep, cd->ar.bufs[base->index], 0, &base->err);
        break;
    case IFD_MODE_PREDICT: {
        float *pred = rep->pred_mem + (size_t)(slot - rep->slots) * (size_t)pred_floats(cfg);
        rc = ifd_step_predict(p, &rep->ops, &cd->sops, rep, &rep->st, rep->views, sh.rows, pred,
                              &slot->out, &base->err);
        if (rc == IFD_OK) { /* the outfeed thread routes the predictions by batch, then drops it */
            slot->batch = sh.batch;
            slot->row0 = sh.row0;
            slot->rows = sh.rows;
            slot->pred = pred;
            ifd_batch_ref(sh.batch, 1);
        }
        break;
    }
    }
    ifd_batch_unref(sh.batch);
    if (rc) {
        ifd_queue_push(rep->out_free, &slot);
        if (!ifd_error_is_secondary(rc) && rc != IFD_EEOF)
            ifd_replica_step_error(base, cfg->mode, rep->step, base->stats.steps);
        return rc;
    }
    int64_t now = ifd_clock_ns();
    slot->step = rep->step;
    slot->end_ns = now;
    slot->step_ns = now - rep->last_ns;
    slot->infeed_wait_ns = rep->pending_in_ns;
    slot->outfeed_wait_ns = rep->pending_out_ns;
    if (base->index == 0)
        ifd_replicas_publish_step(&cd->set, rep->step);
    ifd_replica_stats_add(base, 1, now - rep->last_ns, rep->pending_in_ns, rep->pending_out_ns);
    rep->pending_in_ns = rep->pending_out_ns = 0;
    rep->last_ns = now;
    return ifd_queue_push(rep->out_full, &slot);
}

static int cpu_loop_end(ifd_replica *base, int rc, int64_t done)
{
    (void)done;
    cpu_replica *rep = (cpu_replica *)base;
    /* A step that did not finish (input ended, stopped, failed) still spent its time; loop time
     * is otherwise counted step by step, so that summaries taken mid-loop see it. */
    ifd_replica_stats_add(base, 0, ifd_clock_ns() - rep->last_ns, rep->pending_in_ns,
                          rep->pending_out_ns);
    rep->pending_in_ns = rep->pending_out_ns = 0;
    /* The outfeed thread is woken in bursts; the end of a loop hands over the rest. */
    ifd_queue_kick(rep->out_full);
    return rc;
}

/* Peers stop at the same step instead of waiting for us in the all-reduce, and the outfeed
 * thread learns there is nothing more once it has drained what we wrote. */
static void cpu_input_ended(ifd_replica *base)
{
    cpu_replica *rep = (cpu_replica *)base;
    cpu_dev *cd = rep->cd;
    if (cd->ar.ended_host >= 0) {
        /* Another host's input ended: this host's infeed thread may be blocked pushing the
         * loop's next shards; it is told the input ended (cpu_infeed_enqueue). */
        __atomic_store_n(&cd->hosts_ended, 1, __ATOMIC_RELEASE);
        ifd_queue_close(rep->infeed);
    }
    ifd_cpu_allreduce_leave(&cd->ar);
    ifd_queue_close(rep->out_full);
}

static const ifd_replica_ops cpu_replica_ops = {
    .loop_begin = cpu_loop_begin,
    .step = cpu_step,
    .loop_end = cpu_loop_end,
    .input_ended = cpu_input_ended,
};

/* ---- open and close -------------------------------------------------------------------------- */

static int replica_open(cpu_dev *cd, cpu_replica *rep, int index, const float *init, ifd_error *err)
{
    const ifd_device_config *cfg = &cd->dev->cfg;
    const ifd_program *p = cfg->program;
    int64_t np = p->nparam_floats;
    rep->cd = cd;
    rep->step = cfg->initial_step;
    char tname[32];
    snprintf(tname, sizeof tname, "ifd-replica%d", index);
    if (cd->threads > 1 && ifd_team_create(&rep->team, cd->threads, tname))
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: replica %d: cannot start its team",
                             index);
    ifd_cpu_ops_init(&rep->ops, rep->team);

    rep->mem = calloc((size_t)ifd_replica_mem_floats(cfg), sizeof(float));
    rep->slots = calloc((size_t)cfg->outfeed_depth, sizeof *rep->slots);
    rep->pred_mem =
        calloc((size_t)(pred_floats(cfg) * (cfg->outfeed_depth + 1) + 1), sizeof(float));
    rep->out_mem = calloc((size_t)(cd->out_bytes * (cfg->outfeed_depth + 1) + 1), 1);
    rep->partial = calloc((size_t)ifd_cpu_blocks(np) + 1, sizeof(double));
    rep->areas = calloc((size_t)cfg->outfeed_depth, sizeof *rep->areas);
    for (int i = 0; rep->areas && rep->out_mem && i < cfg->outfeed_depth; i++)
        rep->areas[i] = rep->out_mem + (size_t)i * (size_t)cd->out_bytes;
    if (rep->out_mem)
        rep->spare = rep->out_mem + (size_t)cfg->outfeed_depth * (size_t)cd->out_bytes;
    if (rep->mem == NULL || rep->slots == NULL || rep->pred_mem == NULL || rep->out_mem == NULL ||
        rep->partial == NULL || rep->areas == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: replica %d: %lld parameter floats",
                             index, (long long)np);
    ifd_replica_mem_carve(&rep->st, rep->mem, np);
    rep->st.step = &rep->step;
    rep->st.opt_step = &rep->opt_step;
    rep->st.nodecay = cd->nodecay;
    rep->st.nnodecay = cd->nnodecay;
    memcpy(rep->st.params, init, sizeof(float) * (size_t)np);
    if (cfg->init_slots)
        memcpy(rep->st.slot0, cfg->init_slots,
               sizeof(float) * (size_t)ifd_replica_slot_floats(cfg));
    rep->opt_step = cfg->init_opt_step;
    ifd_cpu_allreduce_bind(&cd->ar, index, rep->st.grads);

    if (ifd_queue_create(&rep->infeed, sizeof(ifd_shard), (size_t)cfg->infeed_depth) ||
        ifd_queue_create(&rep->out_free, sizeof(ifd_outfeed_rec *), (size_t)cfg->outfeed_depth) ||
        ifd_queue_create(&rep->out_full, sizeof(ifd_outfeed_rec *), (size_t)cfg->outfeed_depth))
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: replica %d rings", index);
    /* Hand-offs in bursts of half a ring: see core/queue.h. */
    ifd_queue_set_wake(rep->infeed, (size_t)cfg->infeed_depth / 2, (size_t)cfg->infeed_depth / 2);
    rep->in_max = cfg->infeed_depth / 2 > 1 ? (size_t)cfg->infeed_depth / 2 : 1;
    rep->in_hand = calloc(rep->in_max, sizeof *rep->in_hand);
    if (rep->in_hand == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: replica %d rings", index);
    ifd_queue_set_wake(rep->out_full, (size_t)cfg->outfeed_depth / 2, 1);
    for (int i = 0; i < cfg->outfeed_depth; i++) {
        ifd_outfeed_rec *slot = &rep->slots[i];
        ifd_queue_push(rep->out_free, &slot);
    }
    if (ifd_replicas_start(&cd->set, index, tname))
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: cannot start replica thread %d", index);
    return IFD_OK;
}

static void unref_shard(void *item, void *arg)
{
    (void)arg;
    ifd_batch_unref(((ifd_shard *)item)->batch);
}

/* A step record the outfeed thread never took still holds its batch (predict mode). */
static void unref_rec(void *item, void *arg)
{
    (void)arg;
    ifd_outfeed_rec *rec = *(ifd_outfeed_rec **)item;
    if (rec->batch)
        ifd_batch_unref(rec->batch);
    rec->batch = NULL;
}

static void cpu_close(ifd_device *dev)
{
    cpu_dev *cd = dev->priv;
    if (cd->reps == NULL)
        return;
    ifd_replicas_stop(&cd->set);
    for (int r = 0; r < cd->replicas; r++) {
        cpu_replica *rep = &cd->reps[r];
        for (size_t i = rep->in_used; i < rep->in_taken; i++)
            unref_shard(&rep->in_hand[i], NULL);
        if (rep->infeed) {
            size_t left = ifd_queue_drain(rep->infeed, unref_shard, NULL);
            left += rep->in_taken - rep->in_used;
            if (left)
                IFD_LOG_DEBUG("replica %d: released %zu unconsumed shards", r, left);
        }
        if (rep->out_full)
            ifd_queue_drain(rep->out_full, unref_rec, NULL);
        ifd_queue_destroy(rep->infeed);
        free(rep->in_hand);
        ifd_queue_destroy(rep->out_free);
        ifd_queue_destroy(rep->out_full);
        free(rep->slots);
        free(rep->pred_mem);
        free(rep->out_mem);
        free(rep->partial);
        free(rep->areas);
        free(rep->mem);
        ifd_team_destroy(rep->team);
    }
    ifd_replicas_fini(&cd->set);
    free(cd->reps);
    cd->reps = NULL;
    free(cd->nodecay);
    cd->nodecay = NULL;
    if (cd->ar.hosts && cd->ar.host_calls > 0)
        IFD_LOG_INFO("all-reduce across %d hosts: %lld steps, %.1f us a step in the collective "
                     "(%lld bytes sent a step)",
                     cd->ar.hosts->size, (long long)cd->ar.host_calls,
                     (double)cd->ar.host_ns * 1e-3 / (double)cd->ar.host_calls,
                     (long long)(sizeof(float) * (size_t)(cd->ar.replicas * cd->ar.n + 1)));
    ifd_cpu_allreduce_fini(&cd->ar);
}

static int cpu_open(ifd_device *dev, ifd_error *err)
{
    cpu_dev *cd = dev->priv;
    const ifd_device_config *cfg = &dev->cfg;
    const ifd_program *p = cfg->program;
    cd->dev = dev;
    cd->replicas = cfg->replicas;
    cd->out_bytes = cfg->mode == IFD_MODE_PREDICT
                        ? 0
                        : ifd_program_outfeed_layout(p, cfg->max_shard_rows, cd->out_offs);
    cd->sops.allreduce_sum = cpu_allreduce_sum;
    cd->sops.guard_loss = ifd_cpu_guard_loss;
    cd->sops.check_grads = cpu_check_grads;
    cd->sops.optimizer_apply = cpu_optimizer_apply;
    cd->sops.finish_step = ifd_cpu_finish_step;
    int rc = ifd_blas_select(cfg->blas_kernel, err);
    if (rc)
        return rc;
    ifd_blas_info blas;
    char line[256];
    ifd_blas_info_get(&blas);
    IFD_LOG_INFO("cpu backend: BLAS %s", ifd_blas_describe(&blas, line, sizeof line));
    cd->threads = ifd_cpu_replica_threads(cfg->replicas, cfg->replica_threads);
    IFD_LOG_DEBUG("cpu backend: each replica runs its large products on %d thread%s%s", cd->threads,
                  cd->threads == 1 ? "" : "s",
                  getenv("OPENBLAS_NUM_THREADS") ? " (OPENBLAS_NUM_THREADS is set)" : "");

    float *init = malloc(sizeof(float) * (size_t)(p->nparam_floats + 1));
    cd->reps = calloc((size_t)cd->replicas, sizeof *cd->reps);
    cd->nodecay = malloc(sizeof(int64_t) * (size_t)(2 * p->nparams + 1));
    int ar_ok = 0;
    if (init == NULL || cd->reps == NULL || cd->nodecay == NULL ||
        ifd_cpu_allreduce_init(&cd->ar, cd->replicas,
                               cfg->mode == IFD_MODE_TRAIN ? p->nparam_floats : 0) ||
        (ar_ok = 1,
         ifd_cpu_allreduce_set_hosts(&cd->ar, cfg->mode != IFD_MODE_PREDICT ? cfg->hosts : NULL))) {
        if (ar_ok)
            ifd_cpu_allreduce_fini(&cd->ar);
        free(init);
        free(cd->reps);
        cd->reps = NULL;
        free(cd->nodecay);
        cd->nodecay = NULL;
        return ifd_error_set(err, IFD_ENOMEM, "cpu backend: %d replicas of %lld parameter floats",
                             cd->replicas, (long long)p->nparam_floats);
    }
    cd->nnodecay = ifd_optimizer_nodecay_ranges(p->params, p->nparams, cd->nodecay);
    ifd_replicas_init(&cd->set, dev, cd->reps, sizeof *cd->reps, &cpu_replica_ops, IFD_SPIN_NS);
    const float *start = ifd_replica_initial_params(cfg, init);
    for (int r = 0; r < cd->replicas; r++) {
        rc = replica_open(cd, &cd->reps[r], r, start, err);
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

/* ---- the infeed and outfeed threads ---------------------------------------------------------- */

static int cpu_infeed_enqueue(ifd_device *dev, int replica, const ifd_shard *shard)
{
    cpu_dev *cd = dev->priv;
    ifd_batch_ref(shard->batch, 1);
    int rc = ifd_queue_push(cd->reps[replica].infeed, shard);
    if (rc)
        ifd_batch_unref(shard->batch);
    if (rc == IFD_ECLOSED && __atomic_load_n(&cd->hosts_ended, __ATOMIC_ACQUIRE))
        return IFD_EEOF; /* another host's input ended: so did this run's */
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
    if (slot->pred) { /* the slot goes back now: its predictions are copied out first */
        const ifd_device_config *cfg = &dev->cfg;
        float *keep = rep->pred_mem + (size_t)cfg->outfeed_depth * (size_t)pred_floats(cfg);
        memcpy(keep, slot->pred, sizeof(float) * (size_t)(slot->rows * cfg->program->predict_cols));
        rec->pred = keep;
    }
    if (slot->outfeed) { /* the outfeed area goes with the record; the slot takes the spare */
        unsigned char **area = &rep->areas[slot - rep->slots];
        unsigned char *filled = *area;
        *area = rep->spare;
        rep->spare = filled;
        rec->outfeed = filled;
    }
    ifd_queue_push(rep->out_free, &slot);
    return IFD_OK;
}

/* ---- the session's thread, and any thread ---------------------------------------------------- */

static int cpu_read_state(ifd_device *dev, int replica, float *params, float *slots,
                          int64_t *opt_step, ifd_error *err)
{
    cpu_dev *cd = dev->priv;
    if (replica < 0 || replica >= cd->replicas)
        return ifd_error_set(err, IFD_EINVAL, "replica: expected 0 to %d, got %d", cd->replicas - 1,
                             replica);
    const cpu_replica *rep = &cd->reps[replica];
    if (params)
        memcpy(params, rep->st.params, sizeof(float) * (size_t)dev->cfg.program->nparam_floats);
    if (slots)
        memcpy(slots, rep->st.slot0, sizeof(float) * (size_t)ifd_replica_slot_floats(&dev->cfg));
    if (opt_step)
        *opt_step = rep->opt_step;
    return IFD_OK;
}

static void cpu_stats(ifd_device *dev, int replica, ifd_device_stats *out)
{
    cpu_dev *cd = dev->priv;
    cpu_replica *rep = &cd->reps[replica];
    ifd_replicas_stats(dev, replica, out);
    out->infeed_len =
        (int64_t)ifd_queue_len(rep->infeed) + __atomic_load_n(&rep->in_left, __ATOMIC_RELAXED);
    out->infeed_cap = (int64_t)ifd_queue_capacity(rep->infeed);
    out->outfeed_len = (int64_t)ifd_queue_len(rep->out_full);
    out->outfeed_cap = (int64_t)ifd_queue_capacity(rep->out_full);
}

static void cpu_abort(ifd_device *dev)
{
    cpu_dev *cd = dev->priv;
    ifd_replicas_abort(&cd->set);
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
    .run_loop = ifd_replicas_run_loop,
    .read_state = cpu_read_state,
    .global_step = ifd_replicas_global_step,
    .stats = cpu_stats,
    .abort = cpu_abort,
};
