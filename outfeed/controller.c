#include "core/log.h"
#include "core/opqueue.h"
#include "core/thread.h"
#include "infeed/hosts.h"
#include "outfeed/outfeed_internal.h"

#include <stdlib.h>
#include <time.h>

#define SOURCE "outfeed"

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
    int64_t steps_done;       /* steps this run */
    int64_t loop_n;           /* the length of the loop whose records come now */
    int64_t window_loop_n;    /* the length of the loop of the window's last step */
};

/* part / whole, clamped to [0, 1]. */
static double fraction(double part, double whole)
{
    if (whole <= 0.0)
        return 0.0;
    double f = part / whole;
    return f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
}

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
    double mine[5] = {(double)m->steps, m->loss_sum, m->loss_weighted, m->correct, m->count};
    double *all = calloc((size_t)h->size * 5, sizeof(double));
    if (all == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "summaries of %d hosts", h->size);
    int rc = h->ops->allgather(h->ctx, IFD_HOSTS_OUTFEED, mine, all, sizeof mine,
                               rendezvous_stopping, o->cfg.rv, err);
    if (rc == IFD_OK) {
        *m = (ifd_metrics){0};
        for (int k = 0; k < h->size; k++) {
            const double *v = all + (size_t)k * 5;
            if ((int64_t)v[0] > m->steps)
                m->steps = (int64_t)v[0];
            m->loss_sum += v[1];
            m->loss_weighted += v[2];
            m->correct += v[3];
            m->count += v[4];
        }
    }
    free(all);
    return rc;
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
     * steps, weighted by rows, divided once; predict: no loss */
    if (o->cfg.mode == IFD_MODE_TRAIN)
        json_object_set_new(j, "loss", json_real(m->loss_sum / (double)m->steps));
    else if (o->cfg.mode == IFD_MODE_EVAL)
        json_object_set_new(j, "loss", json_real(m->count > 0 ? m->loss_weighted / m->count : 0.0));
    if (o->cfg.program->classifier && o->cfg.mode != IFD_MODE_PREDICT)
        json_object_set_new(j, "accuracy", json_real(m->count > 0 ? m->correct / m->count : 0.0));
    json_object_set_new(j, "examples", json_integer((json_int_t)m->count));
    json_object_set_new(j, "examples_per_sec", json_real(secs > 0 ? m->count / secs : 0.0));
    json_object_set_new(j, "steps_per_sec", json_real(secs > 0 ? (double)m->steps / secs : 0.0));
    json_object_set_new(j, "infeed_wait_fraction",
                        json_real(fraction(w->infeed_wait_ns, w->step_ns)));
    json_object_set_new(j, "outfeed_wait_fraction",
                        json_real(fraction(w->outfeed_wait_ns, w->step_ns)));
    json_object_set_new(j, "time", json_real(wall_seconds()));
    int rc = ifd_summary_emit(o->cfg.writer, j, err);
    o->window = (ifd_metrics){0};
    o->time = (window_time){.start_ns = w->end_ns, .end_ns = w->end_ns};
    return rc;
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
        ifd_outfeed_concat(o->recs, n, o->cat, t);
        if (n < o->replicas && o->cfg.mode == IFD_MODE_TRAIN)
            o->cat[IFD_OUT_LOSS] *= (float)o->replicas;
        rc = ifd_metrics_host_call(&o->window, t, err);
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
                return;
            }
            if (rc) {
                ifd_rendezvous_record_error(o->cfg.rv, SOURCE, &err);
                return;
            }
        }
    }
}

int ifd_outfeed_start(ifd_outfeed **out, const ifd_outfeed_config *cfg)
{
    *out = NULL;
    ifd_outfeed *o = calloc(1, sizeof *o);
    if (o == NULL)
        return IFD_ENOMEM;
    o->cfg = *cfg;
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
    }
    rc = ifd_opq_start(&o->opq, "ifd-outfeed", outfeed_main, o, 0);
    if (rc)
        goto fail;
    *out = o;
    return IFD_OK;

fail:
    ifd_prediction_call_fini(&o->pred);
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

void ifd_outfeed_destroy(ifd_outfeed *o)
{
    if (o == NULL)
        return;
    ifd_opq_destroy(o->opq);
    ifd_prediction_call_fini(&o->pred);
    free(o->cat);
    free(o->recs);
    free(o);
}
