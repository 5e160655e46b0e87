#include "core/batch.h"
#include "core/thread.h"
#include "core/log.h"
#include "core/opqueue.h"
#include "device/batch_check.h"
#include "intake/inputs.h"
#include "intake/infeed_thread.h"
#include "intake/shard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SOURCE "infeed"

struct ifd_infeed {
    ifd_infeed_config cfg;
    ifd_opq *opq;
    int replicas;
    int per_step;          /* batches a step takes (ifd_input_batches_per_step) */
    int64_t rows;          /* rows a batch has (ifd_input_batch_rows) */
    ifd_batch **step;      /* the step's batches */
    ifd_shard *shards;     /* the step's shards, one per replica */
    int64_t batches;       /* atomic: taken from the source and fed */
    int64_t dropped;       /* atomic: taken from the source and released unconsumed */
    int waiting_replica;   /* atomic: see ifd_infeed_waiting */
    int64_t waiting_since; /* atomic: when the wait for the source began, 0: not waiting */
    /* the initial sleep: ifd_infeed_stop sets stopping and wakes it */
    ifd_mutex sleep_mu;
    ifd_cond sleep_cv;
    int stopping;
};

int ifd_infeed_mode_inputs(const ifd_program *p, ifd_mode mode, int idx[IFD_MAX_INPUTS])
{
    return ifd_step_inputs(p, mode, idx);
}

/* The seed's initial_infeed_sleep_secs. Returns 0 when the infeed is stopped during it. */
static int initial_sleep(ifd_infeed *f)
{
    if (f->cfg.initial_sleep_secs <= 0.0)
        return 1;
    IFD_LOG_INFO("infeed: sleeping %g s before the first batch", f->cfg.initial_sleep_secs);
    int64_t deadline = ifd_clock_ns() + (int64_t)(f->cfg.initial_sleep_secs * 1e9);
    ifd_mutex_lock(&f->sleep_mu);
    while (!f->stopping && ifd_clock_ns() < deadline)
        ifd_cond_wait_until(&f->sleep_cv, &f->sleep_mu, deadline);
    int go = !f->stopping;
    ifd_mutex_unlock(&f->sleep_mu);
    return go;
}

/* Takes the batch for slot i of the step from the source: per-core from replica i's stream.
 * Before it blocks, hands the replicas what they have and records what it waits for. */
static int take_batch(ifd_infeed *f, int i, ifd_batch **b, ifd_error *err)
{
    const ifd_batch_source *src = &f->cfg.src;
    int per_core = f->cfg.input_mode == IFD_INPUT_PER_CORE;
    int rc = IFD_ETIMEDOUT;
    if (per_core && src->ops->try_next_for)
        rc = src->ops->try_next_for(src->ctx, i, b, err);
    else if (!per_core && src->ops->try_next)
        rc = src->ops->try_next(src->ctx, b, err);
    if (rc != IFD_ETIMEDOUT)
        return rc;
    ifd_device_infeed_flush(f->cfg.dev);
    __atomic_store_n(&f->waiting_replica, f->per_step > 1 ? i : -1, __ATOMIC_RELAXED);
    __atomic_store_n(&f->waiting_since, ifd_clock_ns(), __ATOMIC_RELEASE);
    rc = per_core ? src->ops->next_for(src->ctx, i, b, err) : src->ops->next(src->ctx, b, err);
    __atomic_store_n(&f->waiting_since, 0, __ATOMIC_RELEASE);
    return rc;
}

/* A batch just taken (with the infeed's reference): checked against the program and the input
 * mode's rows; in predict mode a partial batch is replaced by its padded copy (which holds it). */
static int prepare_batch(ifd_infeed *f, ifd_batch **bp, ifd_error *err)
{
    const ifd_infeed_config *cfg = &f->cfg;
    ifd_batch *b = *bp;
    /* a batch is checked once: by its source (IFD_BATCH_CHECKED), else here */
    int rc = b->flags & IFD_BATCH_CHECKED
                 ? IFD_OK
                 : ifd_program_check_batch(cfg->program, b, f->rows, cfg->mode, err);
    if (rc == IFD_OK && b->rows < f->rows) {
        ifd_batch *padded;
        rc = ifd_infeed_pad_batch(cfg->program, cfg->mode, b, f->rows, &padded, err);
        if (rc == IFD_OK) {
            ifd_batch_unref(b);
            *bp = padded;
        }
    }
    if (rc && cfg->input_mode == IFD_INPUT_PER_HOST)
        ifd_error_prefix(err, "batch %lld from producer '%s'", (long long)b->seq,
                         b->producer ? b->producer : "(in-process)");
    else if (rc)
        ifd_error_prefix(err,
                         "batch %lld from producer '%s' (%s input: batch_size %lld / %d replicas "
                         "= %lld rows a batch)",
                         (long long)b->seq, b->producer ? b->producer : "(in-process)",
                         ifd_input_mode_name(cfg->input_mode), (long long)cfg->batch_size,
                         f->replicas, (long long)f->rows);
    return rc;
}

/* Predict mode: a batch of padding only (no valid rows), for a replica whose input ended while
 * another's still had a batch for the step (per-host-v2, per-core), so the real rows are
 * predicted. */
static int padding_batch(ifd_infeed *f, int replica, ifd_batch **out, ifd_error *err)
{
    int rc = ifd_infeed_stop_batch(f->cfg.program, f->cfg.mode, f->rows, out, err);
    if (rc == IFD_OK) {
        (*out)->flags = IFD_BATCH_PADDED;
        (*out)->replica = replica;
        (*out)->producer = "(padding)";
    }
    return rc;
}

static int enqueue_shards(ifd_infeed *f, ifd_error *err)
{
    int rc = IFD_OK;
    int outfeeds = f->cfg.mode != IFD_MODE_PREDICT && f->cfg.outfeeds_wanted
                       ? f->cfg.outfeeds_wanted(f->cfg.outfeeds_arg)
                       : 0;
    for (int r = 0; r < f->replicas; r++)
        f->shards[r].outfeeds = outfeeds;
    for (int r = 0; r < f->replicas && rc == IFD_OK; r++)
        if ((rc = ifd_device_infeed_enqueue(f->cfg.dev, r, &f->shards[r])))
            ifd_error_set(err, rc, "device infeed aborted");
    return rc;
}

/* One step: takes its batches (ifd_input_batches_per_step), checks them, shards them per the
 * input mode and pushes one shard to every replica. The infeed holds a reference on each batch
 * while it works, so a batch is released only when the last replica is done with it and the
 * infeed has let go. IFD_EEOF: the input ended before the step had its batches (the batches it
 * had taken are released unconsumed: the replicas that would have got them could not complete the
 * step without the others; predict mode fills the missing ones with padding instead, unless the
 * step got no batch at all). */
static int feed_step(ifd_infeed *f, ifd_error *err)
{
    int taken = 0, real = 0, rc = IFD_OK;
    for (int i = 0; i < f->per_step; i++) {
        ifd_batch *b = NULL;
        rc = take_batch(f, i, &b, err);
        if (rc == IFD_EEOF && f->cfg.mode == IFD_MODE_PREDICT) {
            f->step[taken++] = NULL; /* padding, if another slot has a batch */
            rc = IFD_OK;
            continue;
        }
        if (rc)
            break;
        ifd_batch_ref(b, 1);
        rc = prepare_batch(f, &b, err);
        f->step[taken++] = b;
        real++;
        if (rc)
            break;
    }
    if (rc == IFD_OK && real == 0)
        rc = IFD_EEOF;
    for (int i = 0; i < taken && rc == IFD_OK; i++)
        if (f->step[i] == NULL)
            rc = padding_batch(f, i, &f->step[i], err);
    if (rc == IFD_OK)
        rc = ifd_shard_step(f->cfg.input_mode, f->step, taken, f->replicas, f->shards, err);
    if (rc == IFD_OK)
        rc = enqueue_shards(f, err);
    if (rc == IFD_EEOF && real > 0)
        __atomic_add_fetch(&f->dropped, real, __ATOMIC_RELAXED);
    if (rc == IFD_EEOF && real > 0)
        IFD_LOG_INFO("infeed: the input ended with %d of a step's %d batches; they are released "
                     "unconsumed",
                     real, f->per_step);
    for (int i = 0; i < taken; i++)
        if (f->step[i])
            ifd_batch_unref(f->step[i]);
    if (rc == IFD_OK)
        __atomic_add_fetch(&f->batches, real, __ATOMIC_RELAXED);
    return rc;
}

/* The end of the input. Predict mode appends the stopping-signal batch first: every replica's
 * loop ends when it dequeues its shard (the seed's _StoppingPredictHook), the batch never
 * reaching a step; per-host-v2 and per-core give every replica the same stop batch (replica 0's
 * signal). Then the rings close: the run ends after the last complete step. */
static int end_of_input(ifd_infeed *f, ifd_error *err)
{
    const ifd_infeed_config *cfg = &f->cfg;
    IFD_LOG_INFO("infeed: the input ended after %lld batches",
                 (long long)__atomic_load_n(&f->batches, __ATOMIC_RELAXED));
    int rc = IFD_OK;
    if (cfg->mode == IFD_MODE_PREDICT) {
        ifd_batch *stop;
        rc = ifd_infeed_stop_batch(cfg->program, cfg->mode, f->rows, &stop, err);
        if (rc == IFD_OK) {
            ifd_input_mode m = f->per_step > 1 ? IFD_INPUT_BROADCAST : cfg->input_mode;
            rc = ifd_shard_step(m, &stop, 1, f->replicas, f->shards, err);
            if (rc == IFD_OK)
                rc = enqueue_shards(f, err);
            ifd_batch_unref(stop);
        }
        ifd_device_infeed_flush(cfg->dev);
    }
    ifd_device_infeed_end(cfg->dev);
    return rc;
}

static void infeed_main(ifd_opq *q, void *arg)
{
    ifd_infeed *f = arg;
    const ifd_infeed_config *cfg = &f->cfg;
    ifd_error err;
    ifd_error_clear(&err);
    int64_t n, loop = 0;
    if (!initial_sleep(f))
        return;
    while (ifd_opq_next(q, &n)) {
        /* predict: one signal, then steps until the stopping signal (_OpSignalOnceQueue) */
        if (cfg->mode == IFD_MODE_PREDICT)
            n = INT64_MAX;
        IFD_LOG_DEBUG("infeed: loop %lld: enqueue %lld steps", (long long)loop, (long long)n);
        for (int64_t i = 0; i < n; i++) {
            int rc = feed_step(f, &err);
            if (rc == IFD_EEOF && (rc = end_of_input(f, &err)) == IFD_OK)
                return;
            if (rc) {
                if (err.code != rc)
                    ifd_error_set(&err, rc, "%s", ifd_strerror(rc));
                ifd_rendezvous_record_error(cfg->rv, SOURCE, &err);
                return;
            }
        }
        ifd_device_infeed_flush(cfg->dev);
        loop++;
    }
}

int ifd_infeed_start(ifd_infeed **out, const ifd_infeed_config *cfg)
{
    *out = NULL;
    ifd_infeed *f = calloc(1, sizeof *f);
    if (f == NULL)
        return IFD_ENOMEM;
    f->cfg = *cfg;
    f->replicas = ifd_device_replicas(cfg->dev);
    f->per_step = ifd_input_batches_per_step(cfg->input_mode, f->replicas);
    f->rows = ifd_input_batch_rows(cfg->input_mode, cfg->batch_size, f->replicas);
    f->waiting_replica = -1;
    int rc = f->per_step < 1 || f->rows < 1 ? IFD_EINVAL : IFD_OK;
    if (rc == IFD_OK) {
        f->shards = calloc((size_t)f->replicas, sizeof *f->shards);
        f->step = calloc((size_t)f->per_step, sizeof *f->step);
        rc = f->shards == NULL || f->step == NULL ? IFD_ENOMEM : IFD_OK;
    }
    ifd_mutex_init(&f->sleep_mu);
    ifd_cond_init(&f->sleep_cv);
    if (rc == IFD_OK)
        rc = ifd_opq_start(&f->opq, "ifd-infeed", infeed_main, f, cfg->mode == IFD_MODE_PREDICT);
    if (rc) {
        ifd_cond_fini(&f->sleep_cv);
        ifd_mutex_fini(&f->sleep_mu);
        free(f->step);
        free(f->shards);
        free(f);
        return rc;
    }
    *out = f;
    return IFD_OK;
}

int ifd_infeed_signal(ifd_infeed *f, int64_t n)
{
    return ifd_opq_signal(f->opq, n);
}

void ifd_infeed_stop(ifd_infeed *f)
{
    if (f) {
        ifd_mutex_lock(&f->sleep_mu);
        f->stopping = 1;
        ifd_cond_broadcast(&f->sleep_cv);
        ifd_mutex_unlock(&f->sleep_mu);
        ifd_opq_join(f->opq);
        ifd_rendezvous_record_done(f->cfg.rv, SOURCE);
    }
}

int64_t ifd_infeed_dropped(ifd_infeed *f)
{
    return f ? __atomic_load_n(&f->dropped, __ATOMIC_RELAXED) : 0;
}

int ifd_infeed_waiting(ifd_infeed *f, int *replica, int64_t *since_ns)
{
    int64_t since = __atomic_load_n(&f->waiting_since, __ATOMIC_ACQUIRE);
    if (replica)
        *replica = since ? __atomic_load_n(&f->waiting_replica, __ATOMIC_RELAXED) : -1;
    if (since_ns)
        *since_ns = since;
    return since != 0;
}

void ifd_infeed_destroy(ifd_infeed *f)
{
    if (f == NULL)
        return;
    ifd_opq_destroy(f->opq);
    free(f->step);
    ifd_cond_fini(&f->sleep_cv);
    ifd_mutex_fini(&f->sleep_mu);
    free(f->shards);
    free(f);
}
