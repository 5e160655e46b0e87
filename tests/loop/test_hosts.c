/*
 * Several hosts in one process (docs/multihost.md): H sessions on threads, joined by an
 * in-process ifd_hosts (a rendezvous per channel), each fed its rows of every global batch.
 * Against one session with H x R replicas on the same global batches: bit-identical parameters
 * on every host and the same per-step losses; a host whose input ends stops every host at the
 * same step; a host asked to stop stops every host at the same loop boundary.
 */
#include <infeed/hosts.h>
#include "tests/util/testutil.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_HOSTS 4

/* ---- an in-process job: every collective is a two-phase rendezvous of H threads ---------- */

typedef struct fake_chan {
    int arrived, departed;
    int64_t gen;
    unsigned char *data; /* [H][bytes] */
} fake_chan;

typedef struct fake_job {
    int H;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fake_chan ch[IFD_HOSTS_NCHANNELS];
    struct fake_host {
        struct fake_job *job;
        int rank;
    } host[MAX_HOSTS];
    ifd_hosts hosts[MAX_HOSTS];
} fake_job;

static void wait_10ms(fake_job *j)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10 * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

static int fake_allgather(void *ctx, int channel, const void *send, void *recv, size_t bytes,
                          ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    struct fake_host *me = ctx;
    fake_job *j = me->job;
    fake_chan *c = &j->ch[channel];
    pthread_mutex_lock(&j->mu);
    while (c->departed > 0) /* the previous call is still being read */
        wait_10ms(j);
    if (c->arrived == 0) {
        free(c->data);
        c->data = malloc(bytes * (size_t)j->H);
    }
    memcpy(c->data + bytes * (size_t)me->rank, send, bytes);
    int64_t gen = c->gen;
    if (++c->arrived == j->H) {
        c->gen++;
        c->departed = j->H;
        c->arrived = 0;
        pthread_cond_broadcast(&j->cv);
    }
    while (c->gen == gen) {
        if (stop && stop(stop_arg)) {
            pthread_mutex_unlock(&j->mu);
            return ifd_error_set(err, IFD_ESTOPPED, "stopped waiting for the other hosts");
        }
        wait_10ms(j);
    }
    memcpy(recv, c->data, bytes * (size_t)j->H);
    if (--c->departed == 0)
        pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return IFD_OK;
}

static int fake_allreduce_i64(void *ctx, int channel, int64_t *vals, int n, ifd_hosts_op op,
                              ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    struct fake_host *me = ctx;
    int H = me->job->H;
    int64_t *all = malloc(sizeof(int64_t) * (size_t)(n * H));
    int rc =
        fake_allgather(ctx, channel, vals, all, sizeof(int64_t) * (size_t)n, stop, stop_arg, err);
    if (rc == IFD_OK)
        for (int i = 0; i < n; i++) {
            int64_t v = all[i];
            for (int k = 1; k < H; k++) {
                int64_t w = all[k * n + i];
                v = op == IFD_HOSTS_MIN   ? (w < v ? w : v)
                    : op == IFD_HOSTS_MAX ? (w > v ? w : v)
                                          : v + w;
            }
            vals[i] = v;
        }
    free(all);
    return rc;
}

static const ifd_hosts_ops fake_ops = {.allgather = fake_allgather,
                                       .allreduce_i64 = fake_allreduce_i64};

static void fake_job_init(fake_job *j, int H)
{
    memset(j, 0, sizeof *j);
    j->H = H;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    for (int h = 0; h < H; h++) {
        j->host[h] = (struct fake_host){j, h};
        j->hosts[h] = (ifd_hosts){.ops = &fake_ops, .ctx = &j->host[h], .rank = h, .size = H};
    }
}

static void fake_job_fini(fake_job *j)
{
    for (int c = 0; c < IFD_HOSTS_NCHANNELS; c++)
        free(j->ch[c].data);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
}

/* ---- H sessions on threads ---------------------------------------------------------------- */

/* Rows [h * rows, (h + 1) * rows) of a global batch, as a batch of its own. */
static tu_batch *host_rows(const tu_batch *g, int h, int64_t rows)
{
    tu_batch *tb = tu_batch_clone(g);
    for (int i = 0; i < g->b.ntensors; i++) {
        size_t rb = ifd_tensor_row_bytes(&g->b.tensors[i]);
        memcpy(tb->data[i], (const char *)g->data[i] + rb * (size_t)(h * rows), rb * (size_t)rows);
        tb->b.tensors[i].shape.dims[0] = rows;
    }
    tb->b.rows = rows;
    return tb;
}

typedef struct host_run {
    pthread_t t;
    ifd_config cfg;
    tu_batch **batches; /* this host's, owned until pushed */
    int64_t n;
    int stopper; /* ifd_session_request_stop once the run is past its first step */
    /* stopper with stall_at >= 0: once the hosts in idle[] all wait for input at global step
     * stall_at instead (their sessions, atomically set, in sessions[]) */
    int64_t stall_at;
    struct host_run *all;
    int H;
    int keep_open;           /* the input stays open after the host's batches */
    int close_on_stop;       /* the embedding program's part (infeedd's, after its grace): the input
                                is closed once the session says a stop was asked, here or elsewhere */
    int stop_seen;           /* close_on_stop: the host ifd_session_stop_requested named */
    tu_loops *loops;         /* when not NULL, every loop of the host's run is recorded here */
    ifd_tensor_sink tensors; /* added to the session when its write is set */
    ifd_session *s;          /* atomic */
    int done;                /* atomic: the run returned */
    tu_result res;
} host_run;

static ifd_session *session_of(host_run *hr)
{
    return __atomic_load_n(&hr->s, __ATOMIC_ACQUIRE);
}

/* Whether every host but the stopper waits for input at global step hr->stall_at. */
static int stalled(host_run *hr)
{
    for (int h = 0; h < hr->H; h++) {
        ifd_session *s = session_of(&hr->all[h]);
        if (s == NULL || ifd_session_global_step(s) != hr->stall_at)
            return 0;
        if (&hr->all[h] != hr && !ifd_session_infeed_waiting(s, NULL, NULL))
            return 0;
    }
    return 1;
}

static void *stopper_main(void *arg)
{
    host_run *hr = arg;
    struct timespec ms = {0, 1000000L};
    while (hr->stall_at < 0 ? ifd_session_global_step(hr->s) < 1 : !stalled(hr))
        nanosleep(&ms, NULL);
    ifd_session_request_stop(hr->s);
    return NULL;
}

typedef struct closer {
    host_run *hr;
    ifd_batch_queue *q;
} closer;

static void *closer_main(void *arg)
{
    closer *c = arg;
    struct timespec ms = {0, 1000000L};
    int who = -1;
    while (!__atomic_load_n(&c->hr->done, __ATOMIC_ACQUIRE) &&
           !ifd_session_stop_requested(c->hr->s, &who))
        nanosleep(&ms, NULL);
    c->hr->stop_seen = who;
    ifd_batch_queue_close(c->q);
    return NULL;
}

static void *host_main(void *arg)
{
    host_run *hr = arg;
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 4), IFD_OK);
    ifd_sink *sink;
    ifd_hook rec;
    if (hr->loops)
        rec = tu_loops_hook(hr->loops);
    ifd_session *s = tu_session_create(&hr->cfg, ifd_batch_queue_source(q), NULL, &rec,
                                       hr->loops ? 1 : 0, &sink, &hr->res);
    if (hr->tensors.write)
        ck_assert_int_eq(ifd_session_add_tensor_sink(s, &hr->tensors), IFD_OK);
    tu_producer *p = tu_producer_start(q, hr->batches, hr->n, hr->keep_open);
    __atomic_store_n(&hr->s, s, __ATOMIC_RELEASE);
    pthread_t st, ct;
    closer c = {hr, q};
    if (hr->stopper)
        ck_assert_int_eq(pthread_create(&st, NULL, stopper_main, hr), 0);
    if (hr->close_on_stop)
        ck_assert_int_eq(pthread_create(&ct, NULL, closer_main, &c), 0);
    hr->res.rc = ifd_session_run(s, &hr->res.err);
    __atomic_store_n(&hr->done, 1, __ATOMIC_RELEASE);
    if (hr->stopper)
        pthread_join(st, NULL);
    if (hr->close_on_stop)
        pthread_join(ct, NULL);
    ifd_batch_queue_close(q);
    tu_producer_join(p);
    tu_result_collect(&hr->res, s, hr->cfg.replicas, sink);
    ifd_batch_queue_destroy(q);
    return NULL;
}

/* The rest of run_hosts' options: input left open, closed on a stop; the stopper's stall. */
typedef struct hosts_opts {
    int stopper;      /* the host whose session is asked to stop, -1: none */
    int64_t stall_at; /* see host_run; -1: once past the first step */
    int keep_open, close_on_stop;
    tu_loops *loops;                /* NULL, or one a host: their loops */
    const ifd_tensor_sink *tensors; /* NULL, or one a host */
} hosts_opts;

/* Runs cfg (the global batch, R replicas a host) on H hosts, host h fed its rows of
 * batches[0..nper[h]). hr[h].res holds each host's result. */
static void run_hosts_with(const ifd_config *cfg, int H, tu_batch **batches, const int64_t *nper,
                           const hosts_opts *o, host_run *hr)
{
    fake_job job;
    fake_job_init(&job, H);
    int64_t rows = cfg->batch_size / H;
    for (int h = 0; h < H; h++) {
        memset(&hr[h], 0, sizeof hr[h]);
        hr[h].all = hr;
        hr[h].H = H;
        hr[h].stall_at = o->stall_at;
        hr[h].keep_open = o->keep_open;
        hr[h].close_on_stop = o->close_on_stop;
        hr[h].loops = o->loops ? &o->loops[h] : NULL;
        if (o->tensors)
            hr[h].tensors = o->tensors[h];
        hr[h].cfg = *cfg;
        hr[h].cfg.batch_size = rows;
        hr[h].cfg.hosts = &job.hosts[h];
        hr[h].n = nper[h];
        hr[h].batches = calloc((size_t)nper[h] + 1, sizeof(tu_batch *));
        for (int64_t i = 0; i < nper[h]; i++)
            hr[h].batches[i] = host_rows(batches[i], h, rows);
        hr[h].stopper = h == o->stopper;
    }
    for (int h = 0; h < H; h++)
        ck_assert_int_eq(pthread_create(&hr[h].t, NULL, host_main, &hr[h]), 0);
    for (int h = 0; h < H; h++) {
        pthread_join(hr[h].t, NULL);
        free(hr[h].batches);
    }
    fake_job_fini(&job);
}

static void run_hosts(const ifd_config *cfg, int H, tu_batch **batches, const int64_t *nper,
                      int stopper, host_run *hr)
{
    hosts_opts o = {.stopper = stopper, .stall_at = -1};
    run_hosts_with(cfg, H, batches, nper, &o, hr);
}

/* The reference: cfg on one host with `replicas` replicas over the same global batches. */
static void run_one_host(const ifd_config *cfg, int replicas, tu_batch **batches, int64_t n,
                         tu_result *ref)
{
    ifd_config one = *cfg;
    one.replicas = replicas;
    tu_run(&one, batches, n, ref);
    RASSERT(ref->rc == IFD_OK, "one host: %s", ifd_error_text(&ref->err));
}

/* The "loss" of every train summary, in order. */
static int train_losses(const tu_result *r, double *out, int max)
{
    int n = 0;
    for (size_t i = 0; i < r->nsummaries; i++) {
        json_t *j = json_loads(r->summaries[i], 0, NULL);
        ck_assert_ptr_nonnull(j);
        if (strcmp(json_string_value(json_object_get(j, "event")), "train") == 0 && n < max)
            out[n++] = json_real_value(json_object_get(j, "loss"));
        json_decref(j);
    }
    return n;
}

/* A summary line's integer field "host" (-1 when it has none). */
static int64_t summary_host(const char *line)
{
    json_t *j = json_loads(line, 0, NULL);
    json_t *h = json_object_get(j, "host");
    int64_t v = h ? json_integer_value(h) : -1;
    json_decref(j);
    return v;
}

static const char *const programs[] = {"softmax", "linear", "mlp"};

START_TEST(hosts_match_one_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    int H = (int)rand_between(&rng, 2, 3), R = (int)rand_between(&rng, 1, 3);
    const char *prog = programs[rand_between(&rng, 0, 2)];
    ifd_optimizer_kind opt = (ifd_optimizer_kind)rand_between(&rng, 0, 2);
    int64_t b = H * R * rand_between(&rng, 1, 4), ipl = rand_between(&rng, 1, 7);
    ifd_config cfg;
    tu_config_train(&cfg, prog, opt, rand_between(&rng, 1, 9), rand_between(&rng, 2, 5), b, ipl,
                    ifd_rng_next(&rng));
    cfg.loss_reduction = rand_between(&rng, 0, 1) ? IFD_REDUCE_SUM : IFD_REDUCE_MEAN;
    if (strcmp(prog, "mlp") == 0)
        cfg.settings.hidden = rand_between(&rng, 1, 8);
    int64_t steps = cfg.steps, n = steps + 2;
    tu_batch **batches = tu_batches_random(&cfg, n, ifd_rng_next(&rng));

    tu_result ref;
    run_one_host(&cfg, H * R, batches, n, &ref);

    cfg.replicas = R;
    host_run hr[MAX_HOSTS];
    int64_t nper[MAX_HOSTS] = {n, n, n, n};
    run_hosts(&cfg, H, batches, nper, -1, hr);
    double want[64], got[64];
    int nw = train_losses(&ref, want, 64);
    RASSERT(nw == steps, "%d train summaries, expected %lld", nw, (long long)steps);
    for (int h = 0; h < H; h++) {
        tu_result *r = &hr[h].res;
        RASSERT(r->rc == IFD_OK, "%s on %d hosts x %d: host %d: %s", prog, H, R, h,
                ifd_error_text(&r->err));
        RASSERT(r->global_step == steps && r->reason == IFD_END_LAST_STEP,
                "host %d: step %lld reason %d", h, (long long)r->global_step, (int)r->reason);
        RASSERT(r->mirrors_identical, "host %d: replicas differ", h);
        RASSERT(memcmp(r->params, ref.params, sizeof(float) * (size_t)ref.nparams) == 0,
                "%s %s %s on %d hosts x %d replicas: host %d's parameters differ from one host "
                "with %d replicas (max rel %g)",
                prog, ifd_optimizer_name(opt), ifd_loss_reduction_name(cfg.loss_reduction), H, R, h,
                H * R, tu_max_rel_diff(r->params, ref.params, ref.nparams, 1e-6));
        int ng = train_losses(r, got, 64);
        RASSERT(ng == nw, "host %d: %d train summaries, one host %d", h, ng, nw);
        for (int i = 0; i < ng; i++)
            RASSERT(fabs(got[i] - want[i]) <= 1e-5 * fabs(want[i]) + 1e-12,
                    "host %d step %d: loss %.9g, one host %.9g", h, i + 1, got[i], want[i]);
        for (size_t i = 0; i < r->nsummaries; i++)
            RASSERT(summary_host(r->summaries[i]) == h, "host %d's summary: %s", h,
                    r->summaries[i]);
        tu_result_free(r);
    }
    tu_result_free(&ref);
    tu_batches_free(batches, n);
}
END_TEST

/* What a host's tensor sink saw: each step's "label" and "count" tensors. */
#define SEEN_STEPS 16
typedef struct seen_tensors {
    int64_t steps;
    int64_t rows[SEEN_STEPS], counts[SEEN_STEPS];
    int32_t labels[SEEN_STEPS][64];
    int bad; /* a step past SEEN_STEPS, a tensor missing or too large */
} seen_tensors;

static int seen_write(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    (void)err;
    seen_tensors *s = ctx;
    const ifd_tensor *label = NULL, *count = NULL;
    for (int i = 0; i < t->ntensors; i++) {
        if (strcmp(t->names[i], "label") == 0)
            label = &t->tensors[i];
        if (strcmp(t->names[i], "count") == 0)
            count = &t->tensors[i];
    }
    int64_t k = s->steps++;
    if (k >= SEEN_STEPS || label == NULL || count == NULL || label->shape.dims[0] > 64) {
        s->bad = 1;
        return IFD_OK;
    }
    s->rows[k] = label->shape.dims[0];
    s->counts[k] = count->shape.dims[0];
    memcpy(s->labels[k], label->data, sizeof(int32_t) * (size_t)s->rows[k]);
    return IFD_OK;
}

/* The step's outfeed tensors are concatenated over the replicas, then the hosts in rank order:
 * every host's "label" of each step is the global batch's labels, in order. */
START_TEST(outfeed_tensors_cross_hosts_in_rank_order)
{
    ifd_rng rng;
    seed_rng(&rng);
    int H = (int)rand_between(&rng, 2, 3), R = (int)rand_between(&rng, 1, 3);
    int64_t b = H * R * rand_between(&rng, 1, 4);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, rand_between(&rng, 1, 5),
                    rand_between(&rng, 2, 5), b, rand_between(&rng, 1, 4), ifd_rng_next(&rng));
    cfg.steps = rand_between(&rng, 1, SEEN_STEPS);
    cfg.mode = rand_between(&rng, 0, 1) ? IFD_MODE_EVAL : IFD_MODE_TRAIN;
    cfg.replicas = R;
    tu_batch **batches = tu_batches_random(&cfg, cfg.steps, ifd_rng_next(&rng));
    static seen_tensors seen[MAX_HOSTS];
    memset(seen, 0, sizeof seen);
    ifd_tensor_sink sinks[MAX_HOSTS];
    for (int h = 0; h < H; h++)
        sinks[h] = (ifd_tensor_sink){.write = seen_write, .ctx = &seen[h]};
    host_run hr[MAX_HOSTS];
    int64_t nper[MAX_HOSTS] = {cfg.steps, cfg.steps, cfg.steps, cfg.steps};
    hosts_opts o = {.stopper = -1, .stall_at = -1, .tensors = sinks};
    run_hosts_with(&cfg, H, batches, nper, &o, hr);
    for (int h = 0; h < H; h++) {
        RASSERT(hr[h].res.rc == IFD_OK, "host %d: %s", h, ifd_error_text(&hr[h].res.err));
        RASSERT(!seen[h].bad && seen[h].steps == cfg.steps, "host %d saw %lld steps of %lld", h,
                (long long)seen[h].steps, (long long)cfg.steps);
        for (int64_t k = 0; k < cfg.steps; k++) {
            RASSERT(seen[h].rows[k] == b && seen[h].counts[k] == H * R,
                    "%s, %d hosts x %d: host %d step %lld: %lld rows, %lld counts",
                    ifd_mode_name(cfg.mode), H, R, h, (long long)k, (long long)seen[h].rows[k],
                    (long long)seen[h].counts[k]);
            const int32_t *y = batches[k]->data[1];
            for (int64_t j = 0; j < b; j++)
                RASSERT(seen[h].labels[k][j] == y[j],
                        "%s, %d hosts x %d: host %d step %lld row %lld: label %d, the global "
                        "batch has %d",
                        ifd_mode_name(cfg.mode), H, R, h, (long long)k, (long long)j,
                        seen[h].labels[k][j], y[j]);
        }
        tu_result_free(&hr[h].res);
    }
    tu_batches_free(batches, cfg.steps);
}
END_TEST

START_TEST(input_ending_on_one_host_stops_all)
{
    ifd_rng rng;
    seed_rng(&rng);
    int H = (int)rand_between(&rng, 2, 4), R = (int)rand_between(&rng, 1, 2);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, H * R * 2, rand_between(&rng, 1, 6),
                    ifd_rng_next(&rng));
    cfg.steps = 1000;
    int64_t n = 40;
    tu_batch **batches = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    int short_host = (int)rand_between(&rng, 0, H - 1);
    int64_t ended = rand_between(&rng, 0, 30);
    int64_t nper[MAX_HOSTS];
    for (int h = 0; h < H; h++)
        nper[h] = h == short_host ? ended : n;
    cfg.replicas = R;
    host_run hr[MAX_HOSTS];
    run_hosts(&cfg, H, batches, nper, -1, hr);
    for (int h = 0; h < H; h++) {
        tu_result *r = &hr[h].res;
        RASSERT(r->rc == IFD_OK, "host %d: %s", h, ifd_error_text(&r->err));
        RASSERT(r->reason == IFD_END_INPUT_ENDED && r->global_step == ended,
                "host %d of %d: reason %d at step %lld; host %d's input ended after %lld", h, H,
                (int)r->reason, (long long)r->global_step, short_host, (long long)ended);
        tu_result_free(r);
    }
    tu_batches_free(batches, n);
}
END_TEST

START_TEST(stop_on_one_host_stops_all_at_a_loop_boundary)
{
    ifd_rng rng;
    seed_rng(&rng);
    int H = (int)rand_between(&rng, 2, 3);
    int64_t ipl = rand_between(&rng, 1, 5);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, H * 2, ipl, ifd_rng_next(&rng));
    cfg.steps = 1000000;
    int64_t n = 4000;
    tu_batch **batches = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    int stopper = (int)rand_between(&rng, 0, H - 1);
    int64_t nper[MAX_HOSTS] = {n, n, n, n};
    host_run hr[MAX_HOSTS];
    run_hosts(&cfg, H, batches, nper, stopper, hr);
    for (int h = 0; h < H; h++) {
        tu_result *r = &hr[h].res;
        RASSERT(r->rc == IFD_OK, "host %d: %s", h, ifd_error_text(&r->err));
        RASSERT(r->reason == IFD_END_STOPPED, "host %d: reason %d", h, (int)r->reason);
        RASSERT(r->global_step == hr[0].res.global_step, "host %d stopped at %lld, host 0 at %lld",
                h, (long long)r->global_step, (long long)hr[0].res.global_step);
        RASSERT(r->global_step % ipl == 0 && r->global_step < n,
                "host %d stopped at %lld, inside a loop of %lld", h, (long long)r->global_step,
                (long long)ipl);
    }
    for (int h = 0; h < H; h++)
        tu_result_free(&hr[h].res);
    tu_batches_free(batches, n);
}
END_TEST

/* Loop lengths the session picks (loop_kind auto, seconds): each host measures its own loops, and
 * the hosts run the least length any proposes (the loop collective's MIN), so every host runs the
 * same loops, to the last step, with the parameters of one host over the same global batches. */
START_TEST(hosts_agree_on_automatic_lengths)
{
    ifd_rng rng;
    seed_rng(&rng);
    int H = (int)rand_between(&rng, 2, 3), R = (int)rand_between(&rng, 1, 2);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", (ifd_optimizer_kind)rand_between(&rng, 0, 2),
                    rand_between(&rng, 1, 6), rand_between(&rng, 2, 4), H * R, 1,
                    ifd_rng_next(&rng));
    int secs = (int)rand_between(&rng, 0, 1);
    cfg.loop_kind = secs ? IFD_LOOP_SECONDS : IFD_LOOP_AUTO;
    cfg.loop_secs = (double)rand_between(&rng, 1, 10) / 1000.0;
    cfg.max_loop_seconds = (double)rand_between(&rng, 1, 100) / 1000.0;
    cfg.summary_every = 0;
    int64_t steps = rand_between(&rng, 1, 600);
    cfg.steps = steps;
    tu_batch **batches = tu_batches_random(&cfg, steps, ifd_rng_next(&rng));
    tu_result ref;
    run_one_host(&cfg, H * R, batches, steps, &ref);

    cfg.replicas = R;
    tu_loops *loops = calloc((size_t)H, sizeof *loops);
    hosts_opts o = {.stopper = -1, .stall_at = -1, .loops = loops};
    int64_t nper[MAX_HOSTS] = {steps, steps, steps, steps};
    host_run hr[MAX_HOSTS];
    run_hosts_with(&cfg, H, batches, nper, &o, hr);
    for (int h = 0; h < H; h++) {
        tu_result *r = &hr[h].res;
        RASSERT(r->rc == IFD_OK && r->global_step == steps && r->reason == IFD_END_LAST_STEP,
                "host %d: %s (step %lld)", h, ifd_error_text(&r->err), (long long)r->global_step);
        RASSERT(loops[h].n == loops[0].n, "host %d ran %d loops, host 0 %d", h, loops[h].n,
                loops[0].n);
        for (int i = 0; i < loops[h].n; i++)
            RASSERT(loops[h].start[i] == loops[0].start[i] && loops[h].len[i] == loops[0].len[i],
                    "%s: loop %d: host %d ran %lld steps from %lld, host 0 %lld from %lld",
                    secs ? "seconds" : "auto", i, h, (long long)loops[h].len[i],
                    (long long)loops[h].start[i], (long long)loops[0].len[i],
                    (long long)loops[0].start[i]);
        RASSERT(memcmp(r->params, ref.params, sizeof(float) * (size_t)ref.nparams) == 0,
                "host %d's parameters differ from one host's", h);
        tu_result_free(r);
    }
    free(loops);
    tu_result_free(&ref);
    tu_batches_free(batches, steps);
}
END_TEST

/* The stop relay (loop/stop_relay.h): a stop asked on one host while the others' loops wait for
 * input inside a loop (their input open and empty: a producer gone quiet) reaches them, and the
 * embedding program (here a thread standing for infeedd's grace) closes their input: every host
 * then ends at the same step, "stopped", knowing which host asked. Without the relay the idle
 * hosts never learn of the stop and the run never ends. */
START_TEST(stop_reaches_hosts_whose_loop_waits_for_input)
{
    ifd_rng rng;
    seed_rng(&rng);
    int H = (int)rand_between(&rng, 2, 3), R = (int)rand_between(&rng, 1, 2);
    int64_t given = rand_between(&rng, 0, 5), ipl = rand_between(&rng, given + 1, given + 6);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, H * R * 2, ipl, ifd_rng_next(&rng));
    cfg.steps = 1000000;
    cfg.replicas = R;
    int64_t n = 200;
    tu_batch **batches = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    int stopper = (int)rand_between(&rng, 0, H - 1);
    int64_t nper[MAX_HOSTS];
    for (int h = 0; h < H; h++)
        nper[h] = h == stopper ? n : given; /* the others go quiet after `given` batches */
    hosts_opts o = {.stopper = stopper, .stall_at = given, .keep_open = 1, .close_on_stop = 1};
    host_run hr[MAX_HOSTS];
    run_hosts_with(&cfg, H, batches, nper, &o, hr);
    for (int h = 0; h < H; h++) {
        tu_result *r = &hr[h].res;
        RASSERT(r->rc == IFD_OK, "host %d: %s", h, ifd_error_text(&r->err));
        RASSERT(r->reason == IFD_END_STOPPED && r->global_step == given,
                "host %d of %d: reason %d at step %lld; host %d was asked to stop while the "
                "others waited for input at step %lld",
                h, H, (int)r->reason, (long long)r->global_step, stopper, (long long)given);
        RASSERT(hr[h].stop_seen == stopper, "host %d: the stop was asked on host %d, it says %d", h,
                stopper, hr[h].stop_seen);
        tu_result_free(r);
    }
    tu_batches_free(batches, n);
}
END_TEST

/* Random global batches with NaN in rows that belong to one host: every host skips those steps
 * (the verdict rides in the all-reduce), every host ends with the bits of one host with H x R
 * replicas on the same batches, and each host's summaries count the skipped steps. */
START_TEST(a_nonfinite_step_is_skipped_on_every_host)
{
    ifd_rng rng;
    seed_rng(&rng);
    int H = (int)rand_between(&rng, 2, 3), R = (int)rand_between(&rng, 1, 2);
    ifd_config cfg;
    tu_config_train(&cfg, programs[rand_between(&rng, 0, 1)],
                    (ifd_optimizer_kind)rand_between(&rng, 0, 2), rand_between(&rng, 1, 6),
                    rand_between(&rng, 2, 4), H * R * rand_between(&rng, 1, 3),
                    rand_between(&rng, 1, 5), ifd_rng_next(&rng));
    int64_t n = cfg.steps, bad = 0;
    cfg.max_skipped_steps = 0;
    tu_batch **batches = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    int64_t rows = cfg.batch_size / H, cols = cfg.settings.features;
    for (int64_t i = 0; i < n; i++)
        if (rand_between(&rng, 0, 3) == 0) {
            int64_t row = rand_between(&rng, 0, H - 1) * rows + rand_between(&rng, 0, rows - 1);
            ((float *)batches[i]->data[0])[row * cols] = NAN;
            bad++;
        }
    tu_result ref;
    run_one_host(&cfg, H * R, batches, n, &ref);
    cfg.replicas = R;
    host_run hr[MAX_HOSTS];
    int64_t nper[MAX_HOSTS] = {n, n, n, n};
    run_hosts(&cfg, H, batches, nper, -1, hr);
    for (int h = 0; h < H; h++) {
        tu_result *r = &hr[h].res;
        RASSERT(r->rc == IFD_OK && r->global_step == n, "host %d: step %lld: %s", h,
                (long long)r->global_step, ifd_error_text(&r->err));
        RASSERT(memcmp(r->params, ref.params, sizeof(float) * (size_t)ref.nparams) == 0,
                "host %d's parameters differ from one host's, %lld of %lld steps poisoned", h,
                (long long)bad, (long long)n);
        json_t *end = json_loads(r->summaries[r->nsummaries - 1], 0, NULL);
        RASSERT(json_integer_value(json_object_get(end, "skipped_steps")) == bad,
                "host %d: %s, expected %lld skipped", h, r->summaries[r->nsummaries - 1],
                (long long)bad);
        json_decref(end);
        tu_result_free(r);
    }
    tu_result_free(&ref);
    tu_batches_free(batches, n);
}
END_TEST

static int fake_broadcast(void *ctx, int channel, void *buf, size_t bytes, int root,
                          ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    (void)ctx, (void)channel, (void)buf, (void)bytes, (void)root, (void)stop, (void)stop_arg;
    (void)err;
    return IFD_OK;
}

/* The cuda backend over hosts needs the broadcast (rank 0's ncclUniqueId); the cpu one does not. */
START_TEST(cuda_needs_the_broadcast)
{
    ifd_rng rng;
    seed_rng(&rng);
    int H = (int)rand_between(&rng, 2, 5);
    ifd_hosts_ops with = fake_ops;
    with.broadcast = fake_broadcast;
    ifd_hosts h = {
        .ops = &fake_ops, .ctx = NULL, .rank = (int)rand_between(&rng, 0, H - 1), .size = H};
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = "softmax";
    cfg.settings.features = rand_between(&rng, 1, 9);
    cfg.settings.classes = rand_between(&rng, 2, 5);
    cfg.batch_size = 4;
    cfg.steps = 1;
    cfg.hosts = &h;
    ifd_error err;
    RASSERT(ifd_config_validate(&cfg, &err) == IFD_OK, "cpu on %d hosts: %s", H, err.msg);
    cfg.backend = "cuda";
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    RASSERT(strstr(err.msg, "broadcast") && strstr(err.msg, "cuda"), "%s", err.msg);
    h.ops = &with;
    RASSERT(ifd_config_validate(&cfg, &err) == IFD_OK, "cuda with a broadcast: %s", err.msg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hosts");
    TCase *tc = tcase_create("hosts");
    tcase_add_loop_test(tc, hosts_match_one_host, 0, 16);
    tcase_add_loop_test(tc, outfeed_tensors_cross_hosts_in_rank_order, 0, 8);
    tcase_add_loop_test(tc, input_ending_on_one_host_stops_all, 0, 8);
    tcase_add_loop_test(tc, stop_on_one_host_stops_all_at_a_loop_boundary, 0, 4);
    tcase_add_loop_test(tc, stop_reaches_hosts_whose_loop_waits_for_input, 0, 6);
    tcase_add_loop_test(tc, hosts_agree_on_automatic_lengths, 0, 8);
    tcase_add_loop_test(tc, cuda_needs_the_broadcast, 0, 4);
    tcase_add_loop_test(tc, a_nonfinite_step_is_skipped_on_every_host, 0, 6);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
