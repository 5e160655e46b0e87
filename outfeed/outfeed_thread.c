#include "core/log.h"
#include "core/opqueue.h"
#include "core/thread.h"
#include <infeed/hosts.h>
#include "outfeed/outfeed_thread.h"
#include "outfeed/hostcall.h"
#include "outfeed/plugin_calls.h"
#include "outfeed/reducer_set.h"
#include "outfeed/step_tensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SOURCE "outfeed"

/* The batches of skipped steps that a summary names (the rest are counted), and that the
 * sentence ending a run for too many skipped steps in a row names. */
#define SKIP_NOTES 16
#define SKIP_RUN_NOTES 4

/* A skipped step's batch whose loss was not finite. */
typedef struct skip_note {
    int64_t step;
    int replica;
    ifd_batch_tag from;
} skip_note;

typedef struct skip_notes {
    skip_note v[SKIP_NOTES];
    int n, cap;
    int64_t more; /* noted beyond cap */
} skip_notes;

/* Timing of a summary window, from the records' own timestamps: the rates say when the steps
 * ran, not when the outfeed thread got to them. Windows are back to back. */
typedef struct window_time {
    int64_t start_ns; /* the previous window's end; for the first, when its first step began */
    int64_t end_ns;   /* when its last step ended */
    double step_ns;   /* summed over replicas and steps */
    double infeed_wait_ns;
    double outfeed_wait_ns;
} window_time;

struct ifd_outfeed {
    ifd_outfeed_config cfg;
    ifd_opq *opq;
    int replicas;
    ifd_outfeed_rec *recs;
    float *cat;
    ifd_metrics window;
    window_time time;
    int64_t last_step;
    ifd_prediction_call pred; /* predict mode */
    ifd_outfeed_tensors tens; /* train, eval: the step's tensors on the host */
    ifd_reducer_set calls;    /* train, eval: the built-in host calls over them */
    ifd_plugin_calls plugins; /* train, eval: the plugins' host calls (--host-call-lib) */
    int64_t steps_done;       /* steps this run */
    int64_t loop_n;           /* the length of the loop whose records come now */
    int64_t window_loop_n;    /* the length of the loop of the window's last step */
    /* Skipped steps (docs/design.md, "Non-finite steps"): this run's, those in a row so far
     * (from global step run_first), the batches named in the window's summary and in the run
     * of skips, and the log's rate limit. */
    int64_t skipped_total;
    int64_t skip_run, skip_run_first;
    skip_notes win_notes, run_notes;
    ifd_log_limit skip_log;
};

/* part / whole, clamped to [0, 1]. */
static double fraction(double part, double whole)
{
    if (whole <= 0.0)
        return 0.0;
    double f = part / whole;
    return f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
}

static void time_add(window_time *w, const ifd_outfeed_rec *recs, int replicas, int first)
{
    for (int r = 0; r < replicas; r++) {
        const ifd_outfeed_rec *rec = &recs[r];
        /* The outfeed thread may wake after the first step began: the run starts no later. */
        if (first && rec->end_ns - rec->step_ns < w->start_ns)
            w->start_ns = rec->end_ns - rec->step_ns;
        if (rec->end_ns > w->end_ns)
            w->end_ns = rec->end_ns;
        w->step_ns += (double)rec->step_ns;
        w->infeed_wait_ns += (double)rec->infeed_wait_ns;
        w->outfeed_wait_ns += (double)rec->outfeed_wait_ns;
    }
}

static int rendezvous_stopping(void *arg)
{
    return ifd_rendezvous_stopping(arg);
}

/* Several hosts: the window's metrics summed over the hosts, in rank order (every host gets the
 * same bits). steps: the most any host ran (train: the same on every host). */
static int reduce_hosts(ifd_outfeed *o, ifd_metrics *m, ifd_error *err)
{
    const ifd_hosts *h = o->cfg.hosts;
    enum { N = 7 };
    double mine[N] = {(double)m->steps, m->loss_sum,        m->loss_weighted, m->correct,
                      m->count,         (double)m->skipped, m->skipped_rows};
    double *all = calloc((size_t)h->size * N, sizeof(double));
    if (all == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "summaries of %d hosts", h->size);
    int rc = h->ops->allgather(h->ctx, IFD_HOSTS_OUTFEED, mine, all, sizeof mine,
                               rendezvous_stopping, o->cfg.rv, err);
    if (rc == IFD_OK) {
        *m = (ifd_metrics){0};
        for (int k = 0; k < h->size; k++) {
            const double *v = all + (size_t)k * N;
            if ((int64_t)v[0] > m->steps)
                m->steps = (int64_t)v[0];
            m->loss_sum += v[1];
            m->loss_weighted += v[2];
            m->correct += v[3];
            m->count += v[4];
            if ((int64_t)v[5] > m->skipped) /* every host skips the same steps */
                m->skipped = (int64_t)v[5];
            m->skipped_rows += v[6];
        }
    }
    free(all);
    return rc;
}

static json_t *notes_json(const skip_notes *ns)
{
    json_t *a = json_array();
    for (int i = 0; i < ns->n; i++) {
        const skip_note *k = &ns->v[i];
        json_array_append_new(a, json_pack("{s:I, s:i, s:s, s:I}", "global_step",
                                           (json_int_t)k->step, "replica", k->replica, "producer",
                                           k->from.producer, "seq", (json_int_t)k->from.seq));
    }
    if (ns->more > 0)
        json_array_append_new(a, json_pack("{s:I}", "more", (json_int_t)ns->more));
    return a;
}

static void note_add(skip_notes *ns, const skip_note *k)
{
    for (int i = 0; i < ns->n; i++) /* broadcast: every replica had the same batch */
        if (ns->v[i].step == k->step && ns->v[i].from.seq == k->from.seq &&
            strcmp(ns->v[i].from.producer, k->from.producer) == 0)
            return;
    if (ns->n < ns->cap)
        ns->v[ns->n++] = *k;
    else
        ns->more++;
}

/* "producer 'a' batch 12 (step 40), ..." for the sentence that ends the run. */
static void notes_text(const skip_notes *ns, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < ns->n && off < len; i++) {
        char name[64];
        off += (size_t)snprintf(buf + off, len - off, "%sproducer '%s' batch %lld (step %lld)",
                                i ? ", " : "",
                                ifd_log_escape(ns->v[i].from.producer, name, sizeof name),
                                (long long)ns->v[i].from.seq, (long long)ns->v[i].step);
    }
    if (ns->more > 0 && off < len)
        snprintf(buf + off, len - off, " and %lld more", (long long)ns->more);
}

/* A step whose gradients (train) or loss (eval) were not finite: no replica applied it (train:
 * device/step.c). It counts as a step; its loss and rows are left out of the metrics. The
 * batches whose loss was not finite are named; too many skips in a row end the run. */
static int skip_step(ifd_outfeed *o, int n, ifd_error *err)
{
    int train = o->cfg.mode == IFD_MODE_TRAIN;
    int64_t step = train ? o->recs[0].step : o->steps_done + 1; /* eval: its own count */
    ifd_metrics *m = &o->window;
    m->steps++;
    m->skipped++;
    o->skipped_total++;
    for (int r = 0; r < n; r++)
        m->skipped_rows += o->recs[r].out.count;
    if (o->skip_run++ == 0) {
        o->skip_run_first = step;
        o->run_notes.n = 0;
        o->run_notes.more = 0;
    }
    int named = 0;
    for (int r = 0; r < o->replicas; r++) {
        const ifd_outfeed_rec *rec = &o->recs[r];
        int bad = train ? rec->out.loss_nonfinite != 0.0f : !isfinite(rec->out.loss);
        if (!bad)
            continue;
        skip_note k = {step, r, rec->from};
        note_add(&o->win_notes, &k);
        note_add(&o->run_notes, &k);
        named = 1;
        char name[64];
        IFD_LOG_LIMITED(&o->skip_log, IFD_LOG_WARN,
                        "%s step %lld skipped: replica %d's loss is %g, on batch %lld of "
                        "producer '%s'%s",
                        ifd_mode_name(o->cfg.mode), (long long)step, r, (double)rec->out.loss,
                        (long long)rec->from.seq,
                        ifd_log_escape(rec->from.producer, name, sizeof name),
                        train ? "; no parameter changed" : "; left out of the metrics");
    }
    if (!named)
        IFD_LOG_LIMITED(&o->skip_log, IFD_LOG_WARN,
                        "step %lld skipped: the all-reduced gradients are not finite (%s); no "
                        "parameter changed",
                        (long long)step,
                        o->cfg.hosts ? "every loss on this host was finite"
                                     : "every replica's loss was finite");
    if (o->cfg.max_skipped_steps > 0 && o->skip_run >= o->cfg.max_skipped_steps) {
        char names[600];
        notes_text(&o->run_notes, names, sizeof names);
        return ifd_error_set(err, IFD_ENUMERIC,
                             "%lld steps in a row (%s steps %lld to %lld) were skipped because "
                             "their gradients or losses were not finite (max_skipped_steps %lld); "
                             "%s%s: the model diverged or the input holds extreme values (lower "
                             "the learning rate, bound the input with max_abs_input, or resume "
                             "from the last checkpoint)",
                             (long long)o->skip_run, train ? "global" : "eval",
                             (long long)o->skip_run_first, (long long)step,
                             (long long)o->cfg.max_skipped_steps,
                             names[0] ? "batches with a non-finite loss: "
                                      : "no batch had a "
                                        "non-finite loss",
                             names);
    }
    return IFD_OK;
}

/* Emits the window's summary and starts the next window where this one ended. */
static int emit_window(ifd_outfeed *o, ifd_error *err)
{
    ifd_metrics *m = &o->window;
    const window_time *w = &o->time;
    if (o->cfg.hosts && o->cfg.mode != IFD_MODE_PREDICT) {
        int rc = reduce_hosts(o, m, err);
        if (rc)
            return rc;
    }
    if (m->steps == 0)
        return IFD_OK;
    double secs = (double)(w->end_ns - w->start_ns) * 1e-9;
    json_t *j = json_object();
    json_object_set_new(j, "event", json_string(ifd_mode_name(o->cfg.mode)));
    json_object_set_new(j, "mode", json_string(ifd_mode_name(o->cfg.mode)));
    json_object_set_new(j, "global_step", json_integer(o->last_step));
    json_object_set_new(j, "steps", json_integer(m->steps));
    json_object_set_new(j, "iterations_per_loop", json_integer(o->window_loop_n));
    /* train: the mean over steps of the global batch's loss; eval: summed over replicas and
     * steps, weighted by rows, divided once; predict: no loss. Skipped steps are left out (null
     * when every step was skipped). */
    int64_t kept = m->steps - m->skipped;
    if (o->cfg.mode == IFD_MODE_TRAIN)
        json_object_set_new(j, "loss",
                            kept > 0 ? json_real(m->loss_sum / (double)kept) : json_null());
    else if (o->cfg.mode == IFD_MODE_EVAL)
        json_object_set_new(j, "loss",
                            m->count > 0 ? json_real(m->loss_weighted / m->count) : json_null());
    if (o->cfg.program->classifier && o->cfg.mode != IFD_MODE_PREDICT)
        json_object_set_new(j, "accuracy",
                            m->count > 0 || kept > 0
                                ? json_real(m->count > 0 ? m->correct / m->count : 0.0)
                                : json_null());
    double examples = m->count + m->skipped_rows;
    json_object_set_new(j, "examples", json_integer((json_int_t)examples));
    if (o->cfg.mode != IFD_MODE_PREDICT) {
        json_object_set_new(j, "skipped_steps", json_integer(m->skipped));
        if (o->win_notes.n > 0)
            json_object_set_new(j, "skipped_batches", notes_json(&o->win_notes));
    }
    json_t *calls = ifd_reducer_set_take(&o->calls); /* and reset for the next window */
    if (calls == NULL && o->plugins.n > 0)
        calls = json_object();
    if (o->plugins.n > 0 && ifd_plugin_calls_summary(&o->plugins, calls, err) != IFD_OK) {
        json_decref(calls);
        json_decref(j);
        return err->code;
    }
    if (calls)
        json_object_set_new(j, "host_calls", calls);
    json_object_set_new(j, "examples_per_sec", json_real(secs > 0 ? examples / secs : 0.0));
    json_object_set_new(j, "steps_per_sec", json_real(secs > 0 ? (double)m->steps / secs : 0.0));
    json_object_set_new(j, "infeed_wait_fraction",
                        json_real(fraction(w->infeed_wait_ns, w->step_ns)));
    json_object_set_new(j, "outfeed_wait_fraction",
                        json_real(fraction(w->outfeed_wait_ns, w->step_ns)));
    json_object_set_new(j, "time", json_real(ifd_wall_seconds()));
    int rc = ifd_summary_emit(o->cfg.writer, j, err);
    o->window = (ifd_metrics){0};
    o->win_notes.n = 0;
    o->win_notes.more = 0;
    o->time = (window_time){.start_ns = w->end_ns, .end_ns = w->end_ns};
    return rc;
}

/* Whether this step's tensors go to the tensor sinks: the infeed's verdict for the step, which
 * every replica's record carries (ifd_shard.outfeeds). */
static int sinks_take(const ifd_outfeed *o)
{
    return o->cfg.ntensor_sinks > 0 && o->recs[0].to_sinks;
}

/* The program's tensors the step copies: every one for the sinks, else the host calls'. */
static void tensors_needed(ifd_outfeed *o, int sinks)
{
    ifd_outfeed_tensors *c = &o->tens;
    for (int i = 0; i < c->program->noutfeeds; i++)
        c->need[i] = (unsigned char)sinks;
    for (int k = 0; !sinks && k < o->calls.n; k++) {
        c->need[o->calls.tensor[k]] = 1;
        if (o->calls.label[k] >= 0)
            c->need[o->calls.label[k]] = 1;
    }
    for (int k = 0; !sinks && k < o->plugins.n; k++)
        for (int j = 0; j < o->plugins.calls[k].cls->ntensors; j++)
            c->need[o->plugins.calls[k].idx[j]] = 1;
}

/* The step's outfeed tensors, concatenated (outfeed/step_tensors.h), to the tensor sinks. */
static int step_tensors(ifd_outfeed *o, int n, int skipped, ifd_error *err)
{
    int sinks = sinks_take(o);
    tensors_needed(o, sinks);
    int rc = ifd_outfeed_tensors_step(&o->tens, o->recs, n, rendezvous_stopping, o->cfg.rv, err);
    if (rc || !sinks)
        return rc;
    ifd_step_tensors st = {
        .global_step = o->cfg.mode == IFD_MODE_TRAIN ? o->recs[0].step : o->steps_done + 1,
        .skipped = skipped,
        .ntensors = o->tens.ntensors,
        .names = o->tens.names,
        .tensors = o->tens.tensors,
    };
    for (int i = 0; i < o->cfg.ntensor_sinks; i++) {
        rc = o->cfg.tensor_sinks[i].write(o->cfg.tensor_sinks[i].ctx, &st, err);
        if (rc)
            return ifd_error_prefix(err, "tensor sink at step %lld", (long long)st.global_step);
    }
    return IFD_OK;
}

/* One step: a record from every replica, concatenated, through the host call. */
static int outfeed_step(ifd_outfeed *o, ifd_error *err)
{
    for (int r = 0; r < o->replicas; r++) {
        int rc = ifd_device_outfeed_dequeue(o->cfg.dev, r, &o->recs[r]);
        if (rc) {
            for (int q = 0; q < r; q++) /* predict: records hold their batches */
                if (o->recs[q].batch)
                    ifd_batch_unref(o->recs[q].batch);
            if (rc == IFD_EEOF)
                return rc;
            return ifd_error_set(err, rc, "replica %d outfeed: %s", r, ifd_strerror(rc));
        }
    }
    int first = o->steps_done == 0; /* the run's first step */
    int rc;
    if (o->cfg.mode == IFD_MODE_PREDICT) {
        int64_t examples;
        rc = ifd_prediction_host_call(&o->pred, o->recs, o->replicas, &examples, err);
        o->window.steps++;
        o->window.count += (double)examples;
        o->steps_done++;
    } else {
        ifd_tensor t[IFD_OUT_NTENSORS];
        /* broadcast: every replica trained on the same rows; replica 0's copy is the step's
         * (each row counted once), its loss times R being the replicas' sum */
        int n = o->cfg.input_mode == IFD_INPUT_BROADCAST ? 1 : o->replicas;
        /* eval on several hosts: a shard of a padding batch (a host whose eval set is shorter
         * than another's) counts no row, loss or value (outfeed/step_tensors.c skips it) */
        for (int r = 0; r < o->replicas && o->cfg.mode == IFD_MODE_EVAL; r++)
            if (o->recs[r].from.padding) {
                o->recs[r].rows = 0;
                o->recs[r].out.loss = o->recs[r].out.correct = o->recs[r].out.count = 0.0f;
            }
        int skipped = 0;
        for (int r = 0; r < o->replicas; r++)
            skipped |= o->cfg.mode == IFD_MODE_TRAIN ? o->recs[r].out.skipped != 0.0f
                                                     : !isfinite(o->recs[r].out.loss);
        /* Every step, skipped or not: with several hosts this is a collective every host
         * calls at every step (an eval step may be skipped on one host only). */
        rc = step_tensors(o, n, skipped, err);
        if (rc)
            return rc;
        if (skipped) {
            rc = skip_step(o, n, err);
            if (rc)
                return rc; /* a sentence of its own, not a host call's */
        } else {
            o->skip_run = 0;
            rc = ifd_reducer_set_add(&o->calls, &o->tens, err);
            if (rc == IFD_OK)
                rc = ifd_plugin_calls_step(&o->plugins, &o->tens, o->recs[0].step, err);
            if (rc)
                return ifd_error_prefix(err, "at step %lld", (long long)o->recs[0].step);
            ifd_outfeed_concat(o->recs, n, o->cat, t);
            if (n < o->replicas && o->cfg.mode == IFD_MODE_TRAIN)
                o->cat[IFD_OUT_LOSS] *= (float)o->replicas;
            rc = ifd_metrics_host_call(&o->window, t, err);
        }
        o->steps_done++;
    }
    if (rc)
        return ifd_error_prefix(err, "host call at step %lld", (long long)o->recs[0].step);
    time_add(&o->time, o->recs, o->replicas, first);
    o->last_step = o->recs[0].step;
    o->window_loop_n = o->loop_n;
    /* train and predict: a summary every summary_every steps (train: global steps); eval: one at
     * the end, over every step */
    if (o->cfg.summary_every > 0 && o->cfg.mode != IFD_MODE_EVAL &&
        (o->cfg.mode == IFD_MODE_TRAIN ? o->last_step : o->steps_done) % o->cfg.summary_every == 0)
        return emit_window(o, err);
    return IFD_OK;
}

/* The end of a loop, or of the run's steps: the tensor sinks send what they held back. */
static int sinks_flush(ifd_outfeed *o, ifd_error *err)
{
    for (int i = 0; i < o->cfg.ntensor_sinks; i++) {
        const ifd_tensor_sink *t = &o->cfg.tensor_sinks[i];
        if (t->flush && t->flush(t->ctx, err) != IFD_OK)
            return ifd_error_prefix(err, "tensor sink after step %lld", (long long)o->last_step);
    }
    return IFD_OK;
}

static void outfeed_main(ifd_opq *q, void *arg)
{
    ifd_outfeed *o = arg;
    ifd_error err;
    ifd_error_clear(&err);
    int64_t n;
    while (ifd_opq_next(q, &n)) {
        /* The first window starts no later than now (time_add moves it back to when the first
         * step began); its end comes from the records alone: under load this thread may get
         * here after the replicas ran many steps, and a window must not end at "now". */
        if (o->time.start_ns == 0)
            o->time.start_ns = ifd_clock_ns();
        o->loop_n = n;
        for (int64_t i = 0; i < n; i++) {
            int rc = outfeed_step(o, &err);
            if (rc == IFD_EEOF) {
                IFD_LOG_DEBUG("outfeed: the device's input ended; no more steps");
                if (sinks_flush(o, &err) != IFD_OK)
                    ifd_rendezvous_record_error(o->cfg.rv, SOURCE, &err);
                return;
            }
            if (rc) {
                ifd_rendezvous_record_error(o->cfg.rv, SOURCE, &err);
                return;
            }
        }
        if (sinks_flush(o, &err) != IFD_OK) {
            ifd_rendezvous_record_error(o->cfg.rv, SOURCE, &err);
            return;
        }
    }
}

/* What a plugin's host call is told of the run. */
static ifd_host_call_info plugin_info(const ifd_program *p, ifd_mode mode, int replicas,
                                      const ifd_hosts *hosts)
{
    return (ifd_host_call_info){.mode = ifd_mode_name(mode),
                                .program = p->cls->name,
                                .classes = p->settings.classes > 0 ? p->settings.classes : 0,
                                .replicas = replicas,
                                .hosts = hosts ? hosts->size : 1};
}

/* The plugins' host calls (--host-call-lib) bind to the program's tensors in mode. */
static int plugins_check(const ifd_program *p, ifd_mode mode, ifd_error *err)
{
    if (mode == IFD_MODE_PREDICT || ifd_host_call_count() == 0)
        return IFD_OK;
    ifd_outfeed_tensors tens;
    int rc = ifd_outfeed_tensors_init(&tens, p, mode, 1, 1, NULL);
    if (rc)
        return ifd_error_set(err, rc, "host calls: out of memory");
    ifd_plugin_calls pc;
    ifd_host_call_info info = plugin_info(p, mode, 1, NULL);
    rc = ifd_plugin_calls_init(&pc, &tens, &info, err);
    ifd_plugin_calls_fini(&pc);
    ifd_outfeed_tensors_fini(&tens);
    if (rc == IFD_OK)
        return IFD_OK;
    ifd_error_prefix(err, "host_call_lib");
    return ifd_error_mark_key(err, "host_call_lib", 0, (int)strlen("host_call_lib"));
}

int ifd_outfeed_host_calls_check(const ifd_program *p, ifd_mode mode, const ifd_host_call *calls,
                                 int n, ifd_error *err)
{
    int prc = plugins_check(p, mode, err);
    if (prc)
        return prc;
    if (n <= 0)
        return IFD_OK;
    if (mode == IFD_MODE_PREDICT)
        return ifd_error_set_key(err, IFD_EINVAL, "host_calls",
                                 "expected none in predict mode (host calls run in train and "
                                 "eval mode), got %d",
                                 n);
    if (n > IFD_MAX_HOST_CALLS)
        return ifd_error_set_key(err, IFD_EINVAL, "host_calls", "expected at most %d, got %d",
                                 IFD_MAX_HOST_CALLS, n);
    ifd_outfeed_tensors tens;
    ifd_reducer_set set;
    int rc = ifd_outfeed_tensors_init(&tens, p, mode, 1, 1, NULL);
    if (rc)
        return ifd_error_set(err, rc, "host calls: out of memory");
    rc = ifd_reducer_set_init(&set, &tens, calls, n, err);
    ifd_reducer_set_fini(&set);
    ifd_outfeed_tensors_fini(&tens);
    return rc;
}

int ifd_outfeed_start(ifd_outfeed **out, const ifd_outfeed_config *cfg)
{
    *out = NULL;
    ifd_outfeed *o = calloc(1, sizeof *o);
    if (o == NULL)
        return IFD_ENOMEM;
    o->cfg = *cfg;
    o->win_notes.cap = SKIP_NOTES;
    o->run_notes.cap = SKIP_RUN_NOTES;
    o->skip_log = (ifd_log_limit)IFD_LOG_LIMIT_INIT(5, 10 * 1000000000LL);
    o->replicas = ifd_device_replicas(cfg->dev);
    o->last_step = ifd_device_global_step(cfg->dev);
    o->recs = calloc((size_t)o->replicas, sizeof *o->recs);
    o->cat = calloc((size_t)o->replicas * IFD_OUT_NTENSORS, sizeof *o->cat);
    int rc = IFD_ENOMEM;
    if (o->recs == NULL || o->cat == NULL)
        goto fail;
    if (cfg->mode == IFD_MODE_PREDICT) {
        rc = ifd_prediction_call_init(&o->pred, cfg->program, cfg->max_batch_rows);
        if (rc)
            goto fail;
        for (int i = 0; i < cfg->npred_sinks && i < IFD_MAX_PREDICTION_SINKS; i++)
            o->pred.sinks[o->pred.nsinks++] = cfg->pred_sinks[i];
    } else {
        rc = ifd_outfeed_tensors_init(&o->tens, cfg->program, cfg->mode, o->replicas,
                                      cfg->dev->cfg.max_shard_rows, cfg->hosts);
        if (rc)
            goto fail;
        ifd_error err; /* the session checked them (ifd_outfeed_host_calls_check) */
        rc = ifd_reducer_set_init(&o->calls, &o->tens, cfg->host_calls, cfg->nhost_calls, &err);
        ifd_host_call_info info = plugin_info(cfg->program, cfg->mode, o->replicas, cfg->hosts);
        if (rc == IFD_OK)
            rc = ifd_plugin_calls_init(&o->plugins, &o->tens, &info, &err);
        if (rc) {
            IFD_LOG_ERROR("outfeed: %s", err.msg);
            goto fail;
        }
    }
    rc = ifd_opq_start(&o->opq, "ifd-outfeed", outfeed_main, o, 0);
    if (rc)
        goto fail;
    *out = o;
    return IFD_OK;

fail:
    ifd_prediction_call_fini(&o->pred);
    ifd_plugin_calls_fini(&o->plugins);
    ifd_reducer_set_fini(&o->calls);
    ifd_outfeed_tensors_fini(&o->tens);
    free(o->cat);
    free(o->recs);
    free(o);
    return rc;
}

int ifd_outfeed_signal(ifd_outfeed *o, int64_t n)
{
    return ifd_opq_signal(o->opq, n);
}

void ifd_outfeed_stop(ifd_outfeed *o)
{
    if (o) {
        ifd_opq_join(o->opq);
        ifd_rendezvous_record_done(o->cfg.rv, SOURCE);
    }
}

int ifd_outfeed_flush(ifd_outfeed *o, ifd_error *err)
{
    return emit_window(o, err);
}

int64_t ifd_outfeed_skipped(const ifd_outfeed *o)
{
    return o ? o->skipped_total : 0;
}

void ifd_outfeed_destroy(ifd_outfeed *o)
{
    if (o == NULL)
        return;
    ifd_opq_destroy(o->opq);
    ifd_prediction_call_fini(&o->pred);
    ifd_plugin_calls_fini(&o->plugins);
    ifd_reducer_set_fini(&o->calls);
    ifd_outfeed_tensors_fini(&o->tens);
    free(o->cat);
    free(o->recs);
    free(o);
}
