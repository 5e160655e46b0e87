/*
 * The session: the seed's MonitoredSession with TPUInfeedOutfeedSessionHook. It owns the device,
 * the two controller threads, the hooks, the error rendezvous and the global step.
 */
#include "core/log.h"
#include "core/rendezvous.h"
#include "core/thread.h"
#include "device/device.h"
#include "hooks/run_context.h"
#include "infeed/controller.h"
#include "checkpoint/object.h"
#include "loop/loop_tuner.h"
#include "loop/stop_relay.h"
#include "loop/watchdog.h"
#include "infeed/hosts.h"
#include "outfeed/controller.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HOOKS 16

struct ifd_session {
    ifd_config cfg;
    ifd_program program;
    ifd_batch_source src;
    ifd_device *dev;
    ifd_rendezvous *rv;
    ifd_infeed *infeed;
    ifd_outfeed *outfeed;
    ifd_summary_writer writer;
    ifd_hook hooks[MAX_HOOKS];
    int nhooks;
    ifd_prediction_sink pred_sinks[IFD_MAX_PREDICTION_SINKS];
    int npred_sinks;
    ifd_run_context ctx;
    int stop_host; /* atomic: -1, or the host whose stop was asked (this one's rank: 0 alone) */
    ifd_stop_relay relay;
    int ended_by_eof; /* the last loop ended because the input ended (or was closed) */
    /* Loop lengths chosen by the session (cfg.loop_kind auto or seconds; not in eval, which runs
     * one loop): the tuner, and each replica's loop clock at the last loop's end. */
    int tuned;
    ifd_loop_tuner tuner;
    int64_t *clock_run, *clock_first;
    int64_t last_end_ns; /* when the last loop returned; 0 before the first */
    int ran;
    ifd_end_reason reason;
    char message[256];
    ifd_watchdog_context_fn watchdog_context;
    void *watchdog_context_arg;
};

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

int ifd_session_create(ifd_session **out, const ifd_config *cfg, ifd_batch_source src,
                       ifd_error *err)
{
    *out = NULL;
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
    const ifd_checkpoint *ck = cfg->restore;
    if (ck && (rc = check_restore(cfg, err)) != IFD_OK)
        return rc;
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
    if (rc)
        goto fail_program;
    rc = ifd_rendezvous_create(&s->rv);
    if (rc) {
        ifd_error_set(err, rc, "session: rendezvous");
        goto fail_program;
    }
    ifd_stop_relay_init(&s->relay, cfg->hosts, s->rv, &s->stop_host);
    if (cfg->mode == IFD_MODE_PREDICT && s->program.cls->predict_step == NULL) {
        rc = ifd_error_set(err, IFD_EINVAL,
                           "mode: predict needs a program with a predict step; '%s' has none",
                           cfg->program);
        goto fail_device;
    }
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
        .initial_step = s->cfg.initial_global_step,
        .init_params = ck ? ck->params : NULL,
        .init_slots = ck && cfg->mode == IFD_MODE_TRAIN && ck->nslots ? ck->slots : NULL,
        .init_opt_step = ck && cfg->mode == IFD_MODE_TRAIN ? ck->opt_step : 0,
        .infeed_depth = cfg->infeed_depth,
        .outfeed_depth = cfg->outfeed_depth,
        .hosts = ifd_hosts_many(cfg->hosts) ? cfg->hosts : NULL,
        .blas_kernel = cfg->blas_kernel,
        .on_error = on_device_error,
        .on_error_arg = s,
    };
    rc = ifd_device_create(&s->dev, cfg->backend, &dc, err);
    if (rc)
        goto fail_device;
    ifd_rendezvous_on_stop(s->rv, stop_device, s->dev);
    ifd_rendezvous_on_stop(s->rv, stop_source, s);
    if (cfg->mode == IFD_MODE_TRAIN) {
        ifd_hook h;
        /* with automatic lengths the hook gives the distance to the last step, the most the
         * next loop may run */
        int64_t ipl = cfg->loop_kind == IFD_LOOP_STEPS ? cfg->iterations_per_loop : INT64_MAX;
        rc = ifd_hook_stop_at_step(&h, ipl, cfg->num_steps, cfg->last_step, err);
        if (rc)
            goto fail_hook;
        s->hooks[s->nhooks++] = h;
    } else if (cfg->mode == IFD_MODE_EVAL) {
        ifd_hook h;
        rc = ifd_hook_eval_iterations(&h, cfg->num_steps, err);
        if (rc)
            goto fail_hook;
        s->hooks[s->nhooks++] = h;
    }
    s->tuned = cfg->loop_kind != IFD_LOOP_STEPS && cfg->mode != IFD_MODE_EVAL;
    if (s->tuned) {
        ifd_loop_tuner_init(&s->tuner, cfg->loop_kind, cfg->loop_secs, cfg->max_loop_secs);
        s->clock_run = calloc((size_t)cfg->replicas, sizeof *s->clock_run);
        s->clock_first = calloc((size_t)cfg->replicas, sizeof *s->clock_first);
        if (s->clock_run == NULL || s->clock_first == NULL) {
            rc = ifd_error_set(err, IFD_ENOMEM, "session: the loop clocks of %d replicas",
                               cfg->replicas);
            goto fail_clocks;
        }
    }
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

enum { CB_BEGIN, CB_AFTER_CREATE, CB_BEFORE_RUN, CB_AFTER_RUN, CB_END };

/* Runs one callback of every hook, in order. The first error goes to the rendezvous. */
static int call_hooks(ifd_session *s, int which)
{
    static const char *const names[] = {"begin", "after_create_session", "before_run", "after_run",
                                        "end"};
    for (int i = 0; i < s->nhooks; i++) {
        const ifd_hook *h = &s->hooks[i];
        int (*fn)(void *, ifd_run_context *, ifd_error *) = which == CB_BEGIN ? h->begin
                                                            : which == CB_AFTER_CREATE
                                                                ? h->after_create_session
                                                            : which == CB_BEFORE_RUN ? h->before_run
                                                            : which == CB_AFTER_RUN  ? h->after_run
                                                                                     : h->end;
        if (fn == NULL)
            continue;
        ifd_error e;
        ifd_error_clear(&e);
        int rc = fn(h->arg, &s->ctx, &e);
        if (rc) {
            char source[64];
            snprintf(source, sizeof source, "hook %s", h->name ? h->name : "(unnamed)");
            if (e.code != rc)
                ifd_error_set(&e, rc, "%s failed", names[which]);
            ifd_rendezvous_record_error(s->rv, source, &e);
            return rc;
        }
    }
    return IFD_OK;
}

/* Steps the run completed (eval and predict leave the global step as it was). */
static int64_t steps_run(ifd_session *s)
{
    ifd_device_stats st;
    ifd_device_stats_get(s->dev, 0, &st);
    return st.steps;
}

/* The last line of a run. */
static void emit_end(ifd_session *s, int code, const ifd_error *cause)
{
    json_t *j = json_object();
    json_object_set_new(j, "event", json_string("end"));
    json_object_set_new(j, "mode", json_string(ifd_mode_name(s->cfg.mode)));
    json_object_set_new(j, "global_step", json_integer(s->ctx.global_step));
    json_object_set_new(j, "status", json_string(code ? "error" : "ok"));
    json_object_set_new(j, "reason", json_string(ifd_end_reason_name(s->reason)));
    if (code) {
        json_object_set_new(j, "error", json_string(ifd_error_text(cause)));
        json_object_set_new(j, "code", json_string(ifd_errname(code)));
    } else if (s->message[0]) {
        json_object_set_new(j, "message", json_string(s->message));
    }
    json_object_set_new(j, "steps", json_integer(steps_run(s)));
    if (s->cfg.mode != IFD_MODE_PREDICT)
        json_object_set_new(j, "skipped_steps", json_integer(ifd_outfeed_skipped(s->outfeed)));
    json_object_set_new(j, "time", json_real(ifd_wall_seconds()));
    ifd_error e;
    if (ifd_summary_emit(&s->writer, j, &e) || ifd_summary_flush(&s->writer, &e))
        IFD_LOG_ERROR("cannot write the end summary: %s", ifd_error_text(&e));
}

static int rendezvous_stopping(void *arg)
{
    return ifd_rendezvous_stopping(arg);
}

/*
 * Several hosts, before each loop, one small collective on the LOOP channel (the MIN of two
 * values): the loop's length (the hooks give every host the same, from the same global step; the
 * minimum is taken all the same) and whether any host was asked to stop (a signal, the control
 * socket), sent as -(rank + 1) so that the minimum names the highest host that asked (0: none):
 * then every host stops here, at the same loop boundary. Non-zero: the run ends (s->reason and
 * s->message set, or the error recorded).
 */
static int hosts_agree(ifd_session *s, int64_t *n)
{
    const ifd_hosts *h = s->cfg.hosts;
    int asked = __atomic_load_n(&s->stop_host, __ATOMIC_ACQUIRE);
    int64_t v[2] = {*n, asked >= 0 ? -(int64_t)asked - 1 : 0};
    ifd_error e;
    ifd_error_clear(&e);
    int rc = h->ops->allreduce_i64(h->ctx, IFD_HOSTS_LOOP, v, 2, IFD_HOSTS_MIN, rendezvous_stopping,
                                   s->rv, &e);
    if (rc) {
        if (rc != IFD_ESTOPPED)
            ifd_rendezvous_record_error(s->rv, "hosts", &e);
        return rc;
    }
    if (v[1] < 0) {
        s->reason = IFD_END_STOPPED;
        snprintf(s->message, sizeof s->message,
                 "stop requested on host %lld; every host stopped at global step %lld",
                 (long long)(-v[1] - 1), (long long)s->ctx.global_step);
        return 1;
    }
    *n = v[0];
    return IFD_OK;
}

/* The host whose stop was asked (this host's rank, or another's that the relay brought), or -1. */
static int stop_asked(ifd_session *s)
{
    return __atomic_load_n(&s->stop_host, __ATOMIC_ACQUIRE);
}

/* Whether the hosts agree before each loop: train and eval. Predict runs per host: each host
 * ends on its own stopping signal, after as many loops as its own input takes, so a stop request
 * there stops its own host only (docs/multihost.md). */
static int agree_with_hosts(const ifd_session *s)
{
    return ifd_hosts_many(s->cfg.hosts) && s->cfg.mode != IFD_MODE_PREDICT;
}

/* The next loop's length, before the hosts agree on it: the hooks' (stop at step: the distance to
 * the last step; eval: its steps), else iterations_per_loop; with automatic lengths the tuner's,
 * which the hooks' length and the step a hook wants a loop to end by cap. */
static int64_t next_length(ifd_session *s)
{
    const ifd_run_context *ctx = &s->ctx;
    if (!s->tuned)
        return ctx->next_loop_length > 0 ? ctx->next_loop_length : s->cfg.iterations_per_loop;
    int64_t n = ifd_loop_tuner_next(&s->tuner);
    if (ctx->next_loop_length > 0 && ctx->next_loop_length < n)
        n = ctx->next_loop_length;
    if (ctx->next_loop_end > ctx->global_step && ctx->next_loop_end - ctx->global_step < n)
        n = ctx->next_loop_end - ctx->global_step;
    return n;
}

/* A loop of n steps ran: its sample for the tuner, from the replica whose loop took longest (its
 * loop and its first step) and the time since the last loop ended. */
static void observe_loop(ifd_session *s, int64_t n)
{
    int64_t now = ifd_clock_ns(), first = 0, longest = -1;
    for (int r = 0; r < s->cfg.replicas; r++) {
        ifd_device_stats st;
        ifd_device_stats_get(s->dev, r, &st);
        int64_t run = st.loop_run_ns - s->clock_run[r];
        if (run > longest) {
            longest = run;
            first = st.loop_first_ns - s->clock_first[r];
        }
        s->clock_run[r] = st.loop_run_ns;
        s->clock_first[r] = st.loop_first_ns;
    }
    ifd_loop_tuner_observe(&s->tuner, n, longest, first, s->last_end_ns ? now - s->last_end_ns : 0);
    s->last_end_ns = now;
    int64_t next = ifd_loop_tuner_next(&s->tuner);
    if (next != n)
        IFD_LOG_DEBUG("loop length: a step %.2f us, a loop boundary %.1f us: %lld steps next",
                      ifd_loop_tuner_step_ns(&s->tuner) * 1e-3,
                      ifd_loop_tuner_boundary_ns(&s->tuner) * 1e-3, (long long)next);
}

/* Runs device loops until a hook, a stop request, the input or an error ends the run. */
static void run_loops(ifd_session *s)
{
    ifd_run_context *ctx = &s->ctx;
    for (;;) {
        if (ctx->stop_requested) {
            if (strcmp(ctx->stop_reason, "last_step") == 0) {
                s->reason = IFD_END_LAST_STEP;
            } else {
                s->reason = IFD_END_STOPPED;
                snprintf(s->message, sizeof s->message, "%s", ctx->stop_reason);
            }
            return;
        }
        if (!agree_with_hosts(s) && stop_asked(s) >= 0) {
            s->reason = IFD_END_STOPPED;
            snprintf(s->message, sizeof s->message, "stop requested at global step %lld",
                     (long long)ctx->global_step);
            return;
        }
        if (ifd_rendezvous_stopping(s->rv))
            return;
        int64_t n = next_length(s);
        ctx->next_loop_length = 0;
        ctx->next_loop_end = 0;
        if (agree_with_hosts(s) && hosts_agree(s, &n))
            return;
        ctx->loop_length = n;
        IFD_LOG_DEBUG("loop %lld: %lld steps from global step %lld", (long long)ctx->loop_index,
                      (long long)n, (long long)ctx->global_step);
        /* before_run: signal both controllers, then the hooks (the seed's infeed/outfeed hook
         * runs first). */
        int rc = ifd_infeed_signal(s->infeed, n);
        if (rc == IFD_OK)
            rc = ifd_outfeed_signal(s->outfeed, n);
        if (rc) {
            ifd_rendezvous_error(s->rv, "session", rc, "cannot signal the controllers");
            return;
        }
        if (call_hooks(s, CB_BEFORE_RUN))
            return;
        ifd_error e;
        ifd_error_clear(&e);
        int64_t done = 0;
        rc = ifd_device_run_loop(s->dev, n, &done, &e);
        ctx->global_step = ifd_device_global_step(s->dev);
        if (s->tuned && rc == IFD_OK)
            observe_loop(s, n);
        s->ended_by_eof = rc == IFD_EEOF;
        if (rc == IFD_EEOF && stop_asked(s) >= 0) {
            s->reason = IFD_END_STOPPED;
            if (ifd_hosts_many(s->cfg.hosts))
                snprintf(s->message, sizeof s->message,
                         "stop requested on host %d; the input was closed, and every host stopped "
                         "after global step %lld",
                         stop_asked(s), (long long)ctx->global_step);
            else
                snprintf(s->message, sizeof s->message,
                         "stop requested; the input was closed after global step %lld",
                         (long long)ctx->global_step);
            return;
        }
        if (rc == IFD_EEOF && s->cfg.mode == IFD_MODE_PREDICT) {
            /* the normal end of predict: every replica saw the stopping signal */
            s->reason = IFD_END_INPUT_ENDED;
            snprintf(s->message, sizeof s->message,
                     "the stopping signal ended predict mode after %lld steps",
                     (long long)steps_run(s));
            IFD_LOG_INFO("%s", s->message);
            return;
        }
        if (rc == IFD_EEOF) {
            s->reason = IFD_END_INPUT_ENDED;
            snprintf(s->message, sizeof s->message,
                     "the input ended after global step %lld, %lld steps into a loop of %lld",
                     (long long)ctx->global_step, (long long)done, (long long)n);
            IFD_LOG_WARN("%s; ending the run", s->message);
            return;
        }
        if (rc) {
            ifd_rendezvous_record_error(s->rv, "device", &e);
            return;
        }
        if (call_hooks(s, CB_AFTER_RUN))
            return;
        __atomic_store_n(&ctx->loop_index, ctx->loop_index + 1, __ATOMIC_RELAXED);
    }
}

/* run_loops under the watchdog (cfg.watchdog_secs > 0): a thread beside the loops, started
 * before the first and stopped after the last. */
static void run_loops_watched(ifd_session *s)
{
    ifd_watchdog *w = NULL;
    if (s->cfg.watchdog_secs > 0.0) {
        ifd_watchdog_config wc = {
            .dev = s->dev,
            .rv = s->rv,
            .secs = s->cfg.watchdog_secs,
            .grace_secs = s->cfg.initial_infeed_sleep_secs,
            .context = s->watchdog_context,
            .context_arg = s->watchdog_context_arg,
        };
        int rc = ifd_watchdog_start(&w, &wc);
        if (rc) {
            ifd_rendezvous_error(s->rv, "session", rc, "cannot start the watchdog thread");
            return;
        }
    }
    run_loops(s);
    ifd_watchdog_stop(w);
}

/* run_loops_watched, with the stop relay beside it on several hosts (train and eval): started
 * before the first loop, finished after the last (it ends once every host's loops are over). */
static void run_loops_relayed(ifd_session *s)
{
    int relay = agree_with_hosts(s);
    if (relay && ifd_stop_relay_start(&s->relay)) {
        ifd_rendezvous_error(s->rv, "session", IFD_ENOMEM, "cannot start the stop relay thread");
        return;
    }
    run_loops_watched(s);
    if (relay)
        ifd_stop_relay_finish(&s->relay);
}

int ifd_session_run(ifd_session *s, ifd_error *err)
{
    if (s->ran)
        return ifd_error_set(err, IFD_EINVAL, "session: ifd_session_run may be called once");
    s->ran = 1;
    ifd_error_clear(err);
    s->ctx.global_step = ifd_device_global_step(s->dev);

    if (call_hooks(s, CB_BEGIN) == IFD_OK) {
        ifd_infeed_config ic = {
            .dev = s->dev,
            .program = &s->program,
            .src = s->src,
            .input_mode = s->cfg.input_mode,
            .mode = s->cfg.mode,
            .batch_size = s->cfg.batch_size,
            .rv = s->rv,
            .initial_sleep_secs = s->cfg.initial_infeed_sleep_secs,
        };
        ifd_outfeed_config oc = {
            .dev = s->dev,
            .program = &s->program,
            .mode = s->cfg.mode,
            .summary_every = s->cfg.summary_every,
            .writer = &s->writer,
            .rv = s->rv,
            .input_mode = s->cfg.input_mode,
            .max_batch_rows = s->cfg.batch_size,
            .pred_sinks = s->pred_sinks,
            .npred_sinks = s->npred_sinks,
            .hosts = ifd_hosts_many(s->cfg.hosts) ? s->cfg.hosts : NULL,
            .max_skipped_steps = s->cfg.max_skipped_steps,
        };
        ifd_infeed *f = NULL;
        int rc = ifd_infeed_start(&f, &ic);
        __atomic_store_n(&s->infeed, f, __ATOMIC_RELEASE); /* read by ifd_session_infeed_waiting */
        if (rc == IFD_OK)
            rc = ifd_outfeed_start(&s->outfeed, &oc);
        if (rc)
            ifd_rendezvous_error(s->rv, "session", rc, "cannot start the controller threads");
        else if (call_hooks(s, CB_AFTER_CREATE) == IFD_OK)
            run_loops_relayed(s);
    }

    /* end: STOP and join both controllers, then the hooks, then the last summaries. */
    ifd_infeed_stop(s->infeed);
    ifd_outfeed_stop(s->outfeed);
    s->ctx.global_step = ifd_device_global_step(s->dev);
    s->ctx.failed = ifd_rendezvous_cause(s->rv, NULL) != IFD_OK || ifd_rendezvous_stopping(s->rv);
    s->ctx.dropped = ifd_infeed_dropped(s->infeed);
    /* Several hosts whose input ended (or was closed) on one: the others' infeed threads had
     * taken batches for steps that never ran (the loop's next ones), so their positions are ahead
     * of the state. */
    if (ifd_hosts_many(s->cfg.hosts) && s->ended_by_eof && s->ctx.dropped == 0)
        s->ctx.dropped = 1;
    call_hooks(s, CB_END);
    if (s->outfeed) {
        ifd_error e;
        if (ifd_outfeed_flush(s->outfeed, &e))
            ifd_rendezvous_record_error(s->rv, "outfeed", &e);
    }
    ifd_error cause;
    int code = ifd_rendezvous_cause(s->rv, &cause);
    if (code) {
        s->reason = IFD_END_ERROR;
        if (err)
            *err = cause;
    } else if (s->reason == IFD_END_NONE) {
        s->reason = IFD_END_STOPPED;
    }
    emit_end(s, code, &cause);
    IFD_LOG_INFO("run ended at global step %lld: %s%s%s", (long long)s->ctx.global_step,
                 ifd_end_reason_name(s->reason), code ? ": " : "",
                 code ? ifd_error_text(&cause) : "");
    return code;
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
    int h = stop_asked(s);
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
    free(s);
}
