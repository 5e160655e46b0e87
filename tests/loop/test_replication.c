/* The replication invariant (linear, softmax, mlp): with the MEAN reduction, R replicas over a
 * global batch B end with the parameters of one replica over the same batches; with SUM the
 * reported loss is the sum of the replicas' losses. Every mirror stays bit-identical. */
#include "tests/util/testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const programs[] = {"linear", "softmax"};
static const ifd_optimizer_kind optimizers[] = {IFD_OPT_SGD, IFD_OPT_MOMENTUM, IFD_OPT_ADAM};

static double summary_loss(const tu_result *r, size_t i)
{
    json_error_t je;
    json_t *j = json_loads(r->summaries[i], 0, &je);
    ck_assert_ptr_nonnull(j);
    double v = json_number_value(json_object_get(j, "loss"));
    json_decref(j);
    return v;
}

/* _i picks the program and optimizer; shapes and data are random per case. */
START_TEST(mean_matches_one_replica)
{
    const char *program = programs[_i % 2];
    ifd_optimizer_kind opt = optimizers[(_i / 2) % 3];
    ifd_rng rng;
    ifd_rng_seed(&rng, 5000 + (uint64_t)_i);
    int64_t d = 1 + (int64_t)ifd_rng_below(&rng, 12);
    int64_t k = 2 + (int64_t)ifd_rng_below(&rng, 6);
    int64_t b = 12 * (1 + (int64_t)ifd_rng_below(&rng, 3)); /* divisible by 1..4 */
    ifd_config cfg;
    tu_config_train(&cfg, program, opt, d, k, b, 7, 99 + (uint64_t)_i);
    tu_batch **bs = tu_batches_random(&cfg, cfg.steps, 7000 + (uint64_t)_i);

    tu_result one;
    cfg.replicas = 1;
    tu_run(&cfg, bs, cfg.steps, &one);
    ck_assert_msg(one.rc == IFD_OK, "%s", ifd_error_text(&one.err));
    ck_assert_int_eq(one.global_step, 20);
    for (int r = 2; r <= 4; r++) {
        tu_result many;
        cfg.replicas = r;
        tu_run(&cfg, bs, cfg.steps, &many);
        ck_assert_msg(many.rc == IFD_OK, "%s", ifd_error_text(&many.err));
        ck_assert_int_eq(many.global_step, 20);
        ck_assert_msg(many.mirrors_identical, "R=%d: replica mirrors differ", r);
        double diff = tu_max_rel_diff(many.params, one.params, one.nparams, 1e-2);
        ck_assert_msg(
            diff <= 1e-5, "%s/%s D=%lld K=%lld B=%lld R=%d: params differ from R=1 by %g relative",
            program, ifd_optimizer_name(opt), (long long)d, (long long)k, (long long)b, r, diff);
        /* The reported loss is the same global mean at every step. */
        ck_assert_int_eq(many.nsummaries, one.nsummaries);
        for (size_t i = 0; i + 1 < one.nsummaries; i++) {
            double a = summary_loss(&many, i), e = summary_loss(&one, i);
            ck_assert_msg(fabs(a - e) <= 1e-4 * (fabs(e) + 1e-3), "step %zu loss %g vs %g", i + 1,
                          a, e);
        }
        tu_result_free(&many);
    }
    tu_result_free(&one);
    tu_batches_free(bs, cfg.steps);
}
END_TEST

/* mlp: R replicas (random R) with MEAN end where one replica over the same global batches does,
 * up to float32 rounding, for every optimizer; every mirror bit-identical. */
START_TEST(mlp_mean_matches_one_replica)
{
    ifd_optimizer_kind opt = optimizers[_i % 3];
    ifd_rng rng;
    ifd_rng_seed(&rng, 6000 + (uint64_t)_i);
    int r = 2 + (int)ifd_rng_below(&rng, 5);
    int64_t d = 1 + (int64_t)ifd_rng_below(&rng, 12);
    int64_t k = 2 + (int64_t)ifd_rng_below(&rng, 6);
    int64_t h = 1 + (int64_t)ifd_rng_below(&rng, 24);
    int64_t b = r * (1 + (int64_t)ifd_rng_below(&rng, 6));
    ifd_config cfg;
    tu_config_train(&cfg, "mlp", opt, d, k, b, 1 + (int64_t)ifd_rng_below(&rng, 8),
                    77 + (uint64_t)_i);
    cfg.settings.hidden = h;
    tu_batch **bs = tu_batches_random(&cfg, cfg.steps, 8000 + (uint64_t)_i);
    tu_result one, many;
    cfg.replicas = 1;
    tu_run(&cfg, bs, cfg.steps, &one);
    cfg.replicas = r;
    tu_run(&cfg, bs, cfg.steps, &many);
    ck_assert_msg(one.rc == IFD_OK && many.rc == IFD_OK, "%s / %s", ifd_error_text(&one.err),
                  ifd_error_text(&many.err));
    ck_assert_int_eq(many.global_step, 20);
    ck_assert_msg(many.mirrors_identical, "R=%d: replica mirrors differ", r);
    double diff = tu_max_rel_diff(many.params, one.params, one.nparams, 1e-2);
    ck_assert_msg(diff <= 1e-5,
                  "mlp/%s D=%lld H=%lld K=%lld B=%lld R=%d: params differ from R=1 by %g relative",
                  ifd_optimizer_name(opt), (long long)d, (long long)h, (long long)k, (long long)b,
                  r, diff);
    /* The run moved the parameters: the comparison is not between two initial states. */
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, "mlp", &cfg.settings, &err), IFD_OK);
    float *init = malloc(sizeof(float) * (size_t)p.nparam_floats);
    p.cls->init_params(&p, init, cfg.seed);
    ck_assert_msg(tu_max_rel_diff(one.params, init, p.nparam_floats, 1e-2) > 1e-3,
                  "training did not move the parameters");
    free(init);
    tu_result_free(&one);
    tu_result_free(&many);
    tu_batches_free(bs, cfg.steps);
    ifd_program_free(&p);
}
END_TEST

START_TEST(sum_reports_the_sum)
{
    const char *program = programs[_i % 2];
    ifd_rng rng;
    ifd_rng_seed(&rng, 9000 + (uint64_t)_i);
    int r = 2 + (int)ifd_rng_below(&rng, 3);
    int64_t d = 1 + (int64_t)ifd_rng_below(&rng, 10);
    int64_t k = 2 + (int64_t)ifd_rng_below(&rng, 5);
    int64_t b = r * (1 + (int64_t)ifd_rng_below(&rng, 6));
    ifd_config cfg;
    tu_config_train(&cfg, program, IFD_OPT_SGD, d, k, b, 7, 3);
    cfg.steps = 1;
    cfg.replicas = r;
    tu_batch **bs = tu_batches_random(&cfg, 1, 11 + (uint64_t)_i);
    tu_result mean, sum;
    tu_run(&cfg, bs, 1, &mean);
    cfg.loss_reduction = IFD_REDUCE_SUM;
    tu_run(&cfg, bs, 1, &sum);
    ck_assert_int_eq(mean.rc, IFD_OK);
    ck_assert_int_eq(sum.rc, IFD_OK);
    /* Same parameters and data at step 1: the sum of R shard means is R times their mean. */
    double lm = summary_loss(&mean, 0), ls = summary_loss(&sum, 0);
    ck_assert_msg(fabs(ls - r * lm) <= 1e-5 * fabs(r * lm), "R=%d: sum loss %g, mean loss %g", r,
                  ls, lm);
    ck_assert(sum.mirrors_identical);
    /* SUM's gradient is R times MEAN's: with SGD, the first update is R times larger. */
    ifd_program p;
    ifd_error err;
    ifd_program_init(&p, cfg.program, &cfg.settings, &err);
    float *init = malloc(sizeof(float) * (size_t)p.nparam_floats);
    p.cls->init_params(&p, init, cfg.seed);
    for (int64_t i = 0; i < p.nparam_floats; i++) {
        double dm = (double)mean.params[i] - init[i], ds = (double)sum.params[i] - init[i];
        ck_assert_msg(fabs(ds - r * dm) <= 1e-4 * (fabs(r * dm) + 1e-4),
                      "param %lld: sum update %g, mean update %g, R=%d", (long long)i, ds, dm, r);
    }
    free(init);
    tu_result_free(&mean);
    tu_result_free(&sum);
    tu_batches_free(bs, 1);
    ifd_program_free(&p);
}
END_TEST

START_TEST(runs_are_repeatable)
{
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_ADAM, 7, 3, 8, 7, 5);
    cfg.replicas = 4;
    tu_batch **bs = tu_batches_random(&cfg, cfg.steps, 1);
    tu_result a, b;
    tu_run(&cfg, bs, cfg.steps, &a);
    tu_run(&cfg, bs, cfg.steps, &b);
    ck_assert_int_eq(a.rc, IFD_OK);
    ck_assert_mem_eq(a.params, b.params, sizeof(float) * (size_t)a.nparams);
    tu_result_free(&a);
    tu_result_free(&b);
    tu_batches_free(bs, cfg.steps);
}
END_TEST

START_TEST(adam_counts_its_own_updates)
{
    /* Adam's bias correction follows the updates its slots have seen, not the global step: a
     * run that starts at global step 1000 with fresh slots trains exactly like one from 0. */
    ifd_config cfg;
    tu_config_train(&cfg, _i ? "softmax" : "linear", IFD_OPT_ADAM, 4, 3, 6, 7, 21);
    cfg.replicas = 1 + _i;
    tu_batch **bs = tu_batches_random(&cfg, cfg.steps, 5);
    tu_result a, b;
    tu_run(&cfg, bs, cfg.steps, &a);
    cfg.initial_global_step = 1000;
    tu_run(&cfg, bs, cfg.steps, &b);
    ck_assert_int_eq(a.rc, IFD_OK);
    ck_assert_int_eq(b.rc, IFD_OK);
    ck_assert_int_eq(b.global_step, 1020);
    ck_assert_mem_eq(a.params, b.params, sizeof(float) * (size_t)a.nparams);
    tu_result_free(&a);
    tu_result_free(&b);
    tu_batches_free(bs, cfg.steps);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("replication");
    TCase *tc = tcase_create("invariant");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, mean_matches_one_replica, 0, 12);
    tcase_add_loop_test(tc, mlp_mean_matches_one_replica, 0, 9);
    tcase_add_loop_test(tc, sum_reports_the_sum, 0, 6);
    tcase_add_test(tc, runs_are_repeatable);
    tcase_add_loop_test(tc, adam_counts_its_own_updates, 0, 2);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
