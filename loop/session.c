/*
 * The session: the seed's MonitoredSession with TPUInfeedOutfeedSessionHook. It owns the device,
 * the two controller threads, the hooks, the error rendezvous and the global step. This file
 * creates, configures, queries and destroys it; loop/session_run.c runs it.
 */
#include "checkpoint/object.h"
#include "core/log.h"
#include <infeed/hosts.h>
#include "loop/session_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_device_error(void *arg, const char *source, const ifd_error *err)
{
    ifd_session *s = arg;
    ifd_rendezvous_record_error(s->rv, source, err);
}

static void stop_device(void *arg)
{
    ifd_device_abort(arg);
}

static void stop_source(void *arg)
{
    ifd_session *s = arg;
    s->src.ops->abort(s->src.ctx);
}

/* The run context's snapshot: replica 0's state, between loops. */
static int session_snapshot(void *arg, ifd_checkpoint **out, ifd_error *err)
{
    ifd_session *s = arg;
    ifd_checkpoint *c;
    int rc = ifd_checkpoint_create(&c, &s->cfg, ifd_device_global_step(s->dev), 0, NULL, NULL, err);
    if (rc)
        return rc;
    rc = ifd_device_read_state(s->dev, 0, c->params, c->slots, &c->opt_step, err);
    if (rc) {
        ifd_checkpoint_free(c);
        return rc;
    }
    *out = c;
    return IFD_OK;
}

static int host_count(const ifd_config *cfg)
{
    return cfg->hosts ? cfg->hosts->size : 1;
}

/* cfg->restore fits cfg: the program, its shapes, the optimizer, the starting step. */
static int check_restore(const ifd_config *cfg, ifd_error *err)
{
    const ifd_checkpoint *ck = cfg->restore;
    int rc = ifd_checkpoint_check(ck, cfg, err);
    if (rc)
        return rc;
    if (cfg->initial_global_step != 0 && cfg->initial_global_step != ck->global_step)
        return ifd_error_set(err, IFD_EINVAL,
                             "initial_global_step: %lld, but the checkpoint starts the run at "
                             "global step %lld (leave it unset)",
                             (long long)cfg->initial_global_step, (long long)ck->global_step);
    return IFD_OK;
}

/* What create checks before it allocates: the config, the source, the checkpoint to start from. */
static int check_create(const ifd_config *cfg, ifd_batch_source src, ifd_error *err)
{
    int rc = ifd_config_validate(cfg, err);
    if (rc)
        return rc;
    if (src.ops == NULL || src.ops->next == NULL || src.ops->abort == NULL)
        return ifd_error_set(err, IFD_EINVAL,
                             "batch source: expected next and abort functions (abort is how an "
                             "error stops a blocked next), got %s",
                             src.ops == NULL ? "no ops"
                             : src.ops->next ? "no abort"
                                             : "no next");
    if (cfg->input_mode == IFD_INPUT_PER_CORE && src.ops->next_for == NULL)
        return ifd_error_set(
            err, IFD_EINVAL,
            "batch source: per-core input takes each replica's batches with "
            "next_for, and this source has none (ifd_batch_queue_create_per_replica "
            "makes a queue that has)");
    return cfg->restore ? check_restore(cfg, err) : IFD_OK;
}

/* The device, from s->cfg and the program (and ck's state when starting from one); an abort of
 * the rendezvous then aborts the device and the source. */
static int open_device(ifd_session *s, const ifd_checkpoint *ck, ifd_error *err)
{
    const ifd_config *cfg = &s->cfg;
    if (cfg->mode == IFD_MODE_PREDICT && s->program.cls->predict_step == NULL)
        return ifd_error_set(err, IFD_EINVAL,
                             "mode: predict needs a program with a predict step; '%s' has none",
                             cfg->program);
    int train = cfg->mode == IFD_MODE_TRAIN;
    ifd_device_config dc = {
        .replicas = cfg->replicas,
        .program = &s->program,
        .mode = cfg->mode,
        .max_shard_rows = cfg->batch_size,
        .optimizer = cfg->optimizer,
        .loss_scale = cfg->loss_reduction == IFD_REDUCE_MEAN
                          ? 1.0f / ((float)cfg->replicas * (float)host_count(cfg))
                          : 1.0f,
        .seed = cfg->seed,
        .initial_step = cfg->initial_global_step,
        .init_params = ck ? ck->params : NULL,
        .init_slots = ck && train && ck->nslots ? ck->slots : NULL,
        .init_opt_step = ck && train ? ck->opt_step : 0,
        .infeed_depth = cfg->infeed_depth,
        .outfeed_depth = cfg->outfeed_depth,
        .hosts = ifd_hosts_many(cfg->hosts) ? cfg->hosts : NULL,
        .blas_kernel = cfg->blas_kernel,
        .replica_threads = cfg->replica_threads,
        .cuda_graphs = cfg->cuda_graphs,
        .on_error = on_device_error,
        .on_error_arg = s,
    };
    int rc = ifd_device_create(&s->dev, cfg->backend, &dc, err);
    if (rc)
        return rc;
    ifd_rendezvous_on_stop(s->rv, stop_device, s->dev);
    ifd_rendezvous_on_stop(s->rv, stop_source, s);
    return IFD_OK;
}

/* The hook the mode installs itself: train's stop at step, eval's iterations (predict: none). */
static int add_mode_hook(ifd_session *s, ifd_error *err)
{
    const ifd_config *cfg = &s->cfg;
    ifd_hook h;
    int rc;
    if (cfg->mode == IFD_MODE_TRAIN) {
        /* with automatic lengths the hook gives the distance to the last step, the most the
         * next loop may run */
        int64_t ipl = cfg->loop_kind == IFD_LOOP_STEPS ? cfg->iterations_per_loop : INT64_MAX;
        rc = ifd_hook_stop_at_step(&h, ipl, cfg->steps, cfg->last_step, err);
    } else if (cfg->mode == IFD_MODE_EVAL) {
        rc = ifd_hook_eval_iterations(&h, cfg->steps, err);
    } else {
        return IFD_OK;
    }
    if (rc == IFD_OK)
        s->hooks[s->nhooks++] = h;
    return rc;
}

/* Loop lengths the session picks itself (loop_kind auto or seconds; never in eval): the tuner
 * and each replica's loop clock. */
static int init_tuner(ifd_session *s, ifd_error *err)
{
    const ifd_config *cfg = &s->cfg;
    s->tuned = cfg->loop_kind != IFD_LOOP_STEPS && cfg->mode != IFD_MODE_EVAL;
    if (!s->tuned)
        return IFD_OK;
    ifd_loop_tuner_init(&s->tuner, cfg->loop_kind, cfg->loop_secs, cfg->max_loop_seconds);
    s->clock_run = calloc((size_t)cfg->replicas, sizeof *s->clock_run);
    s->clock_first = calloc((size_t)cfg->replicas, sizeof *s->clock_first);
    if (s->clock_run == NULL || s->clock_first == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "session: the loop clocks of %d replicas",
                             cfg->replicas);
    return IFD_OK;
}

int ifd_session_create(ifd_session **out, const ifd_config *cfg, ifd_batch_source src,
                       ifd_error *err)
{
    *out = NULL;
    int rc = check_create(cfg, src, err);
    if (rc)
        return rc;
    const ifd_checkpoint *ck = cfg->restore;
    ifd_session *s = calloc(1, sizeof *s);
    if (s == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "session");
    s->cfg = *cfg;
    s->cfg.restore = NULL; /* borrowed for create only */
    if (ck)
        s->cfg.initial_global_step = ck->global_step;
    s->src = src;
    s->stop_host = -1;
    rc = ifd_program_init(&s->program, cfg->program, &cfg->settings, err);
    if (rc == IFD_OK)
        rc = ifd_outfeed_host_calls_check(&s->program, cfg->mode, cfg->host_calls, cfg->nhost_calls,
                                          err);
    if (rc)
        goto fail_program;
    rc = ifd_rendezvous_create(&s->rv);
    if (rc) {
        ifd_error_set(err, rc, "session: rendezvous");
        goto fail_program;
    }
    ifd_stop_relay_init(&s->relay, cfg->hosts, s->rv, &s->stop_host);
    rc = open_device(s, ck, err);
    if (rc)
        goto fail_device;
    rc = add_mode_hook(s, err);
    if (rc)
        goto fail_hook;
    rc = init_tuner(s, err);
    if (rc)
        goto fail_clocks;
    if (ifd_hosts_many(cfg->hosts)) {
        s->writer.hosts = cfg->hosts->size;
        s->writer.host = cfg->hosts->rank;
    }
    s->ctx.global_step = s->cfg.initial_global_step;
    s->ctx.snapshot = session_snapshot;
    s->ctx.snapshot_arg = s;
    if (ck)
        IFD_LOG_INFO("session: starting from a checkpoint at global step %lld",
                     (long long)ck->global_step);
    *out = s;
    return IFD_OK;

fail_clocks:
    free(s->clock_run);
    free(s->clock_first);
fail_hook:
    for (int i = 0; i < s->nhooks; i++)
        if (s->hooks[i].destroy)
            s->hooks[i].destroy(s->hooks[i].arg);
    ifd_device_destroy(s->dev);
fail_device:
    ifd_stop_relay_fini(&s->relay);
    ifd_rendezvous_destroy(s->rv);
fail_program:
    ifd_program_free(&s->program);
    free(s);
    return rc;
}

int ifd_session_add_hook(ifd_session *s, const ifd_hook *hook)
{
    if (s->ran || hook == NULL)
        return IFD_EINVAL;
    if (s->nhooks == MAX_HOOKS)
        return IFD_ENOMEM;
    s->hooks[s->nhooks++] = *hook;
    return IFD_OK;
}

int ifd_session_add_sink(ifd_session *s, ifd_sink *sink)
{
    if (s->ran)
        return IFD_EINVAL;
    return ifd_summary_writer_add(&s->writer, sink);
}

int ifd_session_add_prediction_sink(ifd_session *s, const ifd_prediction_sink *sink)
{
    if (s->ran || sink == NULL || sink->write == NULL)
        return IFD_EINVAL;
    if (s->npred_sinks == IFD_MAX_PREDICTION_SINKS)
        return IFD_ENOMEM;
    s->pred_sinks[s->npred_sinks++] = *sink;
    return IFD_OK;
}

int ifd_session_add_tensor_sink(ifd_session *s, const ifd_tensor_sink *sink)
{
    if (s->ran || sink == NULL || sink->write == NULL || s->ntensor_sinks == IFD_MAX_TENSOR_SINKS)
        return IFD_EINVAL;
    s->tensor_sinks[s->ntensor_sinks++] = *sink;
    return IFD_OK;
}

void ifd_session_request_stop(ifd_session *s)
{
    int none = -1;
    int me = ifd_hosts_many(s->cfg.hosts) ? s->cfg.hosts->rank : 0;
    if (__atomic_compare_exchange_n(&s->stop_host, &none, me, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        ifd_stop_relay_poke(&s->relay);
}

int ifd_session_stop_requested(ifd_session *s, int *host)
{
    int h = ifd_session_stop_host(s);
    if (host)
        *host = h;
    return h >= 0;
}

void ifd_session_abort(ifd_session *s, const char *why)
{
    ifd_rendezvous_error(s->rv, "abort", IFD_ECANCELED, "%s", why ? why : "aborted");
}

int ifd_session_set_watchdog_context(ifd_session *s, ifd_watchdog_context_fn fn, void *arg)
{
    if (s->ran)
        return IFD_EINVAL;
    s->watchdog_context = fn;
    s->watchdog_context_arg = arg;
    return IFD_OK;
}

int ifd_session_register_host_memory(ifd_session *s, void *p, size_t len, ifd_error *err)
{
    return ifd_device_host_register(s->dev, p, len, err);
}

void ifd_session_unregister_host_memory(ifd_session *s, void *p)
{
    ifd_device_host_unregister(s->dev, p);
}

int ifd_session_ring_depths(ifd_session *s, int replica, ifd_ring_depths *out)
{
    if (replica < 0 || replica >= s->cfg.replicas)
        return IFD_EINVAL;
    ifd_device_stats st;
    ifd_device_stats_get(s->dev, replica, &st);
    *out = (ifd_ring_depths){.infeed = st.infeed_len,
                             .infeed_capacity = st.infeed_cap,
                             .outfeed = st.outfeed_len,
                             .outfeed_capacity = st.outfeed_cap};
    return IFD_OK;
}

int64_t ifd_session_loop_index(ifd_session *s)
{
    return __atomic_load_n(&s->ctx.loop_index, __ATOMIC_RELAXED);
}

int ifd_session_infeed_waiting(ifd_session *s, int *replica, int64_t *since_ns)
{
    ifd_infeed *f = __atomic_load_n(&s->infeed, __ATOMIC_ACQUIRE);
    return f ? ifd_infeed_waiting(f, replica, since_ns) : 0;
}

int64_t ifd_session_global_step(ifd_session *s)
{
    return ifd_device_global_step(s->dev);
}

ifd_end_reason ifd_session_end_reason(ifd_session *s)
{
    return s->reason;
}

const ifd_program *ifd_session_program(ifd_session *s)
{
    return &s->program;
}

int ifd_session_read_params(ifd_session *s, int replica, float *out)
{
    return ifd_device_read_params(s->dev, replica, out, NULL);
}

void ifd_session_destroy(ifd_session *s)
{
    if (s == NULL)
        return;
    ifd_infeed_destroy(s->infeed);
    ifd_outfeed_destroy(s->outfeed);
    ifd_device_destroy(s->dev);
    for (int i = 0; i < s->nhooks; i++)
        if (s->hooks[i].destroy)
            s->hooks[i].destroy(s->hooks[i].arg);
    ifd_stop_relay_fini(&s->relay);
    ifd_rendezvous_destroy(s->rv);
    free(s->clock_run);
    free(s->clock_first);
    ifd_program_free(&s->program);
    free(s);
}
