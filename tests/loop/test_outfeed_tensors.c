/* Outfeed tensors declared by a program (include/infeed/program.h, outfeed/step_tensors.h): a
 * test program outfeeds its x (float32 [rows, 3]) and y (int32 [rows]) beside softmax's class,
 * confidence and label; a tensor sink checks every step's concatenated tensors against the
 * batches the step took, for R = 1, 2, 4 and every input mode, in train and eval mode. */
#include "device/step.h"
#include "tests/util/probe_program.h"
#include "tests/util/numbers.h"
#include "tests/util/program_ref.h"
#include "tests/util/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the sink: checks each step against the batches it took -------------------------------- */

typedef struct probe_check {
    ifd_program p;
    const ifd_config *cfg;
    tu_batch **bs; /* in the order the source hands them out */
    int nper;      /* batches a step takes */
    float *params; /* eval: the parameters (the seed's) */
    int64_t steps;
    int64_t skipped;
    float last_param_norm;
    char fail[512];
} probe_check;

#define FAIL(c, ...)                                                                               \
    do {                                                                                           \
        if ((c)->fail[0] == '\0')                                                                  \
            snprintf((c)->fail, sizeof(c)->fail, __VA_ARGS__);                                     \
        return IFD_OK;                                                                             \
    } while (0)

static const ifd_tensor *find(const ifd_step_tensors *t, const char *name)
{
    for (int i = 0; i < t->ntensors; i++)
        if (strcmp(t->names[i], name) == 0)
            return &t->tensors[i];
    return NULL;
}

static int probe_write(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    (void)err;
    probe_check *c = ctx;
    const ifd_config *cfg = c->cfg;
    int64_t s = c->steps++;
    int R = cfg->replicas;
    int train = cfg->mode == IFD_MODE_TRAIN;
    if (t->global_step != s + 1)
        FAIL(c, "step %lld: global_step %lld", (long long)s, (long long)t->global_step);
    if (t->ntensors != 5 + (train ? 6 : 3))
        FAIL(c, "step %lld: %d tensors", (long long)s, t->ntensors);
    /* The rows the step's replicas took, in replica order (broadcast: replica 0's). */
    int nb = cfg->input_mode == IFD_INPUT_PER_HOST || cfg->input_mode == IFD_INPUT_BROADCAST
                 ? 1
                 : c->nper;
    int shards = cfg->input_mode == IFD_INPUT_BROADCAST ? 1 : R;
    tu_batch **step = c->bs + s * c->nper;
    int64_t rows = 0;
    for (int b = 0; b < nb; b++)
        rows += step[b]->b.rows;
    const ifd_tensor *x3 = find(t, "x3"), *y1 = find(t, "y1"), *label = find(t, "label"),
                     *cls = find(t, "class"), *conf = find(t, "confidence"),
                     *count = find(t, "count"), *loss = find(t, "loss");
    if (!x3 || !y1 || !label || !cls || !conf || !count || !loss)
        FAIL(c, "step %lld: a tensor is missing", (long long)s);
    if (x3->dtype != IFD_F32 || x3->shape.rank != 2 || x3->shape.dims[0] != rows ||
        x3->shape.dims[1] != 3 || y1->dtype != IFD_I32 || y1->shape.rank != 1 ||
        y1->shape.dims[0] != rows || label->shape.dims[0] != rows || cls->dtype != IFD_I32 ||
        cls->shape.dims[0] != rows || conf->dtype != IFD_F32 || conf->shape.dims[0] != rows)
        FAIL(c, "step %lld: shapes x3 [%lld, %lld] y1 [%lld], expected %lld rows", (long long)s,
             (long long)x3->shape.dims[0], (long long)x3->shape.dims[1],
             (long long)y1->shape.dims[0], (long long)rows);
    if (count->shape.dims[0] != shards || loss->shape.dims[0] != shards)
        FAIL(c, "step %lld: count has %lld values, expected %d", (long long)s,
             (long long)count->shape.dims[0], shards);
    int64_t at = 0;
    for (int b = 0; b < nb; b++) {
        const tu_batch *tb = step[b];
        const float *x = tb->data[0];
        const int32_t *y = tb->data[1];
        for (int64_t j = 0; j < tb->b.rows; j++, at++) {
            for (int d = 0; d < 3; d++)
                if (((const float *)x3->data)[at * 3 + d] != x[j * 3 + d])
                    FAIL(c, "step %lld row %lld: x3[%d] %g, the batch has %g", (long long)s,
                         (long long)at, d, (double)((const float *)x3->data)[at * 3 + d],
                         (double)x[j * 3 + d]);
            if (((const int32_t *)y1->data)[at] != y[j] ||
                ((const int32_t *)label->data)[at] != y[j])
                FAIL(c, "step %lld row %lld: y1 %d, label %d, the batch has %d", (long long)s,
                     (long long)at, ((const int32_t *)y1->data)[at],
                     ((const int32_t *)label->data)[at], y[j]);
            if (c->params) { /* eval: the parameters are known, so are class and confidence */
                double z[3], mx = -INFINITY, sum = 0.0, second = -INFINITY;
                int arg = 0;
                tu_ref_logits(&c->p, x + j * 3, c->params, z, NULL);
                for (int k = 0; k < 3; k++)
                    if (z[k] > mx)
                        second = mx, mx = z[k], arg = k;
                    else if (z[k] > second)
                        second = z[k];
                for (int k = 0; k < 3; k++)
                    sum += exp(z[k] - mx);
                int32_t got = ((const int32_t *)cls->data)[at];
                if (mx - second > 1e-4 && got != arg)
                    FAIL(c, "step %lld row %lld: class %d, expected %d", (long long)s,
                         (long long)at, got, arg);
                double pc = 1.0 / sum, gc = ((const float *)conf->data)[at];
                if (fabs(gc - pc) > 1e-5)
                    FAIL(c, "step %lld row %lld: confidence %.7g, expected %.7g", (long long)s,
                         (long long)at, gc, pc);
            }
        }
    }
    for (int r = 0; r < shards; r++) {
        double want = (double)rows / shards;
        if (((const float *)count->data)[r] != (float)want)
            FAIL(c, "step %lld: count[%d] %g, expected %g", (long long)s, r,
                 (double)((const float *)count->data)[r], want);
    }
    if (train) {
        const ifd_tensor *lr = find(t, "learning_rate"), *gn = find(t, "grad_norm"),
                         *pn = find(t, "param_norm");
        if (!lr || !gn || !pn || lr->shape.dims[0] != 1)
            FAIL(c, "step %lld: no learning_rate, grad_norm or param_norm", (long long)s);
        if (((const float *)lr->data)[0] != cfg->optimizer.learning_rate)
            FAIL(c, "step %lld: learning_rate %g", (long long)s,
                 (double)((const float *)lr->data)[0]);
        float g = ((const float *)gn->data)[0];
        if (!(g > 0.0f) || !isfinite(g))
            FAIL(c, "step %lld: grad_norm %g", (long long)s, (double)g);
        c->last_param_norm = ((const float *)pn->data)[0];
    } else if (find(t, "grad_norm")) {
        FAIL(c, "step %lld: grad_norm in eval mode", (long long)s);
    }
    return IFD_OK;
}

/* ---- the runs ----------------------------------------------------------------------------- */

/* Runs cfg over clones of bs[0..n), queued (per replica in per-core mode, by b.replica) and
 * closed, with the tensor sink ts when not NULL. */
static void run_with_sink(const ifd_config *cfg, tu_batch **bs, int64_t n,
                          const ifd_tensor_sink *ts, tu_result *res)
{
    ifd_batch_queue *q;
    if (cfg->input_mode == IFD_INPUT_PER_CORE)
        ck_assert_int_eq(ifd_batch_queue_create_per_replica(&q, (size_t)n + 1, cfg->replicas),
                         IFD_OK);
    else
        ck_assert_int_eq(ifd_batch_queue_create(&q, (size_t)n + 1), IFD_OK);
    memset(res, 0, sizeof *res);
    for (int64_t k = 0; k < n; k++) {
        tu_batch *cl = tu_batch_clone(bs[k]);
        cl->released = &res->released;
        ck_assert_int_eq(ifd_batch_queue_push(q, &cl->b), IFD_OK);
    }
    ifd_batch_queue_close(q);
    ifd_sink *sink;
    ifd_session *s = tu_session_create(cfg, ifd_batch_queue_source(q), NULL, NULL, 0, &sink, res);
    if (ts)
        ck_assert_int_eq(ifd_session_add_tensor_sink(s, ts), IFD_OK);
    res->rc = ifd_session_run(s, &res->err);
    tu_result_collect(res, s, cfg->replicas, sink);
    ifd_batch_queue_destroy(q);
}

static const ifd_input_mode modes[] = {IFD_INPUT_PER_HOST, IFD_INPUT_PER_HOST_V2,
                                       IFD_INPUT_PER_CORE, IFD_INPUT_BROADCAST};
static const int replicas[] = {1, 2, 4};

static void run_probe(ifd_mode run_mode, int i)
{
    probe_program_register();
    ifd_rng rng;
    seed_rng(&rng);
    ifd_input_mode mode = modes[i % 4];
    int R = replicas[(i / 4) % 3];
    int64_t per = rand_between(&rng, 1, 7);
    int64_t steps = rand_between(&rng, 1, 9);
    ifd_config cfg;
    tu_config_train(&cfg, "probe", IFD_OPT_SGD, 3, 3, per * R, rand_between(&rng, 1, 4),
                    ifd_rng_next(&rng));
    cfg.input_mode = mode;
    cfg.replicas = R;
    cfg.steps = steps;
    cfg.mode = run_mode;
    cfg.summary_every = 0;
    probe_check c;
    memset(&c, 0, sizeof c);
    c.cfg = &cfg;
    c.nper = ifd_input_batches_per_step(mode, R);
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&c.p, "probe", &cfg.settings, &err), IFD_OK);
    int64_t rows = ifd_input_batch_rows(mode, cfg.batch_size, R);
    int64_t n = steps * c.nper;
    tu_batch **bs = calloc((size_t)n, sizeof *bs);
    for (int64_t k = 0; k < n; k++) {
        bs[k] = tu_batch_random(&c.p, rows, k, &rng);
        bs[k]->b.replica = (int)(k % c.nper);
    }
    c.bs = bs;
    if (run_mode == IFD_MODE_EVAL) {
        c.params = malloc(sizeof(float) * (size_t)c.p.nparam_floats);
        c.p.cls->init_params(&c.p, c.params, cfg.seed);
    }
    tu_result res;
    ifd_tensor_sink ts = {.write = probe_write, .ctx = &c};
    run_with_sink(&cfg, bs, n, &ts, &res);
    const char *what = ifd_input_mode_name(mode);
    RASSERT(res.rc == IFD_OK, "%s R=%d: %s", what, R, ifd_error_text(&res.err));
    RASSERT(c.fail[0] == '\0', "%s %s R=%d rows %lld: %s", ifd_mode_name(run_mode), what, R,
            (long long)rows, c.fail);
    RASSERT(c.steps == steps, "%s R=%d: the sink saw %lld steps of %lld", what, R,
            (long long)c.steps, (long long)steps);
    if (run_mode == IFD_MODE_TRAIN) { /* the last step's param_norm: the final parameters' */
        double sq = 0.0;
        for (int64_t j = 0; j < res.nparams; j++)
            sq += (double)res.params[j] * (double)res.params[j];
        RASSERT(fabs(sqrt(sq) - c.last_param_norm) <= 1.5e-5 * sqrt(sq),
                "%s R=%d: param_norm %.7g, the parameters' norm %.7g", what, R,
                (double)c.last_param_norm, sqrt(sq));
    }
    tu_result_free(&res);
    tu_batches_free(bs, n);
    free(c.params);
    ifd_program_free(&c.p);
}

START_TEST(train_tensors_concatenated)
{
    run_probe(IFD_MODE_TRAIN, _i);
}
END_TEST

START_TEST(eval_tensors_concatenated)
{
    run_probe(IFD_MODE_EVAL, _i);
}
END_TEST

static int noting_write(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    (void)t;
    (void)err;
    ++*(int *)ctx;
    return IFD_OK;
}

/* Steps whose outfeeds are not NULL, counted by the "counting" program. */
static int g_with_outfeeds;

static int counting_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                         ifd_error *err)
{
    if (a->outfeeds)
        __atomic_add_fetch(&g_with_outfeeds, 1, __ATOMIC_RELAXED);
    return tu_softmax_step(p, ops, a, err);
}

/* Nobody takes the tensors (no host call, no tensor sink): the steps get no outfeeds, so the
 * program spends nothing on them; with a sink every step gets them. */
START_TEST(outfeeds_only_for_a_taker)
{
    if (ifd_program_find("counting") == NULL)
        ck_assert_int_eq(tu_register_softmax_like("counting", counting_step), IFD_OK);
    for (int with_sink = 0; with_sink < 2; with_sink++) {
        ifd_config cfg;
        tu_config_train(&cfg, "counting", IFD_OPT_SGD, 4, 3, 8, 3, 3);
        cfg.replicas = 2;
        tu_batch **bs = tu_batches_random(&cfg, cfg.steps, 5);
        tu_result res;
        int written = 0;
        ifd_tensor_sink ts = {.write = noting_write, .ctx = &written};
        g_with_outfeeds = 0;
        run_with_sink(&cfg, bs, cfg.steps, with_sink ? &ts : NULL, &res);
        ck_assert_msg(res.rc == IFD_OK, "%s", ifd_error_text(&res.err));
        ck_assert_int_eq(written, with_sink ? cfg.steps : 0);
        ck_assert_int_eq(g_with_outfeeds, with_sink ? 2 * cfg.steps : 0);
        tu_result_free(&res);
        tu_batches_free(bs, cfg.steps);
    }
}
END_TEST

/* A sink that wants the tensors of the steps a random schedule says: the infeed asks once a
 * step, in step order (its thread only). */
typedef struct step_wants {
    int schedule[64];
    int asked;
    int64_t seen[256]; /* the global steps written */
    int nseen;
} step_wants;

static int schedule_wants(void *ctx)
{
    step_wants *w = ctx;
    return w->asked < 64 ? w->schedule[w->asked++] : 0;
}

static int schedule_write(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    (void)err;
    step_wants *w = ctx;
    if (w->nseen < 256)
        w->seen[w->nseen++] = t->global_step;
    return IFD_OK;
}

/* A sink's wants, asked once a step: the steps it wants write the program's tensors on every
 * replica and reach it, the others write none (no op on the device) and do not, whatever the
 * loops. */
START_TEST(a_sink_takes_the_steps_it_wants)
{
    if (ifd_program_find("counting") == NULL)
        ck_assert_int_eq(tu_register_softmax_like("counting", counting_step), IFD_OK);
    ifd_rng rng;
    seed_rng(&rng);
    int64_t ipl = rand_between(&rng, 1, 5), steps = rand_between(&rng, 1, 40);
    ifd_config cfg;
    tu_config_train(&cfg, "counting", IFD_OPT_SGD, 4, 3, 8, ipl, ifd_rng_next(&rng));
    cfg.replicas = (int)rand_between(&rng, 1, 3);
    cfg.batch_size = 4 * cfg.replicas;
    cfg.steps = steps;
    tu_batch **bs = tu_batches_random(&cfg, steps, 5);
    step_wants w;
    memset(&w, 0, sizeof w);
    for (int i = 0; i < 64; i++)
        w.schedule[i] = (int)rand_between(&rng, 0, 1);
    ifd_tensor_sink ts = {.write = schedule_write, .ctx = &w, .wants = schedule_wants};
    g_with_outfeeds = 0;
    tu_result res;
    run_with_sink(&cfg, bs, steps, &ts, &res);
    ck_assert_msg(res.rc == IFD_OK, "%s", ifd_error_text(&res.err));
    int64_t want = 0;
    ck_assert_int_eq(w.asked, steps);
    for (int64_t st = 1; st <= steps; st++)
        if (w.schedule[st - 1]) {
            RASSERT(want < w.nseen && w.seen[want] == st, "step %lld (wanted) not written in order",
                    (long long)st);
            want++;
        }
    ck_assert_int_eq(w.nseen, want);
    ck_assert_int_eq(g_with_outfeeds, cfg.replicas * want);
    tu_result_free(&res);
    tu_batches_free(bs, steps);
}
END_TEST

/* A sink's flush: the steps written before each call. */
typedef struct flush_log {
    int64_t last;    /* the last step written */
    int64_t at[512]; /* last, at each flush */
    int n;
    int64_t out_of_order; /* the first step written after another than the one before it */
} flush_log;

static int logging_write(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    (void)err;
    flush_log *l = ctx;
    if (t->global_step != l->last + 1 && l->out_of_order == 0)
        l->out_of_order = t->global_step;
    l->last = t->global_step;
    return IFD_OK;
}

static int logging_flush(void *ctx, ifd_error *err)
{
    (void)err;
    flush_log *l = ctx;
    if (l->n < 512)
        l->at[l->n++] = l->last;
    return IFD_OK;
}

/* The outfeed thread flushes the tensor sinks after the last step of every device loop, and
 * after the last step when the input ends in the middle of a loop: no step waits beyond its
 * loop. Random loop lengths, steps and input length. */
START_TEST(a_sink_is_flushed_at_every_loop_end)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t ipl = rand_between(&rng, 1, 6), steps = rand_between(&rng, 1, 40);
    int64_t batches = _i % 2 ? rand_between(&rng, 1, steps) : steps; /* the input may end first */
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 4, 3, 8, ipl, ifd_rng_next(&rng));
    cfg.replicas = (int)rand_between(&rng, 1, 3);
    cfg.batch_size = 4 * cfg.replicas;
    cfg.steps = steps;
    tu_batch **bs = tu_batches_random(&cfg, batches, 5);
    flush_log l;
    memset(&l, 0, sizeof l);
    ifd_tensor_sink ts = {.write = logging_write, .ctx = &l, .flush = logging_flush};
    tu_result res;
    run_with_sink(&cfg, bs, batches, &ts, &res);
    ck_assert_msg(res.rc == IFD_OK, "%s", ifd_error_text(&res.err));
    ck_assert_int_eq(l.out_of_order, 0);
    ck_assert_int_eq(l.last, batches);
    /* every loop's end, then the last step (once more when the input ended at a loop's end) */
    int k = 0;
    for (int64_t end = ipl; end < batches; end += ipl, k++)
        RASSERT(k < l.n && l.at[k] == end, "ipl %lld: flush %d after step %lld, expected %lld",
                (long long)ipl, k, (long long)(k < l.n ? l.at[k] : -1), (long long)end);
    RASSERT(k < l.n && l.at[k] == batches, "ipl %lld: no flush after the last step %lld",
            (long long)ipl, (long long)batches);
    for (k++; k < l.n; k++)
        ck_assert_int_eq(l.at[k], batches);
    tu_result_free(&res);
    tu_batches_free(bs, batches);
}
END_TEST

/* The built-in classifiers' outfeeds from one direct step (train and eval): class, confidence
 * and label against the double-precision logits of tests/util/program_ref.h. */
START_TEST(classifiers_outfeed_class_confidence_label)
{
    ifd_rng rng;
    seed_rng(&rng);
    const char *name = _i % 2 ? "mlp" : "softmax";
    int64_t d = rand_between(&rng, 1, 9), k = rand_between(&rng, 2, 7),
            rows = rand_between(&rng, 1, 40);
    ifd_program p;
    tu_make_program_h(&p, name, d, rand_between(&rng, 1, 8), k);
    float *params = tu_falloc(p.nparam_floats), *grads = tu_falloc(p.nparam_floats);
    p.cls->init_params(&p, params, ifd_rng_next(&rng));
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    int64_t offs[IFD_MAX_OUTFEEDS];
    unsigned char *area = calloc((size_t)ifd_program_outfeed_layout(&p, rows, offs), 1);
    void *outs[IFD_MAX_OUTFEEDS];
    for (int i = 0; i < p.noutfeeds; i++)
        outs[i] = area + offs[i];
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    float *work = tu_falloc(p.cls->workspace_floats(&p, rows));
    ifd_step_out out = {0};
    ifd_step_args a = {.inputs = tb->b.tensors,
                       .rows = rows,
                       .params = params,
                       .grads = _i % 4 < 2 ? grads : NULL, /* train or eval */
                       .workspace = work,
                       .scale = 1.0f,
                       .out = &out,
                       .outfeeds = outs};
    ifd_error err;
    RC_OK(p.cls->train_step(&p, &ops, &a, &err), err);
    const int32_t *cls = outs[0], *label = outs[2], *y = tb->data[1];
    const float *conf = outs[1], *x = tb->data[0];
    for (int64_t r = 0; r < rows; r++) {
        double z[16], mx = -INFINITY, second = -INFINITY, sum = 0.0;
        int arg = 0;
        tu_ref_logits(&p, x + r * d, params, z, NULL);
        for (int j = 0; j < k; j++)
            if (z[j] > mx)
                second = mx, mx = z[j], arg = j;
            else if (z[j] > second)
                second = z[j];
        for (int j = 0; j < k; j++)
            sum += exp(z[j] - mx);
        RASSERT(label[r] == y[r], "%s row %lld: label %d, y %d", name, (long long)r, label[r],
                y[r]);
        RASSERT(mx - second <= 1e-4 || cls[r] == arg, "%s row %lld: class %d, expected %d", name,
                (long long)r, cls[r], arg);
        RASSERT(fabs(conf[r] - 1.0 / sum) <= 1e-5, "%s row %lld: confidence %.7g, expected %.7g",
                name, (long long)r, (double)conf[r], 1.0 / sum);
    }
    free(params);
    free(grads);
    free(area);
    free(work);
    tu_batch_free(tb);
    ifd_program_free(&p);
}
END_TEST

static int failing_write(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    (void)ctx;
    return ifd_error_set(err, IFD_EINVAL, "refused %d tensors", t->ntensors);
}

/* A tensor sink's error ends the run with its sentence and the step. */
START_TEST(tensor_sink_error_ends_the_run)
{
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 4, 3, 8, 2, 3);
    tu_batch **bs = tu_batches_random(&cfg, cfg.steps, 5);
    tu_result res;
    ifd_tensor_sink ts = {.write = failing_write, .ctx = NULL};
    run_with_sink(&cfg, bs, cfg.steps, &ts, &res);
    ck_assert_int_eq(res.rc, IFD_EINVAL);
    /* softmax: class, confidence, label and the six of a train step */
    ck_assert_msg(strstr(ifd_error_text(&res.err), "tensor sink at step 1: refused 9 tensors"),
                  "%s", ifd_error_text(&res.err));
    tu_result_free(&res);
    tu_batches_free(bs, cfg.steps);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("outfeed_tensors");
    TCase *tc = tcase_create("outfeed_tensors");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, train_tensors_concatenated, 0, 24);
    tcase_add_loop_test(tc, eval_tensors_concatenated, 0, 12);
    tcase_add_test(tc, tensor_sink_error_ends_the_run);
    tcase_add_test(tc, outfeeds_only_for_a_taker);
    tcase_add_loop_test(tc, a_sink_takes_the_steps_it_wants, 0, 8);
    tcase_add_loop_test(tc, a_sink_is_flushed_at_every_loop_end, 0, 8);
    tcase_add_loop_test(tc, classifiers_outfeed_class_confidence_label, 0, 8);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
