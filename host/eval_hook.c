/* Evaluation during training (host/eval_hook.h): the hook, the metrics' rules, the shared sink. */
#include "host/eval_hook.h"

#include "core/log.h"
#include "core/thread.h"
#include <infeed/hosts.h>

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether v improves on best (have: there is a best). */
static int improves(const char *metric, int have, double best, double v)
{
    if (!have)
        return 1;
    return ifd_eval_metric_minimized(metric) ? v < best : v > best;
}

/* ---- the shared sink ---------------------------------------------------------------------- */

typedef struct shared_sink {
    ifd_mutex mu;
    ifd_sink *inner;
} shared_sink;

static int shared_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    shared_sink *s = ctx;
    ifd_mutex_lock(&s->mu);
    int rc = ifd_sink_write(s->inner, json, len, err);
    ifd_mutex_unlock(&s->mu);
    return rc;
}

static int shared_flush(void *ctx, ifd_error *err)
{
    shared_sink *s = ctx;
    ifd_mutex_lock(&s->mu);
    int rc = ifd_sink_flush(s->inner, err);
    ifd_mutex_unlock(&s->mu);
    return rc;
}

static void shared_destroy(void *ctx)
{
    shared_sink *s = ctx;
    ifd_mutex_fini(&s->mu);
    free(s);
}

static const ifd_sink_ops shared_ops = {
    .write = shared_write, .flush = shared_flush, .destroy = shared_destroy};

int ifd_sink_shared_create(ifd_sink **out, ifd_sink *inner)
{
    shared_sink *s = calloc(1, sizeof *s);
    if (s == NULL)
        return IFD_ENOMEM;
    ifd_mutex_init(&s->mu);
    s->inner = inner;
    int rc = ifd_sink_create(out, &shared_ops, s);
    if (rc)
        shared_destroy(s);
    return rc;
}

/* ---- the eval sessions' hosts ------------------------------------------------------------- */

/* Several hosts: the eval session's view of them, the train run's hosts with its OUTFEED and STOP
 * traffic moved to channels of its own (infeed/hosts.h): the train session's outfeed thread may
 * still be summing its last loop, and its stop relay makes rounds through the whole run. Its
 * STEP and LOOP traffic stays: the train session's replicas are between loops, and the session's
 * thread, which owns LOOP, is the one running the eval. */
static int eval_channel(int channel)
{
    return channel == IFD_HOSTS_OUTFEED ? IFD_HOSTS_EVAL_OUTFEED
           : channel == IFD_HOSTS_STOP  ? IFD_HOSTS_EVAL_STOP
                                        : channel;
}

static int eh_allgather(void *ctx, int channel, const void *send, void *recv, size_t bytes,
                        ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    const ifd_hosts *in = ctx;
    return in->ops->allgather(in->ctx, eval_channel(channel), send, recv, bytes, stop, stop_arg,
                              err);
}

static int eh_allreduce_i64(void *ctx, int channel, int64_t *vals, int n, ifd_hosts_op op,
                            ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    const ifd_hosts *in = ctx;
    return in->ops->allreduce_i64(in->ctx, eval_channel(channel), vals, n, op, stop, stop_arg, err);
}

static int eh_broadcast(void *ctx, int channel, void *buf, size_t bytes, int root,
                        ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    const ifd_hosts *in = ctx;
    return in->ops->broadcast(in->ctx, eval_channel(channel), buf, bytes, root, stop, stop_arg,
                              err);
}

static const ifd_hosts_ops eval_hosts_ops = {
    .allgather = eh_allgather, .allreduce_i64 = eh_allreduce_i64, .broadcast = eh_broadcast};
static const ifd_hosts_ops eval_hosts_ops_nobcast = {.allgather = eh_allgather,
                                                     .allreduce_i64 = eh_allreduce_i64};

/* ---- the hook ----------------------------------------------------------------------------- */

typedef struct eval_hook {
    ifd_eval_hook_options o;
    char *best_dir, *keep_best;
    int64_t next_due;  /* the next multiple of every */
    int64_t last_step; /* the run's last step (its natural end) */
    int64_t last_eval; /* the global step of the last eval tried, -1: none */
    ifd_hosts hosts;   /* several hosts: the eval sessions' (size 0: one host) */
    /* keep_best */
    int have_best;
    double best;
    /* early_stopping */
    char early_metric[64];
    int64_t patience, bad;
    int have_early;
    double early_best;
    int64_t early_best_step;
} eval_hook;

static void ask_loop_end(eval_hook *h, ifd_run_context *ctx)
{
    h->next_due = (ifd_run_context_global_step(ctx) / h->o.every + 1) * h->o.every;
    ifd_run_context_end_next_loop_by(ctx, h->next_due);
}

/* The eval session's input mode: the train run's, but per-host-v2 for per-core (the eval set is
 * one stream in arrival order, not one a replica; per-host-v2 takes the same batches of
 * batch_size / replicas rows, one a replica a step). */
static ifd_input_mode eval_input_mode(const eval_hook *h)
{
    return h->o.run.input_mode == IFD_INPUT_PER_CORE ? IFD_INPUT_PER_HOST_V2 : h->o.run.input_mode;
}

/* Batches an eval step takes: per-host-v2 (and so per-core) one a replica, the others one. */
static int64_t batches_a_step(const eval_hook *h)
{
    return eval_input_mode(h) == IFD_INPUT_PER_HOST_V2 ? h->o.run.replicas : 1;
}

/* The eval session of `steps` steps from ck's parameters over the set (padded after its batches
 * when the hosts agreed on more steps than it fills): its eval summary (a new reference) into
 * *out. */
static int run_eval(eval_hook *h, const ifd_checkpoint *ck, int64_t steps, json_t **out,
                    ifd_error *err)
{
    ifd_config ec = h->o.run;
    ec.mode = IFD_MODE_EVAL;
    ec.input_mode = eval_input_mode(h);
    ec.steps = steps;
    ec.last_step = 0;
    ec.initial_global_step = 0;
    ec.restore = ck;
    ec.hosts = h->hosts.size > 1 ? &h->hosts : NULL;
    ec.watchdog = 0;
    ec.initial_infeed_sleep = 0;
    ifd_eval_replay *r = NULL;
    ifd_sink *mem = NULL;
    ifd_session *s = NULL;
    int rc = ifd_eval_replay_create(&r, h->o.set, err);
    if (rc)
        return rc;
    if ((rc = ifd_sink_memory_create(&mem)) != IFD_OK) {
        ifd_error_set(err, rc, "eval: a memory sink");
        goto out;
    }
    if ((rc = ifd_session_create(&s, &ec, ifd_eval_replay_source(r), err)) != IFD_OK)
        goto out;
    ifd_eval_replay_pad(r, ifd_session_program(s),
                        ifd_input_batch_rows(ec.input_mode, ec.batch_size, ec.replicas),
                        steps * batches_a_step(h));
    if ((rc = ifd_session_add_sink(s, mem)) != IFD_OK) {
        ifd_error_set(err, rc, "eval: cannot add its sink");
        goto out;
    }
    if ((rc = ifd_session_run(s, err)) != IFD_OK)
        goto out;
    for (size_t i = 0; *out == NULL && i < ifd_sink_memory_count(mem); i++) {
        char *line = ifd_sink_memory_get(mem, i);
        json_t *j = line ? json_loads(line, 0, NULL) : NULL;
        const char *event = json_string_value(json_object_get(j, "event"));
        free(line);
        if (event && strcmp(event, "eval") == 0)
            *out = j;
        else
            json_decref(j);
    }
    if (*out == NULL)
        rc = ifd_error_set(err, IFD_EINTERNAL, "eval: the eval session wrote no eval summary");
out:
    ifd_session_destroy(s);
    ifd_sink_destroy(mem);
    ifd_eval_replay_destroy(r);
    return rc;
}

static int emit(eval_hook *h, json_t *summary, ifd_error *err)
{
    char *text = json_dumps(summary, JSON_COMPACT);
    if (text == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "eval: its summary");
    int rc = IFD_OK;
    for (int i = 0; i < h->o.nsinks && rc == IFD_OK; i++)
        rc = ifd_sink_write(h->o.sinks[i], text, strlen(text), err);
    free(text);
    return rc;
}

/* The summary's number under metric, or an error naming the flag. */
static int metric_of(const json_t *summary, const char *metric, const char *flag, double *v,
                     ifd_error *err)
{
    const json_t *j = json_object_get(summary, metric);
    if (json_is_number(j)) {
        *v = json_number_value(j);
        return IFD_OK;
    }
    char keys[512] = "";
    const char *k;
    json_t *val;
    json_object_foreach((json_t *)summary, k, val)
    {
        if (!json_is_number(val))
            continue;
        size_t at = strlen(keys);
        snprintf(keys + at, sizeof keys - at, "%s%s", at ? ", " : "", k);
    }
    return ifd_error_set(err, IFD_EINVAL,
                         "%s: the eval summary has no number '%s' (its numbers: %s)", flag, metric,
                         keys);
}

/* best.json beside the best checkpoint: written to a temporary file and renamed. */
static int write_sidecar(eval_hook *h, double v, int64_t step, const char *path, ifd_error *err)
{
    char file[4200], tmp[4300];
    snprintf(file, sizeof file, "%s/best.json", h->best_dir);
    snprintf(tmp, sizeof tmp, "%s/.best.json.tmp.%ld", h->best_dir, (long)getpid());
    json_t *j = json_pack("{s:s, s:f, s:I, s:s}", "metric", h->keep_best, "value", v, "global_step",
                          (json_int_t)step, "checkpoint", strrchr(path, '/') + 1);
    int rc = j && json_dump_file(j, tmp, JSON_COMPACT) == 0 ? IFD_OK : IFD_EIO;
    json_decref(j);
    if (rc == IFD_OK && rename(tmp, file) != 0)
        rc = IFD_EIO;
    if (rc) {
        unlink(tmp);
        return ifd_error_set(err, rc, "keep_best: cannot write '%s': %s", file, strerror(errno));
    }
    return IFD_OK;
}

static int keep_best(eval_hook *h, ifd_checkpoint *ck, const json_t *summary, int64_t step,
                     ifd_error *err)
{
    double v;
    int rc = metric_of(summary, h->keep_best, "keep_best", &v, err);
    if (rc || !improves(h->keep_best, h->have_best, h->best, v))
        return rc;
    /* several hosts: each has the same summary, so each is here, and gathers the positions */
    if ((rc = ifd_checkpoint_add_positions(ck, h->o.run.hosts, h->o.positions, h->o.positions_arg,
                                           err)) != IFD_OK)
        return rc;
    h->have_best = 1;
    h->best = v;
    if (ifd_hosts_many(h->o.run.hosts) && !h->o.write)
        return IFD_OK;
    if (mkdir(h->best_dir, 0755) != 0 && errno != EEXIST)
        return ifd_error_set(err, IFD_EIO, "keep_best: cannot create '%s': %s", h->best_dir,
                             strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/best%s", h->best_dir, IFD_CHECKPOINT_SUFFIX);
    if ((rc = ifd_checkpoint_write(ck, path, err)) != IFD_OK ||
        (rc = write_sidecar(h, v, step, path, err)) != IFD_OK)
        return rc;
    IFD_LOG_INFO("keep_best: %s %g at global step %" PRId64 " is the best so far: %s", h->keep_best,
                 v, step, path);
    return IFD_OK;
}

static int early_stopping(eval_hook *h, ifd_run_context *ctx, const json_t *summary, int64_t step,
                          ifd_error *err)
{
    double v;
    int rc = metric_of(summary, h->early_metric, "early_stopping", &v, err);
    if (rc)
        return rc;
    if (improves(h->early_metric, h->have_early, h->early_best, v)) {
        h->have_early = 1;
        h->early_best = v;
        h->early_best_step = step;
        h->bad = 0;
        return IFD_OK;
    }
    if (++h->bad < h->patience)
        return IFD_OK;
    char why[200];
    snprintf(why, sizeof why,
             "early_stopping: %s did not improve on %g (global step %" PRId64 ") in %" PRId64
             " evals",
             h->early_metric, h->early_best, h->early_best_step, h->bad);
    IFD_LOG_INFO("%s: ending the run", why);
    ifd_run_context_request_stop(ctx, why);
    return IFD_OK;
}

/* Several hosts: every host's eval steps agreed (one all-reduce MAX on the LOOP channel, the
 * session's thread: every host's hook calls it at the same loop end): *steps the most any host's
 * set fills, *bad_host the highest host that cannot evaluate (-1: none), *empty whether every
 * set is empty. One host: its own. */
static int agree_steps(eval_hook *h, int bad, int64_t *steps, int *bad_host, int *empty,
                       ifd_error *err)
{
    *bad_host = bad ? 0 : -1;
    *empty = *steps == 0;
    if (h->hosts.size <= 1)
        return IFD_OK;
    const ifd_hosts *in = h->hosts.ctx;
    int64_t v[3] = {bad ? in->rank + 1 : 0, *steps, *steps > 0};
    int rc = in->ops->allreduce_i64(in->ctx, IFD_HOSTS_LOOP, v, 3, IFD_HOSTS_MAX, NULL, NULL, err);
    if (rc)
        return ifd_error_prefix(err, "eval: the hosts' eval steps");
    *bad_host = (int)v[0] - 1;
    *steps = v[1];
    *empty = v[2] == 0;
    return IFD_OK;
}

static int evaluate(eval_hook *h, ifd_run_context *ctx, int64_t step, ifd_error *err)
{
    h->last_eval = step;
    int64_t n = 0;
    ifd_error why;
    ifd_error_clear(&why);
    int bad = ifd_eval_set_wait(h->o.set, step, &n, &why) != IFD_OK;
    if (!bad && n % batches_a_step(h) != 0) {
        bad = 1;
        ifd_error_set(&why, IFD_EINVAL,
                      "the eval set holds %" PRId64 " batches, and %s input takes %" PRId64
                      " a step (one a replica): expected a multiple of %" PRId64,
                      n, ifd_input_mode_name(h->o.run.input_mode), batches_a_step(h),
                      batches_a_step(h));
    }
    int64_t steps = bad ? 0 : n / batches_a_step(h);
    int bad_host, empty;
    int rc = agree_steps(h, bad, &steps, &bad_host, &empty, err);
    if (rc)
        return rc;
    if (bad) {
        IFD_LOG_WARN("eval at global step %" PRId64 " skipped: %s", step, why.msg);
        return IFD_OK;
    }
    if (bad_host >= 0) {
        IFD_LOG_WARN("eval at global step %" PRId64 " skipped: host %d cannot evaluate its eval "
                     "set (its log says why), and every host skips it",
                     step, bad_host);
        return IFD_OK;
    }
    if (empty) {
        IFD_LOG_WARN("eval at global step %" PRId64 " skipped: the eval set is empty%s", step,
                     h->hosts.size > 1 ? " on every host" : "");
        return IFD_OK;
    }
    int64_t t0 = ifd_clock_ns();
    ifd_checkpoint *ck;
    rc = ifd_run_context_checkpoint(ctx, &ck, err);
    if (rc)
        return rc;
    json_t *summary = NULL;
    rc = run_eval(h, ck, steps, &summary, err);
    if (rc == IFD_OK) {
        json_object_set_new(summary, "global_step", json_integer(step));
        json_object_set_new(summary, "during_train", json_true());
        rc = emit(h, summary, err);
        IFD_LOG_INFO("eval at global step %" PRId64 ": %" PRId64 " batches%s in %.1f ms", step, n,
                     n < steps * batches_a_step(h) ? " and padding to the hosts' steps" : "",
                     (double)(ifd_clock_ns() - t0) / 1e6);
    }
    if (rc == IFD_OK && h->keep_best)
        rc = keep_best(h, ck, summary, step, err);
    if (rc == IFD_OK && h->patience > 0)
        rc = early_stopping(h, ctx, summary, step, err);
    json_decref(summary);
    ifd_checkpoint_free(ck);
    return rc;
}

/* A run resumed with keep_best: the best so far is best.json's, when it is of this metric. */
static void read_sidecar(eval_hook *h)
{
    char file[4200];
    snprintf(file, sizeof file, "%s/best.json", h->best_dir);
    json_t *j = json_load_file(file, 0, NULL);
    const char *m = json_string_value(json_object_get(j, "metric"));
    json_t *v = json_object_get(j, "value");
    if (m && strcmp(m, h->keep_best) == 0 && json_is_number(v)) {
        h->have_best = 1;
        h->best = json_number_value(v);
        IFD_LOG_INFO("keep_best: the best so far is %s %g (%s)", m, h->best, file);
    }
    json_decref(j);
}

static int ev_after_create_session(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    eval_hook *h = arg;
    if (h->keep_best)
        read_sidecar(h);
    h->last_step =
        h->o.run.steps > 0 ? ifd_run_context_global_step(ctx) + h->o.run.steps : h->o.run.last_step;
    ask_loop_end(h, ctx);
    return IFD_OK;
}

static int ev_after_run(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    eval_hook *h = arg;
    int64_t step = ifd_run_context_global_step(ctx), due = h->next_due;
    ask_loop_end(h, ctx);
    return step >= due ? evaluate(h, ctx, step, err) : IFD_OK;
}

/* The end of a run that reached its last step off a multiple of every (or whose eval there was
 * not tried): one more eval, of the final parameters, as Estimator's train_and_evaluate ends
 * with. Not after a failure, a stop or the input's end (the run did not finish its steps). */
static int ev_end(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    eval_hook *h = arg;
    int64_t step = ifd_run_context_global_step(ctx);
    if (ifd_run_context_failed(ctx) || step != h->last_step || step == h->last_eval)
        return IFD_OK;
    IFD_LOG_INFO("eval at the end of the run, global step %" PRId64, step);
    return evaluate(h, ctx, step, err);
}

static void ev_destroy(void *arg)
{
    eval_hook *h = arg;
    free(h->best_dir);
    free(h->keep_best);
    free(h);
}

int ifd_hook_eval_every(ifd_hook *out, const ifd_eval_hook_options *o, ifd_error *err)
{
    if (o->every < 1 || o->set == NULL)
        return ifd_error_set(err, IFD_EINVAL, "eval_every: expected 1 or more steps, got %" PRId64,
                             o->every);
    eval_hook *h = calloc(1, sizeof *h);
    if (h == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "eval hook");
    h->o = *o;
    h->last_eval = -1;
    if (ifd_hosts_many(o->run.hosts)) {
        h->hosts = *o->run.hosts;
        h->hosts.ops = o->run.hosts->ops->broadcast ? &eval_hosts_ops : &eval_hosts_ops_nobcast;
        h->hosts.ctx = (void *)o->run.hosts;
    }
    if (o->early_stopping &&
        ifd_eval_parse_early_stopping(o->early_stopping, h->early_metric, sizeof h->early_metric,
                                      &h->patience) != 0) {
        free(h);
        return ifd_error_set(err, IFD_EINVAL, "early_stopping: expected METRIC:PATIENCE, got '%s'",
                             o->early_stopping);
    }
    int nomem = 0;
    if (o->keep_best) {
        if (o->checkpoint_dir == NULL) {
            free(h);
            return ifd_error_set(err, IFD_EINVAL, "keep_best: expected checkpoint_dir, got none");
        }
        size_t len = strlen(o->checkpoint_dir) + 6;
        h->keep_best = strdup(o->keep_best);
        h->best_dir = malloc(len);
        nomem = h->keep_best == NULL || h->best_dir == NULL;
        if (h->best_dir)
            snprintf(h->best_dir, len, "%s/best", o->checkpoint_dir);
    }
    if (nomem) {
        ev_destroy(h);
        return ifd_error_set(err, IFD_ENOMEM, "eval hook");
    }
    h->o.keep_best = h->keep_best;
    h->o.early_stopping = NULL;
    h->o.checkpoint_dir = NULL;
    *out = (ifd_hook){
        .name = "eval_every",
        .after_create_session = ev_after_create_session,
        .after_run = ev_after_run,
        .end = ev_end,
        .destroy = ev_destroy,
        .arg = h,
    };
    return IFD_OK;
}
