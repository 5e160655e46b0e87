#include "device/replicas.h"

#include <stdio.h>

void ifd_replicas_init(ifd_replicas *set, ifd_device *dev, void *reps, size_t rep_size,
                       const ifd_replica_ops *ops, int64_t spin_ns)
{
    *set = (ifd_replicas){.dev = dev,
                          .ops = ops,
                          .reps = reps,
                          .rep_size = rep_size,
                          .n = dev->cfg.replicas,
                          .spin_ns = spin_ns,
                          .gstep = dev->cfg.initial_step};
    ifd_mutex_init(&set->mu);
    ifd_cond_init(&set->cmd_cv);
    ifd_cond_init(&set->done_cv);
    for (int r = 0; r < set->n; r++) {
        ifd_replica *rep = ifd_replicas_at(set, r);
        rep->index = r;
        rep->set = set;
        snprintf(rep->name, sizeof rep->name, "replica %d", r);
    }
}

void ifd_replicas_fini(ifd_replicas *set)
{
    ifd_replicas_stop(set);
    ifd_cond_fini(&set->done_cv);
    ifd_cond_fini(&set->cmd_cv);
    ifd_mutex_fini(&set->mu);
}

void ifd_replicas_fail(ifd_replicas *set, const char *source, ifd_error *err, int rc)
{
    const ifd_device_config *cfg = &set->dev->cfg;
    if (err->code != rc)
        ifd_error_set(err, rc, "%s", ifd_strerror(rc));
    if (cfg->on_error)
        cfg->on_error(cfg->on_error_arg, source, err);
    set->dev->be->abort(set->dev);
}

void ifd_replicas_publish_step(ifd_replicas *set, int64_t step)
{
    int64_t cur = __atomic_load_n(&set->gstep, __ATOMIC_RELAXED);
    while (step > cur && !__atomic_compare_exchange_n(&set->gstep, &cur, step, 0, __ATOMIC_RELEASE,
                                                      __ATOMIC_RELAXED))
        ;
}

int64_t ifd_replica_mem_floats(const ifd_device_config *cfg)
{
    const ifd_program *p = cfg->program;
    return 4 * p->nparam_floats + p->cls->workspace_floats(p, cfg->max_shard_rows) + 1;
}

void ifd_replica_mem_carve(ifd_replica_state *st, float *mem, int64_t np)
{
    st->params = mem;
    st->grads = mem + np;
    st->slot0 = mem + 2 * np;
    st->slot1 = mem + 3 * np;
    st->workspace = mem + 4 * np;
}

const float *ifd_replica_initial_params(const ifd_device_config *cfg, float *scratch)
{
    if (cfg->init_params)
        return cfg->init_params;
    ifd_program_init_params(cfg->program, scratch, cfg->seed);
    return scratch;
}

int64_t ifd_replica_slot_floats(const ifd_device_config *cfg)
{
    return ifd_optimizer_slots(cfg->optimizer.kind) * cfg->program->nparam_floats;
}

int64_t ifd_replicas_global_step(ifd_device *dev)
{
    return __atomic_load_n(&((ifd_replicas *)dev->priv)->gstep, __ATOMIC_ACQUIRE);
}

void ifd_replicas_stats(ifd_device *dev, int r, ifd_device_stats *out)
{
    const ifd_device_stats *s = &ifd_replicas_at(dev->priv, r)->stats;
    out->steps = __atomic_load_n(&s->steps, __ATOMIC_RELAXED);
    out->loop_ns = __atomic_load_n(&s->loop_ns, __ATOMIC_RELAXED);
    out->infeed_wait_ns = __atomic_load_n(&s->infeed_wait_ns, __ATOMIC_RELAXED);
    out->outfeed_wait_ns = __atomic_load_n(&s->outfeed_wait_ns, __ATOMIC_RELAXED);
    out->loop_run_ns = __atomic_load_n(&s->loop_run_ns, __ATOMIC_RELAXED);
    out->loop_first_ns = __atomic_load_n(&s->loop_first_ns, __ATOMIC_RELAXED);
    out->in_loop = __atomic_load_n(&ifd_replicas_at(dev->priv, r)->in_loop, __ATOMIC_RELAXED);
    out->infeed_len = out->infeed_cap = out->outfeed_len = out->outfeed_cap = 0;
}

/* ---- the replica thread ---------------------------------------------------------------------- */

typedef struct loop_wait {
    ifd_replicas *set;
    int64_t seen;
} loop_wait;

static int next_loop_ready(void *arg)
{
    loop_wait *w = arg;
    return __atomic_load_n(&w->set->generation, __ATOMIC_ACQUIRE) != w->seen ||
           __atomic_load_n(&w->set->quit, __ATOMIC_ACQUIRE);
}

/* Waits for the next loop command: its n, or -1 to quit. */
static int64_t next_loop(ifd_replicas *set, int64_t *seen)
{
    if (set->spin_ns > 0) {
        /* The next loop usually follows within microseconds: spin before sleeping. */
        loop_wait w = {set, *seen};
        ifd_spin_until(next_loop_ready, &w, set->spin_ns);
    }
    ifd_mutex_lock(&set->mu);
    while (!set->quit && set->generation == *seen)
        ifd_cond_wait(&set->cmd_cv, &set->mu);
    int64_t n = -1;
    if (!set->quit) {
        *seen = set->generation;
        n = set->loop_n;
    }
    ifd_mutex_unlock(&set->mu);
    return n;
}

/* The replica's loop clock (ifd_device_stats.loop_run_ns, loop_first_ns); its thread only. */
static void loop_clock_add(ifd_replica *rep, int64_t run_ns, int64_t first_ns)
{
    ifd_device_stats *s = &rep->stats;
    __atomic_store_n(&s->loop_run_ns, s->loop_run_ns + run_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&s->loop_first_ns, s->loop_first_ns + first_ns, __ATOMIC_RELAXED);
}

static void *replica_main(void *arg)
{
    ifd_replica *rep = arg;
    ifd_replicas *set = rep->set;
    const ifd_replica_ops *ops = set->ops;
    ifd_error init_err;
    ifd_error_clear(&init_err);
    int init_rc = ops->thread_init ? ops->thread_init(rep, &init_err) : IFD_OK;
    int64_t seen = 0, n;
    while ((n = next_loop(set, &seen)) >= 0) {
        __atomic_store_n(&rep->in_loop, 1, __ATOMIC_RELAXED);
        int64_t start = ifd_clock_ns(), done = 0, first_ns = 0;
        int rc = init_rc;
        ifd_error_clear(&rep->err);
        if (rc)
            rep->err = init_err;
        if (ops->loop_begin)
            ops->loop_begin(rep, start);
        while (rc == IFD_OK && done < n) {
            rc = ops->step(rep, done);
            if (rc == IFD_OK && done++ == 0)
                first_ns = ifd_clock_ns() - start;
        }
        rc = ops->loop_end(rep, rc, done);
        loop_clock_add(rep, ifd_clock_ns() - start, first_ns);
        if (rc == IFD_EEOF)
            ops->input_ended(rep);
        else if (rc && !ifd_error_is_secondary(rc))
            ifd_replicas_fail(set, rep->name, &rep->err, rc);
        ifd_mutex_lock(&set->mu);
        rep->done_steps = done;
        rep->status = rc;
        __atomic_store_n(&rep->in_loop, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&set->ndone, set->ndone + 1, __ATOMIC_RELEASE);
        ifd_cond_broadcast(&set->done_cv);
        ifd_mutex_unlock(&set->mu);
    }
    return NULL;
}

int ifd_replicas_start(ifd_replicas *set, int r, const char *thread_name)
{
    ifd_replica *rep = ifd_replicas_at(set, r);
    return ifd_thread_start(&rep->thread, thread_name, replica_main, rep);
}

void ifd_replicas_stop(ifd_replicas *set)
{
    ifd_mutex_lock(&set->mu);
    __atomic_store_n(&set->quit, 1, __ATOMIC_RELEASE);
    ifd_cond_broadcast(&set->cmd_cv);
    ifd_mutex_unlock(&set->mu);
    for (int r = 0; r < set->n; r++)
        ifd_thread_join(&ifd_replicas_at(set, r)->thread);
}

/* ---- the session's thread -------------------------------------------------------------------- */

int ifd_replicas_run_loop(ifd_device *dev, int64_t n, int64_t *steps_done, ifd_error *err)
{
    ifd_replicas *set = dev->priv;
    *steps_done = 0;
    if (ifd_replicas_aborted(set))
        return ifd_error_set(err, IFD_ESTOPPED, "device aborted");
    ifd_mutex_lock(&set->mu);
    set->loop_n = n;
    __atomic_store_n(&set->ndone, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&set->generation, set->generation + 1, __ATOMIC_RELEASE);
    ifd_cond_broadcast(&set->cmd_cv);
    while (set->ndone < set->n)
        ifd_cond_wait(&set->done_cv, &set->mu);
    int64_t done = n;
    int rc = IFD_OK;
    for (int r = 0; r < set->n; r++) {
        ifd_replica *rep = ifd_replicas_at(set, r);
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
    ifd_mutex_unlock(&set->mu);
    *steps_done = done;
    if (rc == IFD_EEOF)
        ifd_error_set(err, IFD_EEOF, "the input ended after %lld of %lld steps", (long long)done,
                      (long long)n);
    return rc;
}

void ifd_replica_step_error(ifd_replica *rep, ifd_mode mode, int64_t global_step, int64_t run_step)
{
    if (mode == IFD_MODE_TRAIN)
        ifd_error_prefix(&rep->err, "step %lld", (long long)(global_step + 1));
    else
        ifd_error_prefix(&rep->err, "%s step %lld", ifd_mode_name(mode), (long long)(run_step + 1));
}
