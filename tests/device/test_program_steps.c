/* The steps of the built-in programs (linear, softmax, mlp, read) on the cpu op set: gradients
 * against finite differences, losses against a double reference, eval steps against train steps,
 * predictions against a double reference, ties, and the read program that reads every row.
 *
 * Every test draws its shapes and values from BASE_SEED plus its loop index, and prints the seed
 * and the shape when it fails, so a failure can be replayed (-DBASE_SEED=... draws others). */
#include "tests/util/testutil.h"

#include "core/rng.h"
#include "device/step.h"
#include <infeed/infeed.h>
#include <infeed/program.h>
#include "tests/util/numbers.h"
#include "tests/util/program_ref.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- gradients against finite differences ---------------------------------------------------- */

static void check_gradients(const char *name, int tag, int i)
{
    uint64_t seed = tu_test_seed(tag, i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = strcmp(name, "linear") != 0, mlp = strcmp(name, "mlp") == 0;
    int64_t d = rand_between(&rng, 1, 10), k = rand_between(&rng, cls ? 2 : 1, 7),
            rows = rand_between(&rng, 1, 40);
    int64_t h = mlp ? rand_between(&rng, 1, 12) : 0;
    if (!cls && i % 3 == 0)
        k = 1; /* one output: the cpu op set's matrix-vector path */
    ifd_program p;
    tu_make_program_h(&p, name, d, h, k);
    int64_t np = p.nparam_floats;
    ck_assert_int_eq(np, mlp ? d * h + h + h * k + k : d * k + k);
    char hs[32] = "", what[128]; /* "mlp D=3 H=5 K=2 rows=17" */
    if (mlp)
        snprintf(hs, sizeof hs, " H=%lld", (long long)h);
    snprintf(what, sizeof what, "%s D=%lld%s K=%lld rows=%lld", name, (long long)d, hs,
             (long long)k, (long long)rows);

    float *params = tu_falloc(np), *grads = tu_falloc(np), *scratch = tu_falloc(np);
    p.cls->init_params(&p, params, ifd_rng_next(&rng));
    for (int64_t j = 0; j < np; j++)
        params[j] += (float)tu_urand(&rng, -0.5, 0.5);
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    const ifd_tensor *in = tb->b.tensors;

    ifd_step_out out;
    tu_fill_nan(grads, np);
    tu_run_step(&p, in, rows, params, grads, 1.0f, &out);
    ck_assert_msg(isfinite(out.loss), "seed %llu %s: loss %g", (unsigned long long)seed, what,
                  (double)out.loss);

    /* mlp: the central difference of the double reference loss, over a step small enough to
     * cross no ReLU kink but for a few parameters, which are skipped (a kink makes the loss
     * non-differentiable within the step). */
    const float eps = mlp ? 1e-5f : 1e-2f;
    unsigned char *act_up = tu_xmalloc((size_t)(rows * (h ? h : 1)));
    unsigned char *act_dn = tu_xmalloc((size_t)(rows * (h ? h : 1)));
    int64_t skipped = 0;
    double biggest = 0.0;
    for (int64_t j = 0; j < np; j++) {
        char pname[48];
        ck_assert_msg(isfinite(grads[j]), "seed %llu %s: gradient of %s not written (%g)",
                      (unsigned long long)seed, what, tu_param_name(&p, j, pname, sizeof pname),
                      (double)grads[j]);
        /* Divide by the step actually taken in float, not by 2 eps. */
        float orig = params[j], up = orig + eps, dn = orig - eps;
        double lup, ldn;
        if (mlp) {
            int64_t c, a;
            params[j] = up;
            lup = tu_ref_loss_active(&p, in, rows, params, &c, &a, act_up);
            params[j] = dn;
            ldn = tu_ref_loss_active(&p, in, rows, params, &c, &a, act_dn);
        } else {
            ifd_step_out lp, lm;
            params[j] = up;
            tu_run_step(&p, in, rows, params, scratch, 1.0f, &lp);
            params[j] = dn;
            tu_run_step(&p, in, rows, params, scratch, 1.0f, &lm);
            lup = lp.loss;
            ldn = lm.loss;
        }
        params[j] = orig;
        if (mlp && memcmp(act_up, act_dn, (size_t)(rows * h)) != 0) {
            skipped++;
            continue;
        }
        double num = (lup - ldn) / ((double)up - (double)dn);
        double tol = 1e-3 + 2e-2 * fabs(num);
        if (fabs(num) > biggest)
            biggest = fabs(num);
        ck_assert_msg(fabs((double)grads[j] - num) <= tol,
                      "seed %llu %s: d loss / d %s: analytic %.7g, "
                      "central difference %.7g",
                      (unsigned long long)seed, what, tu_param_name(&p, j, pname, sizeof pname),
                      (double)grads[j], num);
    }
    ck_assert_msg(skipped <= np / 10,
                  "seed %llu %s: %lld of %lld parameters skipped at a ReLU kink",
                  (unsigned long long)seed, what, (long long)skipped, (long long)np);
    free(act_up);
    free(act_dn);
    /* The data must make the comparison meaningful: some gradient well above the tolerance. */
    ck_assert_msg(biggest > 1e-2, "seed %llu %s: all gradients tiny (max %g)",
                  (unsigned long long)seed, name, biggest);

    /* The scale multiplies the loss and every gradient. */
    const float scales[] = {0.25f, 1.0f / 3.0f, 4.0f};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        ifd_step_out so;
        tu_fill_nan(scratch, np);
        tu_run_step(&p, in, rows, params, scratch, scales[s], &so);
        double want = (double)scales[s] * (double)out.loss;
        ck_assert_msg(fabs((double)so.loss - want) <= 1e-6 * fabs(want) + 1e-12,
                      "seed %llu %s: scale %g: loss %.9g, want %.9g", (unsigned long long)seed,
                      what, (double)scales[s], (double)so.loss, want);
        for (int64_t j = 0; j < np; j++) {
            char pname[48];
            double g = (double)scales[s] * (double)grads[j];
            /* A scale that is not a power of two rounds differently in each row's term, so
             * components that cancel over the rows get an absolute slack. */
            double tol = 1e-5 * fabs(g) + 1e-6 * (double)scales[s] * biggest;
            ck_assert_msg(fabs((double)scratch[j] - g) <= tol,
                          "seed %llu %s: scale %g: grad %s %.9g, "
                          "want %.9g",
                          (unsigned long long)seed, what, (double)scales[s],
                          tu_param_name(&p, j, pname, sizeof pname), (double)scratch[j], g);
        }
    }
    tu_batch_free(tb);
    free(params);
    free(grads);
    free(scratch);
    ifd_program_free(&p);
}

START_TEST(test_grad_linear)
{
    check_gradients("linear", 1, _i);
}
END_TEST

START_TEST(test_grad_softmax)
{
    check_gradients("softmax", 2, _i);
}
END_TEST

START_TEST(test_grad_mlp)
{
    check_gradients("mlp", 30, _i);
}
END_TEST

/* ---- loss values and the correct count ------------------------------------------------------- */

static void check_loss(const char *name, int tag, int i)
{
    uint64_t seed = tu_test_seed(tag, i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = strcmp(name, "linear") != 0, mlp = strcmp(name, "mlp") == 0;
    int64_t d = rand_between(&rng, 1, 16), k = rand_between(&rng, cls ? 2 : 1, 10),
            rows = rand_between(&rng, 1, 64);
    int64_t h = mlp ? rand_between(&rng, 1, 20) : 0;
    ifd_program p;
    tu_make_program_h(&p, name, d, h, k);
    int64_t np = p.nparam_floats;
    float *params = tu_falloc(np), *grads = tu_falloc(np);
    p.cls->init_params(&p, params, ifd_rng_next(&rng));
    /* Odd iterations use large weights: logits in the hundreds, where a softmax without the
     * max shift overflows (mlp: two layers of weights 10 times larger). */
    double mag = (i % 2) ? (mlp ? 10.0 : 100.0) : 1.0;
    for (int64_t j = 0; j < np; j++)
        params[j] = (float)(mag * (params[j] + tu_urand(&rng, -0.5, 0.5)));
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    int64_t correct = 0, ambiguous = 0;
    double want = tu_ref_loss(&p, tb->b.tensors, rows, params, &correct, &ambiguous);
    ifd_step_out out;
    tu_run_step(&p, tb->b.tensors, rows, params, grads, 1.0f, &out);
    ck_assert_msg(fabs((double)out.loss - want) <= 1e-4 * fabs(want) + 1e-5,
                  "seed %llu %s D=%lld K=%lld rows=%lld scale %g: loss %.9g, reference %.9g",
                  (unsigned long long)seed, name, (long long)d, (long long)k, (long long)rows, mag,
                  (double)out.loss, want);
    if (cls) {
        ck_assert_msg(out.correct >= (float)correct && out.correct <= (float)(correct + ambiguous),
                      "seed %llu %s D=%lld H=%lld K=%lld rows=%lld: correct %g, reference %lld "
                      "(+%lld near ties)",
                      (unsigned long long)seed, name, (long long)d, (long long)h, (long long)k,
                      (long long)rows, (double)out.correct, (long long)correct,
                      (long long)ambiguous);
        ck_assert_msg(ambiguous <= rows / 8, "seed %llu: %lld of %lld rows are near ties",
                      (unsigned long long)seed, (long long)ambiguous, (long long)rows);
    } else {
        ck_assert_msg(out.correct == 0.0f, "linear: correct %g, want 0", (double)out.correct);
    }
    tu_batch_free(tb);
    free(params);
    free(grads);
    ifd_program_free(&p);
}

START_TEST(test_loss_linear)
{
    check_loss("linear", 3, _i);
}
END_TEST

START_TEST(test_loss_softmax)
{
    check_loss("softmax", 4, _i);
}
END_TEST

START_TEST(test_loss_mlp)
{
    check_loss("mlp", 31, _i);
}
END_TEST

/* A random program of the three with random shapes, parameters and a batch of rows rows. */
typedef struct case_data {
    ifd_program p;
    float *params;
    tu_batch *tb;
    int64_t rows;
    char what[128]; /* "seed 5 mlp D=3 H=4 K=2 rows=9" */
} case_data;

static void case_make(case_data *c, const char *name, uint64_t seed)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = strcmp(name, "linear") != 0;
    int64_t d = rand_between(&rng, 1, 12), k = rand_between(&rng, cls ? 2 : 1, 9),
            h = rand_between(&rng, 1, 16);
    c->rows = rand_between(&rng, 1, 48);
    tu_make_program_h(&c->p, name, d, h, k);
    c->params = tu_falloc(c->p.nparam_floats);
    c->p.cls->init_params(&c->p, c->params, ifd_rng_next(&rng));
    for (int64_t j = 0; j < c->p.nparam_floats; j++)
        c->params[j] += (float)tu_urand(&rng, -0.5, 0.5);
    c->tb = tu_batch_random(&c->p, c->rows, 0, &rng);
    snprintf(c->what, sizeof c->what, "seed %llu %s D=%lld H=%lld K=%lld rows=%lld",
             (unsigned long long)seed, name, (long long)d, (long long)(tu_is_mlp(&c->p) ? h : 0),
             (long long)k, (long long)c->rows);
}

static void case_free(case_data *c)
{
    tu_batch_free(c->tb);
    free(c->params);
    ifd_program_free(&c->p);
}

static const char *const all_programs[] = {"linear", "softmax", "mlp"};

/* An eval step (grads NULL) reports the train step's loss and correct count, at any scale. */
START_TEST(test_eval_step_matches_train)
{
    case_data c;
    case_make(&c, all_programs[_i % 3], tu_test_seed(32, _i));
    float scale = 1.0f / (float)(1 + _i % 4);
    float *grads = tu_falloc(c.p.nparam_floats);
    ifd_step_out train, eval;
    tu_run_step(&c.p, c.tb->b.tensors, c.rows, c.params, grads, scale, &train);
    tu_run_any_step(&c.p, c.tb->b.tensors, c.rows, c.params, NULL, scale, &eval, NULL);
    ck_assert_msg(isfinite(train.loss) && train.loss > 0.0f, "%s: train loss %g", c.what,
                  (double)train.loss);
    ck_assert_msg(eval.loss == train.loss && eval.correct == train.correct,
                  "%s scale %g: eval loss %.9g correct %g, train loss %.9g correct %g", c.what,
                  (double)scale, (double)eval.loss, (double)eval.correct, (double)train.loss,
                  (double)train.correct);
    free(grads);
    case_free(&c);
}
END_TEST

/* The predict step from the non-label inputs alone: class probabilities (classifiers) or outputs
 * (linear) equal to a double reference; probabilities sum to 1 in every row; nothing is written
 * past [rows, predict_cols]. */
START_TEST(test_predict_step)
{
    case_data c;
    case_make(&c, all_programs[_i % 3], tu_test_seed(33, _i));
    const ifd_program *p = &c.p;
    int64_t k = p->settings.classes, rows = c.rows;
    ck_assert_ptr_nonnull(p->cls->predict_step);
    ck_assert_int_eq(p->predict_cols, k);
    /* Predict mode hands the step only the inputs that are not labels, in an array of exactly
     * that many (an out-of-bounds read shows under AddressSanitizer). */
    int nfeat = 0;
    ifd_tensor *in = tu_xmalloc(sizeof(ifd_tensor) * IFD_MAX_INPUTS);
    for (int i = 0; i < p->ninputs; i++)
        if (!(p->labels & (1u << i)))
            in[nfeat++] = c.tb->b.tensors[i];
    ck_assert_int_eq(nfeat, 1);
    ifd_tensor *features = tu_xmalloc(sizeof(ifd_tensor) * (size_t)nfeat);
    memcpy(features, in, sizeof(ifd_tensor) * (size_t)nfeat);
    free(in);
    const float guard = 12345.0f;
    float *pred = tu_falloc(rows * k + 4);
    tu_fill_nan(pred, rows * k);
    for (int g = 0; g < 4; g++)
        pred[rows * k + g] = guard;
    ifd_step_out out;
    tu_run_any_step(p, features, rows, c.params, NULL, 1.0f, &out, pred);
    double *z = tu_xmalloc(sizeof(double) * (size_t)k);
    const float *x = features[0].data;
    for (int64_t r = 0; r < rows; r++) {
        tu_ref_logits(p, x + r * p->settings.features, c.params, z, NULL);
        double top = z[0], sum = 0.0, fsum = 0.0;
        for (int64_t j = 1; j < k; j++)
            top = z[j] > top ? z[j] : top;
        for (int64_t j = 0; j < k; j++)
            sum += exp(z[j] - top);
        for (int64_t j = 0; j < k; j++) {
            double want = p->classifier ? exp(z[j] - top) / sum : z[j];
            double got = pred[r * k + j];
            fsum += got;
            ck_assert_msg(fabs(got - want) <= 1e-5 * fabs(want) + 1e-6,
                          "%s: prediction [%lld][%lld] = %.9g, reference %.9g", c.what,
                          (long long)r, (long long)j, got, want);
        }
        if (p->classifier)
            ck_assert_msg(fabs(fsum - 1.0) <= 1e-5, "%s: row %lld's probabilities sum to %.9g",
                          c.what, (long long)r, fsum);
    }
    for (int g = 0; g < 4; g++)
        ck_assert_msg(pred[rows * k + g] == guard, "%s: written past [rows, K]", c.what);
    free(z);
    free(pred);
    free(features);
    case_free(&c);
}
END_TEST

/* All-zero parameters: every logit ties, so the loss is exactly log K, the first class is the
 * prediction, and the bias gradient is the mean of 1/K - onehot(label). */
START_TEST(test_softmax_ties)
{
    uint64_t seed = tu_test_seed(5, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = rand_between(&rng, 1, 8), k = rand_between(&rng, 2, 9),
            rows = rand_between(&rng, 1, 50);
    ifd_program p;
    tu_make_program(&p, "softmax", d, k);
    float *params = calloc((size_t)p.nparam_floats, sizeof(float)),
          *grads = tu_falloc(p.nparam_floats);
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    const int32_t *y = tb->b.tensors[1].data;
    int64_t zeros = 0;
    double *freq = calloc((size_t)k, sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        zeros += y[r] == 0;
        freq[y[r]] += 1.0 / (double)rows;
    }
    ifd_step_out out;
    tu_fill_nan(grads, p.nparam_floats);
    tu_run_step(&p, tb->b.tensors, rows, params, grads, 1.0f, &out);
    ck_assert_msg(fabs((double)out.loss - log((double)k)) <= 1e-6 * log((double)k),
                  "seed %llu K=%lld: loss %.9g, want log K = %.9g", (unsigned long long)seed,
                  (long long)k, (double)out.loss, log((double)k));
    ck_assert_msg(out.correct == (float)zeros,
                  "seed %llu K=%lld rows=%lld: correct %g, want %lld (rows labelled 0: ties go "
                  "to the first class)",
                  (unsigned long long)seed, (long long)k, (long long)rows, (double)out.correct,
                  (long long)zeros);
    const float *db = grads + ifd_program_param(&p, "b")->offset;
    for (int64_t c = 0; c < k; c++) {
        double want = 1.0 / (double)k - freq[c];
        ck_assert_msg(fabs((double)db[c] - want) <= 1e-6,
                      "seed %llu K=%lld rows=%lld: db[%lld] = %.9g, want %.9g",
                      (unsigned long long)seed, (long long)k, (long long)rows, (long long)c,
                      (double)db[c], want);
    }
    free(freq);
    free(params);
    free(grads);
    tu_batch_free(tb);
    ifd_program_free(&p);
}
END_TEST

/* read (the ingest benchmark's program): zero loss and zero gradients whatever the data, and
 * it does read every row: a NaN planted in a random element of x makes the loss NaN. */
START_TEST(test_read_program)
{
    uint64_t seed = tu_test_seed(11, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = rand_between(&rng, 1, 300), rows = rand_between(&rng, 1, 64);
    ifd_program p;
    tu_make_program(&p, "read", d, 0);
    ck_assert_int_eq(p.ninputs, 1);
    ck_assert_int_eq(p.inputs[0].dtype, IFD_F32);
    ck_assert_int_eq(p.nparam_floats, d);
    float *params = tu_falloc(p.nparam_floats), *grads = tu_falloc(p.nparam_floats);
    p.cls->init_params(&p, params, seed);
    for (int64_t i = 0; i < d; i++) /* as after any update: the step must not depend on it */
        params[i] = (float)tu_urand(&rng, -1, 1);
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    ifd_step_out out;
    tu_fill_nan(grads, p.nparam_floats);
    tu_run_step(&p, tb->b.tensors, rows, params, grads, 1.0f / (float)rand_between(&rng, 1, 4),
                &out);
    ck_assert_msg(out.loss == 0.0f, "seed %llu D=%lld rows=%lld: loss %g, want 0",
                  (unsigned long long)seed, (long long)d, (long long)rows, (double)out.loss);
    for (int64_t i = 0; i < d; i++)
        ck_assert_msg(grads[i] == 0.0f, "seed %llu: grad[%lld] = %g, want 0",
                      (unsigned long long)seed, (long long)i, (double)grads[i]);
    float *x = tb->b.tensors[0].data;
    int64_t at = rand_between(&rng, 0, rows * d - 1);
    params[at % d] = 1.0f;
    x[at] = NAN;
    tu_run_step(&p, tb->b.tensors, rows, params, grads, 1.0f, &out);
    ck_assert_msg(isnan(out.loss), "seed %llu D=%lld rows=%lld: a NaN at x[%lld] left loss %g",
                  (unsigned long long)seed, (long long)d, (long long)rows, (long long)at,
                  (double)out.loss);
    tu_batch_free(tb);
    free(params);
    free(grads);
    ifd_program_free(&p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("program_steps");
    TCase *tc = tu_tcase(s, "gradients", 60);
    tcase_add_loop_test(tc, test_grad_linear, 0, 12);
    tcase_add_loop_test(tc, test_grad_softmax, 0, 12);
    tcase_add_loop_test(tc, test_grad_mlp, 0, 16);
    tc = tu_tcase(s, "loss", 60);
    tcase_add_loop_test(tc, test_loss_linear, 0, 12);
    tcase_add_loop_test(tc, test_loss_softmax, 0, 12);
    tcase_add_loop_test(tc, test_loss_mlp, 0, 12);
    tcase_add_loop_test(tc, test_eval_step_matches_train, 0, 12);
    tcase_add_loop_test(tc, test_predict_step, 0, 12);
    tcase_add_loop_test(tc, test_softmax_ties, 0, 6);
    tcase_add_loop_test(tc, test_read_program, 0, 8);
    return tu_run_suite(s);
}
