/* Eval and predict modes of the runtime, against plain C double-precision references computed
 * from the same parameters and data, over random programs, shapes, replica counts and loops. */
#include "tests/util/testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A dense program's logits for one row, in double. */
static void ref_logits(const ifd_program *p, const float *params, const float *x, double *out)
{
    int64_t d = p->settings.features, k = p->settings.classes;
    const float *w = params + p->params[0].offset, *b = params + p->params[1].offset;
    for (int64_t j = 0; j < k; j++) {
        double s = b[j];
        for (int64_t i = 0; i < d; i++)
            s += (double)x[i] * (double)w[i * k + j];
        out[j] = s;
    }
}

static void ref_softmax(const double *logits, int64_t k, double *probs)
{
    double mx = logits[0], sum = 0.0;
    for (int64_t j = 1; j < k; j++)
        mx = logits[j] > mx ? logits[j] : mx;
    for (int64_t j = 0; j < k; j++)
        sum += exp(logits[j] - mx);
    for (int64_t j = 0; j < k; j++)
        probs[j] = exp(logits[j] - mx) / sum;
}

static const char *pick_program(ifd_rng *rng)
{
    return ifd_rng_below(rng, 2) ? "softmax" : "linear";
}

static json_t *find_event(const tu_result *res, const char *event)
{
    for (size_t i = 0; i < res->nsummaries; i++) {
        json_t *j = json_loads(res->summaries[i], 0, NULL);
        if (j && strcmp(json_string_value(json_object_get(j, "event")), event) == 0)
            return j;
        json_decref(j);
    }
    return NULL;
}

/* ---- eval ---------------------------------------------------------------------------------- */

START_TEST(eval_matches_reference)
{
    ifd_rng rng;
    seed_rng(&rng);
    int replicas = (int)rand_between(&rng, 1, 4);
    int64_t per = rand_between(&rng, 1, 9), d = rand_between(&rng, 1, 12),
            k = rand_between(&rng, 2, 7), steps = rand_between(&rng, 1, 7);
    const char *prog = pick_program(&rng);
    ifd_config cfg;
    tu_config_train(&cfg, prog, IFD_OPT_SGD, d, k, per * replicas, 1 + (int64_t)_i,
                    ifd_rng_next(&rng));
    cfg.replicas = replicas;
    cfg.mode = IFD_MODE_EVAL;
    cfg.steps = steps;
    cfg.last_step = 0;
    cfg.initial_global_step = rand_between(&rng, 0, 5000);
    tu_batch **bs = tu_batches_random(&cfg, steps, ifd_rng_next(&rng));

    tu_result res;
    tu_run(&cfg, bs, steps, &res);
    RASSERT(res.rc == IFD_OK, "eval run: %s", ifd_error_text(&res.err));
    RASSERT(res.reason == IFD_END_LAST_STEP, "reason %s", ifd_end_reason_name(res.reason));
    RASSERT(res.global_step == cfg.initial_global_step, "eval moved the global step: %lld -> %lld",
            (long long)cfg.initial_global_step, (long long)res.global_step);
    RASSERT(res.released == steps, "released %d of %lld batches", res.released, (long long)steps);

    /* no update: the parameters are still the seed's */
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg.program, &cfg.settings, &err), IFD_OK);
    float *init = malloc(sizeof(float) * (size_t)p.nparam_floats);
    p.cls->init_params(&p, init, cfg.seed);
    RASSERT(memcmp(init, res.params, sizeof(float) * (size_t)p.nparam_floats) == 0,
            "eval changed the parameters");
    RASSERT(res.mirrors_identical, "mirrors differ");

    /* the reference: per-example losses summed over every row, divided once */
    double loss = 0.0, logits[16], probs[16];
    int64_t correct = 0, rows = 0;
    for (int64_t s = 0; s < steps; s++) {
        const float *x = bs[s]->b.tensors[0].data;
        for (int64_t r = 0; r < cfg.batch_size; r++, rows++) {
            ref_logits(&p, init, x + r * d, logits);
            if (p.classifier) {
                int32_t y = ((const int32_t *)bs[s]->b.tensors[1].data)[r];
                ref_softmax(logits, k, probs);
                loss += -log(probs[y]);
                int64_t arg = 0;
                for (int64_t j = 1; j < k; j++)
                    arg = logits[j] > logits[arg] ? j : arg;
                correct += arg == y;
            } else {
                const float *y = (const float *)bs[s]->b.tensors[1].data + r * k;
                double e = 0.0;
                for (int64_t j = 0; j < k; j++)
                    e += (logits[j] - y[j]) * (logits[j] - y[j]);
                loss += 0.5 * e;
            }
        }
    }
    loss /= (double)rows;

    json_t *j = find_event(&res, "eval");
    RASSERT(j != NULL, "no eval summary among %zu", res.nsummaries);
    double got = json_real_value(json_object_get(j, "loss"));
    RASSERT(fabs(got - loss) <= 1e-5 * fmax(1.0, fabs(loss)),
            "%s R=%d: eval loss %.9g, reference %.9g", prog, replicas, got, loss);
    RASSERT(json_integer_value(json_object_get(j, "examples")) == rows, "examples %lld, want %lld",
            (long long)json_integer_value(json_object_get(j, "examples")), (long long)rows);
    RASSERT(json_integer_value(json_object_get(j, "steps")) == steps, "steps");
    RASSERT(json_integer_value(json_object_get(j, "global_step")) == cfg.initial_global_step,
            "the summary's global step is not the parameters'");
    if (p.classifier) {
        /* float32 and double logits may order a near tie differently: one example of slack */
        double acc = json_real_value(json_object_get(j, "accuracy"));
        RASSERT(fabs(acc * (double)rows - (double)correct) <= 1.0 + 1e-9,
                "accuracy %.6f, reference %lld/%lld", acc, (long long)correct, (long long)rows);
    } else {
        RASSERT(json_object_get(j, "accuracy") == NULL, "linear has no accuracy");
    }
    json_decref(j);
    /* eval is one loop: no train summaries, exactly one eval summary */
    size_t evals = 0;
    for (size_t i = 0; i < res.nsummaries; i++)
        evals += strstr(res.summaries[i], "\"event\":\"eval\"") != NULL;
    RASSERT(evals == 1, "%zu eval summaries", evals);
    free(init);
    tu_result_free(&res);
    tu_batches_free(bs, steps);
    ifd_program_free(&p);
}
END_TEST

/* ---- predict ------------------------------------------------------------------------------- */

typedef struct got_batch {
    int64_t seq, rows;
    float *values; /* [rows, cols] */
    int32_t *classes;
    int ntensors;
} got_batch;

typedef struct collector {
    got_batch *got;
    int64_t n, cap;
    int64_t cols;
} collector;

static int collect(void *ctx, const ifd_batch *b, const ifd_predictions *p, ifd_error *err)
{
    (void)err;
    collector *c = ctx;
    ck_assert_int_lt(c->n, c->cap);
    got_batch *g = &c->got[c->n++];
    g->seq = b->seq;
    g->rows = p->rows;
    g->ntensors = p->ntensors;
    ck_assert_int_eq(p->tensors[0].shape.dims[0], p->rows);
    ck_assert_int_eq(p->tensors[0].shape.dims[1], c->cols);
    g->values = malloc(sizeof(float) * (size_t)(p->rows * c->cols));
    memcpy(g->values, p->tensors[0].data, sizeof(float) * (size_t)(p->rows * c->cols));
    if (p->ntensors == 2) {
        ck_assert_str_eq(p->names[1], "classes");
        g->classes = malloc(sizeof(int32_t) * (size_t)p->rows);
        memcpy(g->classes, p->tensors[1].data, sizeof(int32_t) * (size_t)p->rows);
    }
    return IFD_OK;
}

/* `total` rows in batches of batch rows (the last one partial), R replicas: exactly total
 * predictions, batch by batch in order, equal to the host reference, with the padding and the
 * stopping-signal batch dropped. */
static void check_predict(const char *prog, int replicas, int64_t batch, int64_t total, int64_t ipl,
                          ifd_rng *rng)
{
    int64_t d = rand_between(rng, 1, 10), k = rand_between(rng, 2, 9);
    ifd_config cfg;
    tu_config_train(&cfg, prog, IFD_OPT_SGD, d, k, batch, ipl, ifd_rng_next(rng));
    cfg.replicas = replicas;
    cfg.mode = IFD_MODE_PREDICT;
    cfg.steps = 0;
    cfg.last_step = 0;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg.program, &cfg.settings, &err), IFD_OK);
    int64_t nb = (total + batch - 1) / batch;
    tu_batch **bs = calloc((size_t)nb, sizeof *bs);
    for (int64_t i = 0; i < nb; i++) {
        int64_t rows = i == nb - 1 ? total - batch * (nb - 1) : batch;
        bs[i] = tu_batch_random(&p, rows, i, rng);
        tu_strip_labels(&p, bs[i]);
    }
    collector c = {.got = calloc((size_t)nb + 4, sizeof(got_batch)), .cap = nb + 4, .cols = k};
    ifd_prediction_sink sink = {.write = collect, .ctx = &c};
    tu_result res;
    tu_run_predict(&cfg, bs, nb, &sink, &res);
    RASSERT(res.rc == IFD_OK, "%s R=%d batch %lld: predict run: %s", prog, replicas,
            (long long)batch, ifd_error_text(&res.err));
    RASSERT(res.released == nb, "released %d of %lld batches", res.released, (long long)nb);
    RASSERT(c.n == nb, "%lld prediction batches, want %lld", (long long)c.n, (long long)nb);

    float *params = malloc(sizeof(float) * (size_t)p.nparam_floats);
    p.cls->init_params(&p, params, cfg.seed);
    double logits[16], probs[16];
    int64_t seen = 0;
    for (int64_t i = 0; i < c.n; i++) {
        got_batch *g = &c.got[i];
        RASSERT(g->seq == i, "batch %lld's predictions came as seq %lld", (long long)i,
                (long long)g->seq);
        RASSERT(g->rows == bs[i]->b.rows, "batch %lld: %lld rows of predictions, sent %lld",
                (long long)i, (long long)g->rows, (long long)bs[i]->b.rows);
        RASSERT(g->ntensors == (p.classifier ? 2 : 1), "tensors %d", g->ntensors);
        for (int64_t r = 0; r < g->rows; r++, seen++) {
            ref_logits(&p, params, (const float *)bs[i]->b.tensors[0].data + r * d, logits);
            if (p.classifier)
                ref_softmax(logits, k, probs);
            int32_t arg = 0;
            for (int64_t j = 0; j < k; j++) {
                double want = p.classifier ? probs[j] : logits[j];
                double v = g->values[r * k + j];
                RASSERT(fabs(v - want) <= 1e-5 * fmax(1.0, fabs(want)),
                        "batch %lld row %lld col %lld: %.8g, reference %.8g", (long long)i,
                        (long long)r, (long long)j, v, want);
                if (g->values[r * k + j] > g->values[r * k + arg])
                    arg = (int32_t)j;
            }
            if (p.classifier)
                RASSERT(g->classes[r] == arg, "row %lld: class %d, argmax %d", (long long)r,
                        g->classes[r], arg);
        }
        free(g->values);
        free(g->classes);
    }
    RASSERT(seen == total, "%lld predictions, want %lld", (long long)seen, (long long)total);
    json_t *end = find_event(&res, "end");
    RASSERT(end && strcmp(json_string_value(json_object_get(end, "status")), "ok") == 0,
            "end summary");
    RASSERT(json_integer_value(json_object_get(end, "steps")) == nb, "end: %lld steps, want %lld",
            (long long)json_integer_value(json_object_get(end, "steps")), (long long)nb);
    json_decref(end);
    free(params);
    free(c.got);
    tu_result_free(&res);
    tu_batches_free(bs, nb);
    ifd_program_free(&p);
}

/* The case: 1000 rows, batch 64, R = 4. */
START_TEST(predict_1000_rows_batch_64_r4)
{
    ifd_rng rng;
    seed_rng(&rng);
    check_predict("softmax", 4, 64, 1000, rand_between(&rng, 1, 20), &rng);
}
END_TEST

START_TEST(predict_random_shapes)
{
    ifd_rng rng;
    seed_rng(&rng);
    int replicas = (int)rand_between(&rng, 1, 4);
    int64_t batch = replicas * rand_between(&rng, 1, 12);
    int64_t total = rand_between(&rng, 1, 12 * batch);
    check_predict(pick_program(&rng), replicas, batch, total, rand_between(&rng, 1, 9), &rng);
}
END_TEST

/* Predict takes no labels: a batch with them is an error naming the count. */
START_TEST(predict_rejects_labels)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 3, 4, 8, 2, 1);
    cfg.mode = IFD_MODE_PREDICT;
    cfg.steps = 0;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg.program, &cfg.settings, &err), IFD_OK);
    tu_batch *b = tu_batch_random(&p, 8, 0, &rng);
    tu_result res;
    tu_run(&cfg, &b, 1, &res);
    RASSERT(res.rc == IFD_ESHAPE, "rc %s: %s", ifd_errname(res.rc), ifd_error_text(&res.err));
    RASSERT(strstr(res.err.msg, "predict") && strstr(res.err.msg, "2 tensors"), "%s", res.err.msg);
    tu_result_free(&res);
    tu_batch_free(b);
    ifd_program_free(&p);
}
END_TEST

/* An error in an eval step names it by its number in the run: the global step does not move. */
static int64_t fail_at, calls; /* calls: atomic */
static int failing_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                        ifd_error *err)
{
    if (__atomic_add_fetch(&calls, 1, __ATOMIC_ACQ_REL) == fail_at)
        return ifd_error_set(err, IFD_ENUMERIC, "injected");
    return tu_softmax_step(p, ops, a, err);
}

START_TEST(eval_error_names_the_step)
{
    ifd_rng rng;
    seed_rng(&rng);
    ck_assert_int_eq(tu_register_softmax_like("failing_eval", failing_step), IFD_OK);
    int64_t steps = rand_between(&rng, 2, 9);
    fail_at = rand_between(&rng, 1, steps);
    ifd_config cfg;
    tu_config_train(&cfg, "failing_eval", IFD_OPT_SGD, 3, 4, 6, 1 + (int64_t)_i, 3);
    cfg.mode = IFD_MODE_EVAL;
    cfg.steps = steps;
    cfg.last_step = 0;
    cfg.initial_global_step = rand_between(&rng, 0, 1000);
    tu_batch **bs = tu_batches_random(&cfg, steps, 2);
    tu_result res;
    tu_run(&cfg, bs, steps, &res);
    char want[64];
    snprintf(want, sizeof want, "eval step %lld: injected", (long long)fail_at);
    RASSERT(res.rc == IFD_ENUMERIC && strstr(res.err.msg, want), "%s: %s (want '%s')",
            ifd_errname(res.rc), res.err.msg, want);
    tu_result_free(&res);
    tu_batches_free(bs, steps);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("eval_predict");
    TCase *tc = tcase_create("eval");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, eval_matches_reference, 0, 8);
    tcase_add_loop_test(tc, eval_error_names_the_step, 0, 3);
    suite_add_tcase(s, tc);
    tc = tcase_create("predict");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, predict_1000_rows_batch_64_r4);
    tcase_add_loop_test(tc, predict_random_shapes, 0, 10);
    tcase_add_test(tc, predict_rejects_labels);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(suite());
}
