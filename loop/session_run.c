/*
 * ifd_session_run: begin, after_create_session, then device loops (each: its length, the hosts'
 * agreement, before_run, the loop, after_run) until a hook, a stop, the input or an error ends
 * the run, then end and the last summary.
 */
#include "core/log.h"
#include "core/thread.h"
#include <infeed/host_call.h>
#include <infeed/hosts.h>
#include "loop/session_state.h"
#include "loop/watchdog.h"

#include <stdio.h>
#include <string.h>

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
    int asked = ifd_session_stop_host(s);
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

/* The infeed's, once a step (IFD_SHARD_* bits): the step writes the program's outfeed tensors
 * only for someone who takes them, a host call (every step) or a tensor sink that wants them
 * now (with several hosts, any tensor sink, every step: the hosts exchange the same tensors). */
static int outfeeds_taken(void *arg)
{
    ifd_session *s = arg;
    if (s->cfg.mode == IFD_MODE_PREDICT)
        return 0;
    int bits = s->cfg.nhost_calls > 0 || ifd_host_call_count() > 0 ? IFD_SHARD_OUTFEEDS : 0;
    for (int i = 0; i < s->ntensor_sinks; i++) {
        const ifd_tensor_sink *t = &s->tensor_sinks[i];
        if (t->wants == NULL || ifd_hosts_many(s->cfg.hosts) || t->wants(t->ctx))
            return IFD_SHARD_OUTFEEDS | IFD_SHARD_TO_SINKS;
    }
    return bits;
}

/* Runs device loops until a hook, a stop request, the input or an error ends the run. */
static void run_loops(ifd_session *s)
{
    ifd_run_context *ctx = &s->ctx;
    for (;;) {
        if (ctx->stop_requested) {
            if (strcmp(ctx->stop_reason, "last_step") == 0) {
                s->reason = IFD_END_LAST_STEP;
            } else if (strncmp(ctx->stop_reason, "early_stopping", 14) == 0) {
                s->reason = IFD_END_EARLY_STOPPING;
                snprintf(s->message, sizeof s->message, "%s", ctx->stop_reason);
            } else {
                s->reason = IFD_END_STOPPED;
                snprintf(s->message, sizeof s->message, "%s", ctx->stop_reason);
            }
            return;
        }
        if (!agree_with_hosts(s) && ifd_session_stop_host(s) >= 0) {
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
        if (rc == IFD_EEOF && ifd_session_stop_host(s) >= 0) {
            s->reason = IFD_END_STOPPED;
            if (ifd_hosts_many(s->cfg.hosts))
                snprintf(s->message, sizeof s->message,
                         "stop requested on host %d; the input was closed, and every host stopped "
                         "after global step %lld",
                         ifd_session_stop_host(s), (long long)ctx->global_step);
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

/* run_loops under the watchdog (cfg.watchdog > 0): a thread beside the loops, started
 * before the first and stopped after the last. */
static void run_loops_watched(ifd_session *s)
{
    ifd_watchdog *w = NULL;
    if (s->cfg.watchdog > 0.0) {
        ifd_watchdog_config wc = {
            .dev = s->dev,
            .rv = s->rv,
            .secs = s->cfg.watchdog,
            .grace_secs = s->cfg.initial_infeed_sleep,
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
            .outfeeds_wanted = outfeeds_taken,
            .outfeeds_arg = s,
            .rv = s->rv,
            .initial_sleep_secs = s->cfg.initial_infeed_sleep,
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
            .tensor_sinks = s->tensor_sinks,
            .host_calls = s->cfg.host_calls,
            .nhost_calls = s->cfg.nhost_calls,
            .ntensor_sinks = s->ntensor_sinks,
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
