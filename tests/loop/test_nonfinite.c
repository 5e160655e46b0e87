/*
 * Non-finite steps (docs/design.md, "Non-finite steps"): a train step whose loss or all-reduced
 * gradients are not finite is skipped on every replica (no parameter, optimizer slot or Adam
 * count changes: a run with poisoned batches ends with the bits of a run without them), counted
 * in the summaries with the batches whose loss was not finite, and max_skipped_steps in a row
 * end the run with a sentence naming them; eval leaves such steps out of its metrics.
 */
#include "tests/util/testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const programs[] = {"softmax", "linear", "mlp"};

/* NaN in the float inputs of rows [lo, hi): a loss (softmax, linear) or gradients (mlp, whose
 * relu zeroes NaN activations but not their weights' gradients) that are not finite. */
static void poison(tu_batch *tb, int64_t lo, int64_t hi)
{
    ifd_tensor *x = &tb->b.tensors[0];
    int64_t cols = ifd_tensor_row_bytes(x) / (int64_t)sizeof(float);
    for (int64_t r = lo; r < hi; r++)
        for (int64_t c = 0; c < cols; c++)
            ((float *)tb->data[0])[r * cols + c] = NAN;
}

/* A summary's field as an integer (-1 when missing). */
static int64_t field_int(const char *line, const char *key)
{
    json_t *j = json_loads(line, 0, NULL);
    json_t *v = json_object_get(j, key);
    int64_t n = json_is_integer(v) ? json_integer_value(v) : -1;
    json_decref(j);
    return n;
}

/* Sums "skipped_steps" over the train summaries and checks every named batch is poisoned;
 * returns how many were named. */
static int64_t summaries_skipped(const tu_result *r, const char *event, const int *poisoned,
                                 int64_t n, int64_t *named)
{
    int64_t total = 0;
    *named = 0;
    for (size_t i = 0; i < r->nsummaries; i++) {
        json_t *j = json_loads(r->summaries[i], 0, NULL);
        ck_assert_ptr_nonnull(j);
        if (strcmp(json_string_value(json_object_get(j, "event")), event) == 0) {
            json_t *k = json_object_get(j, "skipped_steps");
            RASSERT(json_is_integer(k), "no skipped_steps: %s", r->summaries[i]);
            total += json_integer_value(k);
            json_t *bs = json_object_get(j, "skipped_batches"), *b;
            size_t x;
            json_array_foreach(bs, x, b)
            {
                int64_t seq = json_integer_value(json_object_get(b, "seq"));
                RASSERT(seq >= 0 && seq < n && poisoned[seq], "named batch %lld is not poisoned",
                        (long long)seq);
                RASSERT(strcmp(json_string_value(json_object_get(b, "producer")), "test") == 0,
                        "%s", r->summaries[i]);
                (*named)++;
            }
            /* a window of skipped steps only has no loss */
            if (json_integer_value(k) == json_integer_value(json_object_get(j, "steps")))
                RASSERT(json_is_null(json_object_get(j, "loss")), "%s", r->summaries[i]);
            else
                RASSERT(isfinite(json_real_value(json_object_get(j, "loss"))), "%s",
                        r->summaries[i]);
        }
        json_decref(j);
    }
    return total;
}

/* Random runs with random poisoned batches: the run ends where a run over the clean batches
 * alone does, bit for bit, with every replica alike; the summaries count every skipped step and
 * name only poisoned batches. */
START_TEST(skipped_steps_change_nothing)
{
    ifd_rng rng;
    seed_rng(&rng);
    const char *prog = programs[rand_between(&rng, 0, 2)];
    ifd_optimizer_kind opt = (ifd_optimizer_kind)rand_between(&rng, 0, 2);
    int R = (int)rand_between(&rng, 1, 4);
    int64_t b = R * rand_between(&rng, 1, 5);
    ifd_config cfg;
    tu_config_train(&cfg, prog, opt, rand_between(&rng, 1, 9), rand_between(&rng, 2, 5), b,
                    rand_between(&rng, 1, 6), ifd_rng_next(&rng));
    if (strcmp(prog, "mlp") == 0)
        cfg.settings.hidden = rand_between(&rng, 1, 8);
    cfg.replicas = R;
    cfg.summary_every = rand_between(&rng, 1, 5);
    int64_t n = rand_between(&rng, 10, 30);
    cfg.steps = n;
    tu_batch **all = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    int *poisoned = calloc((size_t)n, sizeof(int));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (rand_between(&rng, 0, 3) == 0) { /* some rows of one replica's shard, or all */
            int64_t per = b / R, r = rand_between(&rng, 0, R - 1);
            int64_t lo = r * per + rand_between(&rng, 0, per - 1);
            poison(all[i], lo, rand_between(&rng, 0, 1) ? lo + 1 : (r + 1) * per);
            poisoned[i] = 1;
            bad++;
        }
    cfg.max_skipped_steps = n + 1; /* none of these runs ends for it */
    tu_result got;
    tu_run(&cfg, all, n, &got);
    RASSERT(got.rc == IFD_OK, "%s: %s", prog, ifd_error_text(&got.err));
    RASSERT(got.global_step == n, "global step %lld, expected %lld (skipped steps count)",
            (long long)got.global_step, (long long)n);
    RASSERT(got.mirrors_identical, "replicas differ");

    tu_batch **clean = calloc((size_t)n, sizeof *clean);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (!poisoned[i])
            clean[m++] = all[i];
    ifd_config ref_cfg = cfg;
    ref_cfg.steps = m;
    tu_result ref;
    if (m > 0) {
        tu_run(&ref_cfg, clean, m, &ref);
        RASSERT(ref.rc == IFD_OK, "reference: %s", ifd_error_text(&ref.err));
    } else {
        ifd_program p;
        ifd_error err;
        ifd_program_init(&p, cfg.program, &cfg.settings, &err);
        ref.nparams = p.nparam_floats; /* every step skipped: the initial parameters stay */
        ref.params = NULL;
        ifd_program_free(&p);
    }
    if (ref.params)
        RASSERT(memcmp(got.params, ref.params, sizeof(float) * (size_t)ref.nparams) == 0,
                "%s %s R=%d, %lld of %lld batches poisoned: the parameters differ from a run "
                "without them (max rel %g)",
                prog, ifd_optimizer_name(opt), R, (long long)bad, (long long)n,
                tu_max_rel_diff(got.params, ref.params, ref.nparams, 1e-6));

    int64_t named;
    RASSERT(summaries_skipped(&got, "train", poisoned, n, &named) == bad,
            "summaries count %lld skipped steps, expected %lld",
            (long long)summaries_skipped(&got, "train", poisoned, n, &named), (long long)bad);
    if (strcmp(prog, "mlp") != 0) /* their loss is not finite: the batch is known */
        RASSERT(named >= (bad < 16 ? bad : 1), "%lld of %lld skipped batches named",
                (long long)named, (long long)bad);
    const char *end = got.summaries[got.nsummaries - 1];
    RASSERT(field_int(end, "skipped_steps") == bad, "end: %s", end);
    tu_result_free(&got);
    if (m > 0)
        tu_result_free(&ref);
    free(clean);
    free(poisoned);
    tu_batches_free(all, n);
}
END_TEST

/* k poisoned batches in a row: max_skipped_steps k ends the run at the k-th with IFD_ENUMERIC
 * and a sentence naming them; k + 1 lets it finish. */
START_TEST(too_many_in_a_row_end_the_run)
{
    ifd_rng rng;
    seed_rng(&rng);
    int R = (int)rand_between(&rng, 1, 3);
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, rand_between(&rng, 2, 8),
                    rand_between(&rng, 2, 5), R * rand_between(&rng, 1, 4),
                    rand_between(&rng, 1, 5), ifd_rng_next(&rng));
    cfg.replicas = R;
    int64_t n = rand_between(&rng, 12, 24), k = rand_between(&rng, 1, 5);
    int64_t at = rand_between(&rng, 0, n - k); /* batches [at, at + k) */
    cfg.steps = n;
    tu_batch **bs = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    for (int64_t i = at; i < at + k; i++)
        poison(bs[i], 0, cfg.batch_size);
    cfg.max_skipped_steps = k;
    tu_result r;
    tu_run(&cfg, bs, n, &r);
    RASSERT(r.rc == IFD_ENUMERIC, "max %lld, %lld in a row: rc %s (%s)", (long long)k, (long long)k,
            ifd_errname(r.rc), ifd_error_text(&r.err));
    const char *msg = ifd_error_text(&r.err);
    char want[160];
    snprintf(want, sizeof want, "%lld steps in a row (global steps %lld to %lld) were skipped",
             (long long)k, (long long)at + 1, (long long)(at + k));
    RASSERT(strstr(msg, want) != NULL, "'%s' not in: %s", want, msg);
    snprintf(want, sizeof want, "producer 'test' batch %lld (step %lld)", (long long)at,
             (long long)at + 1);
    RASSERT(strstr(msg, want) != NULL, "'%s' not in: %s", want, msg);
    RASSERT(strstr(msg, "max_skipped_steps") != NULL, "%s", msg);
    RASSERT(r.global_step >= at + k, "ended at step %lld, before the %lld-th skip",
            (long long)r.global_step, (long long)k);
    tu_result_free(&r);

    cfg.max_skipped_steps = rand_between(&rng, 0, 1) ? k + 1 : 0; /* 0: never */
    tu_run(&cfg, bs, n, &r);
    RASSERT(r.rc == IFD_OK, "max %lld: %s", (long long)cfg.max_skipped_steps,
            ifd_error_text(&r.err));
    RASSERT(r.global_step == n, "step %lld", (long long)r.global_step);
    tu_result_free(&r);
    tu_batches_free(bs, n);
}
END_TEST

/* A program whose loss stays finite while a gradient is not (an input row starting with 777):
 * the step is skipped all the same, and no batch is named. */
static int finite_loss_nan_grad(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                                ifd_error *err)
{
    int rc = tu_softmax_step(p, ops, a, err);
    const float *x = a->inputs[0].data;
    if (rc == IFD_OK && a->grads && a->rows > 0 && x[0] == 777.0f)
        a->grads[p->nparam_floats - 1] = INFINITY;
    return rc;
}

START_TEST(nonfinite_gradients_with_a_finite_loss)
{
    ck_assert_int_eq(tu_register_softmax_like("nan_grad", finite_loss_nan_grad), IFD_OK);
    ifd_rng rng;
    seed_rng(&rng);
    int R = (int)rand_between(&rng, 1, 3);
    ifd_config cfg;
    tu_config_train(&cfg, "nan_grad", IFD_OPT_ADAM, rand_between(&rng, 2, 6),
                    rand_between(&rng, 2, 4), R * rand_between(&rng, 1, 3), 3, ifd_rng_next(&rng));
    cfg.replicas = R;
    int64_t n = 12;
    cfg.steps = n;
    tu_batch **bs = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    int64_t victim = rand_between(&rng, 0, n - 1);
    int64_t per = cfg.batch_size / R;
    ((float *)bs[victim]->data[0])[rand_between(&rng, 0, R - 1) * per * cfg.settings.features] =
        777.0f;
    tu_result r;
    tu_run(&cfg, bs, n, &r);
    RASSERT(r.rc == IFD_OK, "%s", ifd_error_text(&r.err));
    int *poisoned = calloc((size_t)n, sizeof(int));
    poisoned[victim] = 1;
    int64_t named;
    RASSERT(summaries_skipped(&r, "train", poisoned, n, &named) == 1, "skipped steps");
    RASSERT(named == 0, "a batch was named although every loss was finite");
    tu_result_free(&r);
    free(poisoned);
    tu_batches_free(bs, n);
}
END_TEST

/* Eval: a step with a loss that is not finite is left out of the loss and accuracy, which are
 * those of an eval over the other batches. */
START_TEST(eval_leaves_out_nonfinite_steps)
{
    ifd_rng rng;
    seed_rng(&rng);
    int R = (int)rand_between(&rng, 1, 4);
    ifd_config cfg;
    tu_config_train(&cfg, programs[rand_between(&rng, 0, 1)], IFD_OPT_SGD, rand_between(&rng, 2, 8),
                    rand_between(&rng, 2, 5), R * rand_between(&rng, 1, 4), 1, ifd_rng_next(&rng));
    cfg.replicas = R;
    cfg.mode = IFD_MODE_EVAL;
    int64_t n = rand_between(&rng, 6, 16);
    cfg.steps = n;
    cfg.iterations_per_loop = n;
    tu_batch **bs = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    int *poisoned = calloc((size_t)n, sizeof(int));
    tu_batch **clean = calloc((size_t)n, sizeof *clean);
    int64_t m = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 && rand_between(&rng, 0, 2) == 0) {
            poison(bs[i], 0, 1 + rand_between(&rng, 0, cfg.batch_size - 1));
            poisoned[i] = 1;
            bad++;
        } else {
            clean[m++] = bs[i];
        }
    }
    tu_result got, ref;
    tu_run(&cfg, bs, n, &got);
    RASSERT(got.rc == IFD_OK, "%s", ifd_error_text(&got.err));
    ifd_config rc = cfg;
    rc.steps = rc.iterations_per_loop = m;
    tu_run(&rc, clean, m, &ref);
    RASSERT(ref.rc == IFD_OK, "%s", ifd_error_text(&ref.err));
    int64_t named;
    RASSERT(summaries_skipped(&got, "eval", poisoned, n, &named) == bad, "eval skipped steps");
    json_t *a = NULL, *e = NULL;
    for (size_t i = 0; i < got.nsummaries; i++)
        if (strstr(got.summaries[i], "\"event\":\"eval\""))
            a = json_loads(got.summaries[i], 0, NULL);
    for (size_t i = 0; i < ref.nsummaries; i++)
        if (strstr(ref.summaries[i], "\"event\":\"eval\""))
            e = json_loads(ref.summaries[i], 0, NULL);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(e);
    double la = json_real_value(json_object_get(a, "loss")),
           le = json_real_value(json_object_get(e, "loss"));
    RASSERT(la == le, "eval loss %.17g, without the bad batches %.17g", la, le);
    RASSERT(json_integer_value(json_object_get(a, "examples")) ==
                n * cfg.batch_size, /* every row was read */
            "examples %lld", (long long)json_integer_value(json_object_get(a, "examples")));
    json_decref(a);
    json_decref(e);
    tu_result_free(&got);
    tu_result_free(&ref);
    free(poisoned);
    free(clean);
    tu_batches_free(bs, n);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("nonfinite");
    TCase *tc = tcase_create("nonfinite");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, skipped_steps_change_nothing, 0, 12);
    tcase_add_loop_test(tc, too_many_in_a_row_end_the_run, 0, 4);
    tcase_add_loop_test(tc, nonfinite_gradients_with_a_finite_loss, 0, 3);
    tcase_add_loop_test(tc, eval_leaves_out_nonfinite_steps, 0, 4);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
