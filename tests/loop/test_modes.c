/* The input modes end to end in-process: which replica trained on which rows in which order, the
 * replication invariant against per-host, the input ending inside a step, wrong row counts, and
 * which replica a per-core step is waiting for. */
#include "core/thread.h"
#include "tests/util/testutil.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_R 4
#define MAX_SEEN 4096

/* ---- a recording program: softmax that notes, per replica, the row ids it trained on ----------
 */

/* Row ids ride in column 0 of x as id / 1000 (exact enough to round back for ids < 16384). */
static int seen[MAX_R][MAX_SEEN];
static int nseen[MAX_R];

static int replica_of_thread(void)
{
    char name[32] = "";
    pthread_getname_np(pthread_self(), name, sizeof name);
    int r = -1;
    if (sscanf(name, "ifd-replica%d", &r) != 1 || r < 0 || r >= MAX_R)
        return -1;
    return r;
}

static int record_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                       ifd_error *err)
{
    int r = replica_of_thread();
    if (r < 0)
        return ifd_error_set(err, IFD_EINTERNAL, "record: not on a replica thread");
    const float *x = a->inputs[0].data;
    int64_t d = p->settings.features;
    for (int64_t i = 0; i < a->rows && nseen[r] < MAX_SEEN; i++) /* one writer per r */
        seen[r][nseen[r]++] = (int)lroundf(x[i * d] * 1000.0f);
    return tu_softmax_step(p, ops, a, err);
}

static void register_record(void)
{
    static int done;
    if (!done)
        ck_assert_int_eq(tu_register_softmax_like("record", record_step), IFD_OK);
    done = 1;
}

static void set_id(tu_batch *tb, int64_t row, int id)
{
    int64_t d = tb->b.tensors[0].shape.dims[1];
    ((float *)tb->data[0])[row * d] = (float)id / 1000.0f;
}

/* ---- running a session over batches already queued ------------------------------------------- */

/* Clones batches[0..n) into a queue (per replica in per-core mode, routed by b->replica), closes
 * it and runs cfg over it. */
static void run_queued_predict(const ifd_config *cfg, tu_batch **batches, int64_t n,
                               const ifd_prediction_sink *pred, tu_result *res)
{
    memset(res, 0, sizeof *res);
    memset(nseen, 0, sizeof nseen);
    ifd_batch_queue *q;
    size_t cap = (size_t)(n + 1);
    if (cfg->input_mode == IFD_INPUT_PER_CORE)
        ck_assert_int_eq(ifd_batch_queue_create_per_replica(&q, cap, cfg->replicas), IFD_OK);
    else
        ck_assert_int_eq(ifd_batch_queue_create(&q, cap), IFD_OK);
    for (int64_t i = 0; i < n; i++) {
        tu_batch *c = tu_batch_clone(batches[i]);
        c->released = &res->released;
        ck_assert_int_eq(ifd_batch_queue_push(q, &c->b), IFD_OK);
    }
    ifd_batch_queue_close(q);
    ifd_sink *sink;
    ifd_session *s = tu_session_create(cfg, ifd_batch_queue_source(q), pred, NULL, 0, &sink, res);
    res->rc = ifd_session_run(s, &res->err);
    tu_result_collect(res, s, cfg->replicas, sink);
    ifd_batch_queue_destroy(q);
}

static void run_queued(const ifd_config *cfg, tu_batch **batches, int64_t n, tu_result *res)
{
    run_queued_predict(cfg, batches, n, NULL, res);
}

static double summary_number(const tu_result *r, size_t i, const char *key)
{
    json_error_t je;
    json_t *j = json_loads(r->summaries[i], 0, &je);
    ck_assert_ptr_nonnull(j);
    double v = json_number_value(json_object_get(j, key));
    json_decref(j);
    return v;
}

static const ifd_input_mode modes[] = {IFD_INPUT_PER_HOST, IFD_INPUT_PER_HOST_V2,
                                       IFD_INPUT_PER_CORE, IFD_INPUT_BROADCAST};

/* ---- which replica saw which rows --------------------------------------------------------- */

/* Every batch's rows get ids; the recording program must see, on each replica, exactly the ids
 * the input mode gives it, in step order. */
START_TEST(replicas_see_their_rows)
{
    register_record();
    ifd_rng rng;
    seed_rng(&rng);
    ifd_input_mode mode = modes[_i % 4];
    int R = (int)rand_between(&rng, 1, MAX_R);
    int64_t per = rand_between(&rng, 1, 5); /* rows a replica trains on a step */
    int64_t steps = rand_between(&rng, 1, 12);
    ifd_config cfg;
    tu_config_train(&cfg, "record", IFD_OPT_SGD, rand_between(&rng, 1, 5), 3, per * R,
                    rand_between(&rng, 1, 5), 7);
    cfg.input_mode = mode;
    cfg.replicas = R;
    cfg.steps = steps;
    cfg.summary_every = 0;
    int nper = ifd_input_batches_per_step(mode, R);
    int64_t rows = ifd_input_batch_rows(mode, cfg.batch_size, R);
    int64_t n = steps * nper;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, "record", &cfg.settings, &err), IFD_OK);
    tu_batch **bs = calloc((size_t)n, sizeof *bs);
    /* expected ids, per replica in order */
    static int want[MAX_R][MAX_SEEN];
    int nwant[MAX_R] = {0};
    int id = 1;
    for (int64_t k = 0; k < n; k++) {
        bs[k] = tu_batch_random(&p, rows, k, &rng);
        bs[k]->b.replica = (int)(k % nper);
        for (int64_t j = 0; j < rows; j++)
            set_id(bs[k], j, id + (int)j);
        for (int r = 0; r < R; r++) {
            int64_t lo = 0, hi = 0; /* rows of batch k that replica r trains on */
            if (mode == IFD_INPUT_PER_HOST)
                lo = r * per, hi = lo + per;
            else if (mode == IFD_INPUT_BROADCAST)
                lo = 0, hi = rows;
            else if (k % nper == r)
                lo = 0, hi = rows;
            for (int64_t j = lo; j < hi; j++)
                want[r][nwant[r]++] = id + (int)j;
        }
        id += (int)rows;
    }
    if (mode == IFD_INPUT_PER_CORE) /* the streams interleave in a random order */
        for (int64_t k = n - 1; k > 0; k--) {
            int64_t m = rand_between(&rng, 0, k);
            tu_batch *t = bs[k];
            bs[k] = bs[m];
            bs[m] = t;
        }
    if (mode == IFD_INPUT_PER_CORE) { /* each stream's batches back in its order */
        for (int r = 0; r < R; r++) {
            tu_batch *tmp[MAX_SEEN];
            int64_t cnt = 0;
            for (int64_t k = 0; k < n; k++)
                if (bs[k]->b.replica == r)
                    tmp[cnt++] = bs[k];
            /* sort by seq */
            for (int64_t a = 0; a < cnt; a++)
                for (int64_t b = a + 1; b < cnt; b++)
                    if (tmp[b]->b.seq < tmp[a]->b.seq) {
                        tu_batch *t = tmp[a];
                        tmp[a] = tmp[b];
                        tmp[b] = t;
                    }
            int64_t c = 0;
            for (int64_t k = 0; k < n; k++)
                if (bs[k]->b.replica == r)
                    bs[k] = tmp[c++];
        }
    }
    tu_result res;
    run_queued(&cfg, bs, n, &res);
    RASSERT(res.rc == IFD_OK, "%s R=%d: %s", ifd_input_mode_name(mode), R,
            ifd_error_text(&res.err));
    RASSERT(res.global_step == steps, "%s: global step %lld, expected %lld",
            ifd_input_mode_name(mode), (long long)res.global_step, (long long)steps);
    RASSERT(res.released == n, "%s: %d of %lld batches released", ifd_input_mode_name(mode),
            res.released, (long long)n);
    for (int r = 0; r < R; r++) {
        RASSERT(nseen[r] == nwant[r], "%s R=%d rows %lld: replica %d saw %d rows, expected %d",
                ifd_input_mode_name(mode), R, (long long)rows, r, nseen[r], nwant[r]);
        for (int i = 0; i < nwant[r]; i++)
            RASSERT(seen[r][i] == want[r][i],
                    "%s R=%d rows %lld: replica %d's row %d is id %d, expected %d",
                    ifd_input_mode_name(mode), R, (long long)rows, r, i, seen[r][i], want[r][i]);
    }
    tu_result_free(&res);
    tu_batches_free(bs, n);
    ifd_program_free(&p);
}
END_TEST

/* ---- the replication invariant against per-host -----------------------------------------------
 */

/* Builds the per-host batch that a step of mode amounts to, from the step's batches. */
static tu_batch *per_host_equivalent(const ifd_program *p, tu_batch **step, int nper, int R,
                                     ifd_input_mode mode, int64_t seq, ifd_rng *rng)
{
    int64_t rows = step[0]->b.rows;
    int64_t total = rows * R;
    tu_batch *out = tu_batch_random(p, total, seq, rng);
    for (int t = 0; t < p->ninputs; t++) {
        size_t row_bytes = ifd_tensor_row_bytes(&step[0]->b.tensors[t]);
        for (int r = 0; r < R; r++) {
            tu_batch *src = step[mode == IFD_INPUT_BROADCAST ? 0 : r];
            memcpy((char *)out->data[t] + (size_t)(r * rows) * row_bytes, src->data[t],
                   (size_t)rows * row_bytes);
        }
    }
    (void)nper;
    return out;
}

START_TEST(same_params_as_per_host)
{
    static const ifd_input_mode others[] = {IFD_INPUT_PER_HOST_V2, IFD_INPUT_PER_CORE,
                                            IFD_INPUT_BROADCAST};
    static const char *const programs[] = {"linear", "softmax"};
    static const ifd_optimizer_kind opts[] = {IFD_OPT_SGD, IFD_OPT_MOMENTUM, IFD_OPT_ADAM};
    ifd_rng rng;
    seed_rng(&rng);
    ifd_input_mode mode = others[_i % 3];
    const char *program = programs[(_i / 3) % 2];
    ifd_optimizer_kind opt = opts[rand_between(&rng, 0, 2)];
    int R = (int)rand_between(&rng, 1, MAX_R);
    int64_t per = rand_between(&rng, 1, 6);
    int64_t steps = rand_between(&rng, 1, 15);
    ifd_config cfg;
    tu_config_train(&cfg, program, opt, rand_between(&rng, 1, 8), rand_between(&rng, 2, 5), per * R,
                    rand_between(&rng, 1, 6), rand_between(&rng, 1, 1000));
    cfg.replicas = R;
    cfg.steps = steps;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, program, &cfg.settings, &err), IFD_OK);
    int nper = ifd_input_batches_per_step(mode, R);
    int64_t n = steps * nper;
    tu_batch **bs = calloc((size_t)n, sizeof *bs);
    tu_batch **host = calloc((size_t)steps, sizeof *host);
    for (int64_t k = 0; k < n; k++) {
        bs[k] = tu_batch_random(&p, per, k, &rng);
        bs[k]->b.replica = (int)(k % nper);
    }
    for (int64_t s = 0; s < steps; s++)
        host[s] = per_host_equivalent(&p, &bs[s * nper], nper, R, mode, s, &rng);

    tu_result a, b;
    cfg.input_mode = mode;
    run_queued(&cfg, bs, n, &a);
    cfg.input_mode = IFD_INPUT_PER_HOST;
    run_queued(&cfg, host, steps, &b);
    RASSERT(a.rc == IFD_OK && b.rc == IFD_OK, "%s: %s / %s", ifd_input_mode_name(mode),
            ifd_error_text(&a.err), ifd_error_text(&b.err));
    RASSERT(a.global_step == steps && b.global_step == steps, "steps %lld and %lld",
            (long long)a.global_step, (long long)b.global_step);
    RASSERT(a.mirrors_identical, "%s R=%d: replica mirrors differ", ifd_input_mode_name(mode), R);
    double diff = tu_max_rel_diff(a.params, b.params, a.nparams, 1e-2);
    RASSERT(diff <= 1e-5, "%s %s/%s R=%d rows %lld: params differ from per-host by %g relative",
            ifd_input_mode_name(mode), program, ifd_optimizer_name(opt), R, (long long)per, diff);
    /* The summaries report the same loss; broadcast counts each row once (replica 0's copy). */
    RASSERT(a.nsummaries == b.nsummaries, "%zu summaries, per-host %zu", a.nsummaries,
            b.nsummaries);
    for (size_t i = 0; i + 1 < a.nsummaries; i++) {
        double la = summary_number(&a, i, "loss"), lb = summary_number(&b, i, "loss");
        RASSERT(fabs(la - lb) <= 1e-4 * (fabs(lb) + 1e-3), "%s step %zu: loss %g, per-host %g",
                ifd_input_mode_name(mode), i + 1, la, lb);
        double ea = summary_number(&a, i, "examples"), eb = summary_number(&b, i, "examples");
        double expect = mode == IFD_INPUT_BROADCAST ? eb / R : eb;
        RASSERT(ea == expect, "%s step %zu: %g examples, expected %g", ifd_input_mode_name(mode),
                i + 1, ea, expect);
    }
    tu_result_free(&a);
    tu_result_free(&b);
    tu_batches_free(bs, n);
    tu_batches_free(host, steps);
    ifd_program_free(&p);
}
END_TEST

/* ---- the input ending inside a step ------------------------------------------------------------
 */

START_TEST(input_ends_inside_a_step)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_input_mode mode = _i % 2 ? IFD_INPUT_PER_CORE : IFD_INPUT_PER_HOST_V2;
    int R = (int)rand_between(&rng, 2, MAX_R);
    int64_t per = rand_between(&rng, 1, 4);
    int64_t full = rand_between(&rng, 0, 6); /* complete steps */
    int extra = (int)rand_between(&rng, 1, R - 1);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, per * R, rand_between(&rng, 1, 4), 1);
    cfg.input_mode = mode;
    cfg.replicas = R;
    cfg.steps = full + 10;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, "softmax", &cfg.settings, &err), IFD_OK);
    int64_t n = full * R + extra;
    tu_batch **bs = calloc((size_t)n, sizeof *bs);
    for (int64_t k = 0; k < n; k++) {
        bs[k] = tu_batch_random(&p, per, k, &rng);
        bs[k]->b.replica = (int)(k % R); /* per-core: replicas >= extra get one batch less */
    }
    tu_result res;
    run_queued(&cfg, bs, n, &res);
    RASSERT(res.rc == IFD_OK, "%s: %s", ifd_input_mode_name(mode), ifd_error_text(&res.err));
    RASSERT(res.reason == IFD_END_INPUT_ENDED && res.global_step == full,
            "%s R=%d, %lld steps and %d batches: ended %s at global step %lld",
            ifd_input_mode_name(mode), R, (long long)full, extra, ifd_end_reason_name(res.reason),
            (long long)res.global_step);
    RASSERT(res.released == n, "%d of %lld batches released", res.released, (long long)n);
    RASSERT(res.mirrors_identical, "mirrors differ");
    tu_result_free(&res);
    tu_batches_free(bs, n);
    ifd_program_free(&p);
}
END_TEST

/* ---- predict: padding fills a partial step, every batch predicted once ---------------------- */

typedef struct predicted {
    int64_t rows[64]; /* by seq; -1: not delivered */
    int dups;
} predicted;

static int note_predictions(void *ctx, const ifd_batch *b, const ifd_predictions *p, ifd_error *err)
{
    (void)err;
    predicted *pr = ctx;
    if (b->seq < 0 || b->seq >= 64 || pr->rows[b->seq] >= 0)
        pr->dups++;
    else
        pr->rows[b->seq] = p->rows;
    return IFD_OK;
}

START_TEST(predict_in_every_mode)
{
    static const ifd_input_mode others[] = {IFD_INPUT_PER_HOST_V2, IFD_INPUT_PER_CORE,
                                            IFD_INPUT_BROADCAST};
    ifd_rng rng;
    seed_rng(&rng);
    ifd_input_mode mode = others[_i % 3];
    int R = (int)rand_between(&rng, 2, MAX_R);
    int64_t per = rand_between(&rng, 2, 5);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 4, per * R, 1, 1);
    cfg.mode = IFD_MODE_PREDICT;
    cfg.steps = 0;
    cfg.input_mode = mode;
    cfg.replicas = R;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, "softmax", &cfg.settings, &err), IFD_OK);
    int64_t n = rand_between(&rng, 1, 3 * R);
    tu_batch **bs = calloc((size_t)n, sizeof *bs);
    for (int64_t k = 0; k < n; k++) {
        int64_t rows = k == n - 1 ? rand_between(&rng, 1, per) : per; /* the last maybe partial */
        bs[k] = tu_batch_random(&p, rows, k, &rng);
        free(bs[k]->data[1]); /* no labels in predict mode */
        bs[k]->data[1] = NULL;
        bs[k]->b.ntensors = 1;
        bs[k]->b.replica = (int)(k % R);
    }
    predicted pr = {.dups = 0};
    for (int i = 0; i < 64; i++)
        pr.rows[i] = -1;
    ifd_prediction_sink sink = {.write = note_predictions, .ctx = &pr};
    tu_result res;
    run_queued_predict(&cfg, bs, n, &sink, &res);
    RASSERT(res.rc == IFD_OK, "%s R=%d %lld batches: %s", ifd_input_mode_name(mode), R,
            (long long)n, ifd_error_text(&res.err));
    RASSERT(pr.dups == 0, "%d batches predicted twice", pr.dups);
    for (int64_t k = 0; k < n; k++)
        RASSERT(pr.rows[k] == bs[k]->b.rows, "%s R=%d: batch %lld: %lld rows predicted of %lld",
                ifd_input_mode_name(mode), R, (long long)k, (long long)pr.rows[k],
                (long long)bs[k]->b.rows);
    RASSERT(res.released == n, "%d of %lld batches released", res.released, (long long)n);
    tu_result_free(&res);
    tu_batches_free(bs, n);
    ifd_program_free(&p);
}
END_TEST

/* ---- wrong rows, wrong sources ------------------------------------------------------------------
 */

START_TEST(wrong_rows_name_the_mode)
{
    static const ifd_input_mode others[] = {IFD_INPUT_PER_HOST_V2, IFD_INPUT_PER_CORE,
                                            IFD_INPUT_BROADCAST};
    ifd_input_mode mode = others[_i % 3];
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, 8, 2, 1);
    cfg.input_mode = mode;
    cfg.replicas = 4;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, "softmax", &cfg.settings, &err), IFD_OK);
    ifd_rng rng;
    ifd_rng_seed(&rng, 3);
    tu_batch *b = tu_batch_random(&p, 8, 5, &rng); /* the global batch: 4 times too many */
    tu_result res;
    run_queued(&cfg, &b, 1, &res);
    ck_assert_int_eq(res.rc, IFD_ESHAPE);
    const char *msg = ifd_error_text(&res.err);
    ck_assert_msg(strstr(msg, "batch 5") && strstr(msg, ifd_input_mode_name(mode)) &&
                      strstr(msg, "batch_size 8 / 4 replicas = 2 rows a batch") &&
                      strstr(msg, "has 8 rows, expected 2"),
                  "%s", msg);
    ck_assert_int_eq(res.released, 1);
    tu_result_free(&res);
    tu_batch_free(b);
    ifd_program_free(&p);
}
END_TEST

static int no_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    (void)ctx;
    (void)out;
    (void)err;
    return IFD_EEOF;
}

static void no_abort(void *ctx)
{
    (void)ctx;
}

START_TEST(per_core_needs_next_for)
{
    static const ifd_batch_source_ops ops = {.next = no_next, .abort = no_abort};
    ifd_batch_source src = {.ops = &ops};
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, 4, 2, 1);
    cfg.input_mode = IFD_INPUT_PER_CORE;
    cfg.replicas = 2;
    ifd_session *s;
    ifd_error err;
    ck_assert_int_eq(ifd_session_create(&s, &cfg, src, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "per-core") && strstr(err.msg, "next_for"), "%s", err.msg);
    /* a shared queue with two replicas: replica 1 has no FIFO; the run says so */
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 4), IFD_OK);
    ck_assert_int_eq(ifd_session_create(&s, &cfg, ifd_batch_queue_source(q), &err), IFD_OK);
    ifd_program p;
    ck_assert_int_eq(ifd_program_init(&p, "softmax", &cfg.settings, &err), IFD_OK);
    ifd_rng rng;
    ifd_rng_seed(&rng, 1);
    tu_batch *b = tu_batch_random(&p, 2, 0, &rng);
    ck_assert_int_eq(ifd_batch_queue_push(q, &b->b), IFD_OK);
    int rc = ifd_session_run(s, &err);
    ck_assert_int_eq(rc, IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "replica 1: expected 0 to 0"), "%s", err.msg);
    ifd_session_destroy(s);
    ifd_batch_queue_destroy(q);
    ifd_program_free(&p);
}
END_TEST

/* ---- which replica a per-core step waits for ------------------------------------------------- */

typedef struct runner {
    ifd_session *s;
    int rc;
    ifd_error err;
} runner;

static void *run_thread(void *arg)
{
    runner *r = arg;
    r->rc = ifd_session_run(r->s, &r->err);
    return NULL;
}

/* Replica k's stream stays empty: the infeed must say it waits for replica k, then run on once
 * k's batch comes. */
START_TEST(per_core_names_the_starving_replica)
{
    ifd_rng rng;
    seed_rng(&rng);
    int R = (int)rand_between(&rng, 2, MAX_R);
    int k = (int)rand_between(&rng, 0, R - 1);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 2, 2 * R, 1, 1);
    cfg.input_mode = IFD_INPUT_PER_CORE;
    cfg.replicas = R;
    cfg.steps = 1;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, "softmax", &cfg.settings, &err), IFD_OK);
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create_per_replica(&q, 4, R), IFD_OK);
    int released = 0;
    tu_batch *bs[MAX_R];
    for (int r = 0; r < R; r++) {
        bs[r] = tu_batch_random(&p, 2, r, &rng);
        bs[r]->b.replica = r;
        bs[r]->released = &released;
        if (r != k)
            ck_assert_int_eq(ifd_batch_queue_push(q, &bs[r]->b), IFD_OK);
    }
    runner rn = {0};
    ck_assert_int_eq(ifd_session_create(&rn.s, &cfg, ifd_batch_queue_source(q), &err), IFD_OK);
    int replica = -2;
    int64_t since = 0;
    ck_assert_int_eq(ifd_session_infeed_waiting(rn.s, &replica, &since), 0);
    pthread_t t;
    pthread_create(&t, NULL, run_thread, &rn);
    int waiting = 0;
    for (int i = 0; i < 2000 && !waiting; i++) {
        waiting = ifd_session_infeed_waiting(rn.s, &replica, &since);
        if (!waiting)
            ifd_sleep_ns(MS);
    }
    RASSERT(waiting && replica == k && since > 0 && since <= ifd_clock_ns(),
            "R=%d: waiting %d for replica %d, expected %d", R, waiting, replica, k);
    ck_assert_int_eq(ifd_batch_queue_push(q, &bs[k]->b), IFD_OK);
    pthread_join(t, NULL);
    RASSERT(rn.rc == IFD_OK, "%s", ifd_error_text(&rn.err));
    ck_assert_int_eq(ifd_session_global_step(rn.s), 1);
    ck_assert_int_eq(ifd_session_infeed_waiting(rn.s, &replica, NULL), 0);
    ck_assert_int_eq(replica, -1);
    ifd_session_destroy(rn.s);
    ifd_batch_queue_destroy(q);
    ck_assert_int_eq(released, R);
    ifd_program_free(&p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("modes");
    TCase *tc = tcase_create("modes");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, replicas_see_their_rows, 0, 24);
    tcase_add_loop_test(tc, same_params_as_per_host, 0, 18);
    tcase_add_loop_test(tc, input_ends_inside_a_step, 0, 8);
    tcase_add_loop_test(tc, wrong_rows_name_the_mode, 0, 3);
    tcase_add_test(tc, per_core_needs_next_for);
    tcase_add_loop_test(tc, predict_in_every_mode, 0, 12);
    tcase_add_loop_test(tc, per_core_names_the_starving_replica, 0, 4);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
