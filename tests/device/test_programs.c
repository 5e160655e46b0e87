/* The built-in programs (linear, softmax, mlp) run directly on the cpu op set: gradients against
 * finite differences, losses against a double reference, eval steps against train steps,
 * predictions against a double reference, label checks, setup errors, learning through
 * ifd_step_train with one replica, the optimizer formulas, and the cpu all-reduce.
 *
 * Every test draws its shapes and values from BASE_SEED plus its loop index, and prints the seed
 * and the shape when it fails, so a failure can be replayed. */
#include "core/rng.h"
#include "core/thread.h"
#include "device/cpu/allreduce.h"
#include "device/step.h"
#include "infeed/infeed.h"
#include "infeed/program.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef BASE_SEED /* -DBASE_SEED=... replays the suite with other draws */
#define BASE_SEED 0x7E57B10Cull
#endif

extern const ifd_program_class ifd_program_linear;

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t test_seed(int tag, int i)
{
    return BASE_SEED + 1000003ull * (uint64_t)tag + (uint64_t)i;
}

static double urand(ifd_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ifd_rng_uniform(r);
}

/* Uniform integer in [lo, hi]. */
static int64_t irange(ifd_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)ifd_rng_below(r, (uint64_t)(hi - lo + 1));
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

static float *falloc(int64_t n)
{
    return xmalloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
}

static void fill_nan(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* h: the hidden width (mlp; ignored by the others). */
static void make_program_h(ifd_program *p, const char *name, int64_t d, int64_t h, int64_t k)
{
    ifd_program_settings s = {.features = d, .classes = k, .hidden = h};
    ifd_error err = {0};
    int rc = ifd_program_init(p, name, &s, &err);
    ck_assert_msg(rc == IFD_OK, "ifd_program_init(%s, D=%lld, H=%lld, K=%lld): %s", name,
                  (long long)d, (long long)h, (long long)k, ifd_error_text(&err));
}

static void make_program(ifd_program *p, const char *name, int64_t d, int64_t k)
{
    make_program_h(p, name, d, 0, k);
}

static int is_mlp(const ifd_program *p)
{
    return strcmp(p->cls->name, "mlp") == 0;
}

/* One direct step on the cpu ops, over a fresh NaN-filled workspace: train_step (eval when
 * grads is NULL), or predict_step when pred is not NULL (in: the non-label inputs). */
static void run_any_step(const ifd_program *p, const ifd_tensor *in, int64_t rows,
                         const float *params, float *grads, float scale, ifd_step_out *out,
                         float *pred)
{
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    int64_t ws = p->cls->workspace_floats(p, rows);
    float *work = falloc(ws);
    fill_nan(work, ws);
    memset(out, 0, sizeof *out);
    ifd_step_args a = {
        .inputs = in,
        .rows = rows,
        .params = params,
        .grads = grads,
        .workspace = work,
        .scale = scale,
        .out = out,
        .predictions = pred,
    };
    ifd_error err = {0};
    int rc = pred ? p->cls->predict_step(p, &ops, &a, &err) : p->cls->train_step(p, &ops, &a, &err);
    ck_assert_msg(rc == IFD_OK, "%s: %s", pred ? "predict_step" : "train_step",
                  ifd_error_text(&err));
    free(work);
}

static void run_step(const ifd_program *p, const ifd_tensor *in, int64_t rows, const float *params,
                     float *grads, float scale, ifd_step_out *out)
{
    run_any_step(p, in, rows, params, grads, scale, out, NULL);
}

/* The name of flat parameter j ("W[2][1]", "b1[0]") for messages. */
static const char *param_name(const ifd_program *p, int64_t j, char *buf, size_t len)
{
    snprintf(buf, len, "param %lld", (long long)j);
    for (int i = 0; i < p->nparams; i++) {
        const ifd_param_spec *ps = &p->params[i];
        int64_t at = j - ps->offset;
        if (at < 0 || at >= ps->count)
            continue;
        if (ps->rank == 2)
            snprintf(buf, len, "%s[%lld][%lld]", ps->name, (long long)(at / ps->dims[1]),
                     (long long)(at % ps->dims[1]));
        else
            snprintf(buf, len, "%s[%lld]", ps->name, (long long)at);
    }
    return buf;
}

/* z[c] = b[c] + sum over j of x[j] w[j, c], in double: one row of a dense layer. */
static void ref_dense(int64_t n_in, int64_t n_out, const double *x, const float *w, const float *b,
                      double *z)
{
    for (int64_t c = 0; c < n_out; c++) {
        double s = b[c];
        for (int64_t j = 0; j < n_in; j++)
            s += x[j] * (double)w[j * n_out + c];
        z[c] = s;
    }
}

/* The logits (or linear outputs) z [K] of one row x [D], in double. mlp: through the hidden
 * layer, and active[j] (when not NULL) says whether hidden unit j is positive. */
static void ref_logits(const ifd_program *p, const float *x, const float *params, double *z,
                       unsigned char *active)
{
    int64_t d = p->settings.features, k = p->settings.classes, h = p->settings.hidden;
    int64_t width = is_mlp(p) ? (d > h ? d : h) : d;
    double *a = xmalloc(sizeof(double) * (size_t)width),
           *hid = xmalloc(sizeof(double) * (size_t)width);
    for (int64_t j = 0; j < d; j++)
        a[j] = x[j];
    if (is_mlp(p)) {
        const float *w1 = params + ifd_program_param(p, "W1")->offset;
        const float *b1 = params + ifd_program_param(p, "b1")->offset;
        ref_dense(d, h, a, w1, b1, hid);
        for (int64_t j = 0; j < h; j++) {
            if (active)
                active[j] = hid[j] > 0.0;
            a[j] = hid[j] > 0.0 ? hid[j] : 0.0;
        }
        d = h;
        ref_dense(d, k, a, params + ifd_program_param(p, "W2")->offset,
                  params + ifd_program_param(p, "b2")->offset, z);
    } else {
        ref_dense(d, k, a, params + ifd_program_param(p, "W")->offset,
                  params + ifd_program_param(p, "b")->offset, z);
    }
    free(a);
    free(hid);
}

/*
 * The double-precision reference loss of one batch (mean over rows of the softmax cross-entropy,
 * or of 0.5 |pred - y|^2). For classifiers, *correct counts rows whose argmax is clearly the label
 * and *ambiguous the rows whose top two logits are too close for float32 to decide. mlp: active
 * (when not NULL) receives the [rows, H] mask of positive hidden units.
 */
static double ref_loss_active(const ifd_program *p, const ifd_tensor *in, int64_t rows,
                              const float *params, int64_t *correct, int64_t *ambiguous,
                              unsigned char *active)
{
    int64_t d = p->settings.features, k = p->settings.classes;
    const float *x = in[0].data;
    double *z = xmalloc(sizeof(double) * (size_t)k);
    double total = 0.0;
    *correct = 0;
    *ambiguous = 0;
    for (int64_t r = 0; r < rows; r++) {
        ref_logits(p, x + r * d, params, z, active ? active + r * p->settings.hidden : NULL);
        if (p->classifier) {
            int32_t y = ((const int32_t *)in[1].data)[r];
            int64_t arg = 0;
            for (int64_t c = 1; c < k; c++)
                if (z[c] > z[arg])
                    arg = c;
            double second = -INFINITY, sum = 0.0;
            for (int64_t c = 0; c < k; c++) {
                if (c != arg && z[c] > second)
                    second = z[c];
                sum += exp(z[c] - z[arg]);
            }
            total += z[arg] + log(sum) - z[y];
            if (z[arg] - second < 1e-4 * (1.0 + fabs(z[arg])))
                (*ambiguous)++;
            else if (arg == y)
                (*correct)++;
        } else {
            const float *y = (const float *)in[1].data + r * k;
            double s = 0.0;
            for (int64_t c = 0; c < k; c++)
                s += (z[c] - y[c]) * (z[c] - y[c]);
            total += 0.5 * s;
        }
    }
    free(z);
    return total / (double)rows;
}

static double ref_loss(const ifd_program *p, const ifd_tensor *in, int64_t rows,
                       const float *params, int64_t *correct, int64_t *ambiguous)
{
    return ref_loss_active(p, in, rows, params, correct, ambiguous, NULL);
}

/* Whether the decimal number v appears in s as a whole number (not part of a longer one). */
static int has_number(const char *s, long long v)
{
    char num[32];
    snprintf(num, sizeof num, "%lld", v);
    size_t len = strlen(num);
    for (const char *q = strstr(s, num); q; q = strstr(q + 1, num)) {
        int before_ok = q == s || !((q[-1] >= '0' && q[-1] <= '9') || (v >= 0 && q[-1] == '-'));
        int after_ok = !(q[len] >= '0' && q[len] <= '9');
        if (before_ok && after_ok)
            return 1;
    }
    return 0;
}

/* ---- 1. gradients against finite differences ---------------------------------------------- */

static void check_gradients(const char *name, int tag, int i)
{
    uint64_t seed = test_seed(tag, i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = strcmp(name, "linear") != 0, mlp = strcmp(name, "mlp") == 0;
    int64_t d = irange(&rng, 1, 10), k = irange(&rng, cls ? 2 : 1, 7), rows = irange(&rng, 1, 40);
    int64_t h = mlp ? irange(&rng, 1, 12) : 0;
    if (!cls && i % 3 == 0)
        k = 1; /* one output: the cpu op set's matrix-vector path */
    ifd_program p;
    make_program_h(&p, name, d, h, k);
    int64_t np = p.nparam_floats;
    ck_assert_int_eq(np, mlp ? d * h + h + h * k + k : d * k + k);
    char hs[32] = "", what[128]; /* "mlp D=3 H=5 K=2 rows=17" */
    if (mlp)
        snprintf(hs, sizeof hs, " H=%lld", (long long)h);
    snprintf(what, sizeof what, "%s D=%lld%s K=%lld rows=%lld", name, (long long)d, hs,
             (long long)k, (long long)rows);

    float *params = falloc(np), *grads = falloc(np), *scratch = falloc(np);
    p.cls->init_params(&p, params, ifd_rng_next(&rng));
    for (int64_t j = 0; j < np; j++)
        params[j] += (float)urand(&rng, -0.5, 0.5);
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    const ifd_tensor *in = tb->b.tensors;

    ifd_step_out out;
    fill_nan(grads, np);
    run_step(&p, in, rows, params, grads, 1.0f, &out);
    ck_assert_msg(isfinite(out.loss), "seed %llu %s: loss %g", (unsigned long long)seed, what,
                  (double)out.loss);

    /* mlp: the central difference of the double reference loss, over a step small enough to
     * cross no ReLU kink but for a few parameters, which are skipped (a kink makes the loss
     * non-differentiable within the step). */
    const float eps = mlp ? 1e-5f : 1e-2f;
    unsigned char *act_up = xmalloc((size_t)(rows * (h ? h : 1)));
    unsigned char *act_dn = xmalloc((size_t)(rows * (h ? h : 1)));
    int64_t skipped = 0;
    double biggest = 0.0;
    for (int64_t j = 0; j < np; j++) {
        char pname[48];
        ck_assert_msg(isfinite(grads[j]), "seed %llu %s: gradient of %s not written (%g)",
                      (unsigned long long)seed, what, param_name(&p, j, pname, sizeof pname),
                      (double)grads[j]);
        /* Divide by the step actually taken in float, not by 2 eps. */
        float orig = params[j], up = orig + eps, dn = orig - eps;
        double lup, ldn;
        if (mlp) {
            int64_t c, a;
            params[j] = up;
            lup = ref_loss_active(&p, in, rows, params, &c, &a, act_up);
            params[j] = dn;
            ldn = ref_loss_active(&p, in, rows, params, &c, &a, act_dn);
        } else {
            ifd_step_out lp, lm;
            params[j] = up;
            run_step(&p, in, rows, params, scratch, 1.0f, &lp);
            params[j] = dn;
            run_step(&p, in, rows, params, scratch, 1.0f, &lm);
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
                      (unsigned long long)seed, what, param_name(&p, j, pname, sizeof pname),
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
        fill_nan(scratch, np);
        run_step(&p, in, rows, params, scratch, scales[s], &so);
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
                          param_name(&p, j, pname, sizeof pname), (double)scratch[j], g);
        }
    }
    tu_batch_free(tb);
    free(params);
    free(grads);
    free(scratch);
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

/* ---- 2. loss values and the correct count -------------------------------------------------- */

static void check_loss(const char *name, int tag, int i)
{
    uint64_t seed = test_seed(tag, i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = strcmp(name, "linear") != 0, mlp = strcmp(name, "mlp") == 0;
    int64_t d = irange(&rng, 1, 16), k = irange(&rng, cls ? 2 : 1, 10), rows = irange(&rng, 1, 64);
    int64_t h = mlp ? irange(&rng, 1, 20) : 0;
    ifd_program p;
    make_program_h(&p, name, d, h, k);
    int64_t np = p.nparam_floats;
    float *params = falloc(np), *grads = falloc(np);
    p.cls->init_params(&p, params, ifd_rng_next(&rng));
    /* Odd iterations use large weights: logits in the hundreds, where a softmax without the
     * max shift overflows (mlp: two layers of weights 10 times larger). */
    double mag = (i % 2) ? (mlp ? 10.0 : 100.0) : 1.0;
    for (int64_t j = 0; j < np; j++)
        params[j] = (float)(mag * (params[j] + urand(&rng, -0.5, 0.5)));
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    int64_t correct = 0, ambiguous = 0;
    double want = ref_loss(&p, tb->b.tensors, rows, params, &correct, &ambiguous);
    ifd_step_out out;
    run_step(&p, tb->b.tensors, rows, params, grads, 1.0f, &out);
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
    int64_t d = irange(&rng, 1, 12), k = irange(&rng, cls ? 2 : 1, 9), h = irange(&rng, 1, 16);
    c->rows = irange(&rng, 1, 48);
    make_program_h(&c->p, name, d, h, k);
    c->params = falloc(c->p.nparam_floats);
    c->p.cls->init_params(&c->p, c->params, ifd_rng_next(&rng));
    for (int64_t j = 0; j < c->p.nparam_floats; j++)
        c->params[j] += (float)urand(&rng, -0.5, 0.5);
    c->tb = tu_batch_random(&c->p, c->rows, 0, &rng);
    snprintf(c->what, sizeof c->what, "seed %llu %s D=%lld H=%lld K=%lld rows=%lld",
             (unsigned long long)seed, name, (long long)d, (long long)(is_mlp(&c->p) ? h : 0),
             (long long)k, (long long)c->rows);
}

static void case_free(case_data *c)
{
    tu_batch_free(c->tb);
    free(c->params);
}

static const char *const all_programs[] = {"linear", "softmax", "mlp"};

/* An eval step (grads NULL) reports the train step's loss and correct count, at any scale. */
START_TEST(test_eval_step_matches_train)
{
    case_data c;
    case_make(&c, all_programs[_i % 3], test_seed(32, _i));
    float scale = 1.0f / (float)(1 + _i % 4);
    float *grads = falloc(c.p.nparam_floats);
    ifd_step_out train, eval;
    run_step(&c.p, c.tb->b.tensors, c.rows, c.params, grads, scale, &train);
    run_any_step(&c.p, c.tb->b.tensors, c.rows, c.params, NULL, scale, &eval, NULL);
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
    case_make(&c, all_programs[_i % 3], test_seed(33, _i));
    const ifd_program *p = &c.p;
    int64_t k = p->settings.classes, rows = c.rows;
    ck_assert_ptr_nonnull(p->cls->predict_step);
    ck_assert_int_eq(p->predict_cols, k);
    /* Predict mode hands the step only the inputs that are not labels, in an array of exactly
     * that many (an out-of-bounds read shows under AddressSanitizer). */
    int nfeat = 0;
    ifd_tensor *in = xmalloc(sizeof(ifd_tensor) * IFD_MAX_INPUTS);
    for (int i = 0; i < p->ninputs; i++)
        if (!(p->labels & (1u << i)))
            in[nfeat++] = c.tb->b.tensors[i];
    ck_assert_int_eq(nfeat, 1);
    ifd_tensor *features = xmalloc(sizeof(ifd_tensor) * (size_t)nfeat);
    memcpy(features, in, sizeof(ifd_tensor) * (size_t)nfeat);
    free(in);
    const float guard = 12345.0f;
    float *pred = falloc(rows * k + 4);
    fill_nan(pred, rows * k);
    for (int g = 0; g < 4; g++)
        pred[rows * k + g] = guard;
    ifd_step_out out;
    run_any_step(p, features, rows, c.params, NULL, 1.0f, &out, pred);
    double *z = xmalloc(sizeof(double) * (size_t)k);
    const float *x = features[0].data;
    for (int64_t r = 0; r < rows; r++) {
        ref_logits(p, x + r * p->settings.features, c.params, z, NULL);
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
    uint64_t seed = test_seed(5, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = irange(&rng, 1, 8), k = irange(&rng, 2, 9), rows = irange(&rng, 1, 50);
    ifd_program p;
    make_program(&p, "softmax", d, k);
    float *params = calloc((size_t)p.nparam_floats, sizeof(float)),
          *grads = falloc(p.nparam_floats);
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    const int32_t *y = tb->b.tensors[1].data;
    int64_t zeros = 0;
    double *freq = calloc((size_t)k, sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        zeros += y[r] == 0;
        freq[y[r]] += 1.0 / (double)rows;
    }
    ifd_step_out out;
    fill_nan(grads, p.nparam_floats);
    run_step(&p, tb->b.tensors, rows, params, grads, 1.0f, &out);
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
}
END_TEST

/* read (the ingest benchmark's program): zero loss and zero gradients whatever the data, and
 * it does read every row: a NaN planted in a random element of x makes the loss NaN. */
START_TEST(test_read_program)
{
    uint64_t seed = test_seed(11, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = irange(&rng, 1, 300), rows = irange(&rng, 1, 64);
    ifd_program p;
    make_program(&p, "read", d, 0);
    ck_assert_int_eq(p.ninputs, 1);
    ck_assert_int_eq(p.inputs[0].dtype, IFD_F32);
    ck_assert_int_eq(p.nparam_floats, d);
    float *params = falloc(p.nparam_floats), *grads = falloc(p.nparam_floats);
    p.cls->init_params(&p, params, seed);
    for (int64_t i = 0; i < d; i++) /* as after any update: the step must not depend on it */
        params[i] = (float)urand(&rng, -1, 1);
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    ifd_step_out out;
    fill_nan(grads, p.nparam_floats);
    run_step(&p, tb->b.tensors, rows, params, grads, 1.0f / (float)irange(&rng, 1, 4), &out);
    ck_assert_msg(out.loss == 0.0f, "seed %llu D=%lld rows=%lld: loss %g, want 0",
                  (unsigned long long)seed, (long long)d, (long long)rows, (double)out.loss);
    for (int64_t i = 0; i < d; i++)
        ck_assert_msg(grads[i] == 0.0f, "seed %llu: grad[%lld] = %g, want 0",
                      (unsigned long long)seed, (long long)i, (double)grads[i]);
    float *x = tb->b.tensors[0].data;
    int64_t at = irange(&rng, 0, rows * d - 1);
    params[at % d] = 1.0f;
    x[at] = NAN;
    run_step(&p, tb->b.tensors, rows, params, grads, 1.0f, &out);
    ck_assert_msg(isnan(out.loss), "seed %llu D=%lld rows=%lld: a NaN at x[%lld] left loss %g",
                  (unsigned long long)seed, (long long)d, (long long)rows, (long long)at,
                  (double)out.loss);
    tu_batch_free(tb);
    free(params);
    free(grads);
}
END_TEST

/* ---- 3. check_batch ------------------------------------------------------------------------ */

/* softmax and mlp: every label in [0, K), else IFD_ERANGE naming the row and the label. */
START_TEST(test_softmax_check_batch)
{
    uint64_t seed = test_seed(6, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = irange(&rng, 1, 6), k = irange(&rng, 2, 12), rows = irange(&rng, 2, 40);
    const char *name = (_i / 4) % 2 ? "mlp" : "softmax";
    ifd_program p;
    make_program_h(&p, name, d, 5, k);
    ck_assert_ptr_nonnull(p.cls->check_batch);
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    int32_t *y = tb->b.tensors[1].data;
    y[0] = 0;
    y[rows - 1] = (int32_t)(k - 1);
    ifd_error err = {0};
    int rc = p.cls->check_batch(&p, tb->b.tensors, rows, &err);
    ck_assert_msg(rc == IFD_OK, "seed %llu K=%lld: valid labels rejected: %s",
                  (unsigned long long)seed, (long long)k, ifd_error_text(&err));

    /* One bad label, at a row other than 0, K and the label itself, so that both numbers can
     * be told apart from the others in the sentence (row 1 always qualifies: bad labels are
     * negative or >= K >= 2). */
    int32_t bad;
    switch (_i % 4) {
    case 0:
        bad = -1;
        break;
    case 1:
        bad = (int32_t)k;
        break;
    case 2:
        bad = (int32_t)(k + irange(&rng, 1, 1000));
        break;
    default:
        bad = (int32_t)-irange(&rng, 2, 100000);
        break;
    }
    int64_t bad_row;
    do
        bad_row = irange(&rng, 1, rows - 1);
    while (bad_row == k || bad_row == bad);
    int32_t saved = y[bad_row];
    y[bad_row] = bad;
    ifd_error_clear(&err);
    rc = p.cls->check_batch(&p, tb->b.tensors, rows, &err);
    ck_assert_msg(
        rc == IFD_ERANGE, "seed %llu K=%lld: label %d at row %lld: rc %s, want IFD_ERANGE",
        (unsigned long long)seed, (long long)k, (int)bad, (long long)bad_row, ifd_errname(rc));
    ck_assert_int_eq(err.code, IFD_ERANGE);
    ck_assert_msg(has_number(err.msg, bad_row), "seed %llu: sentence does not name row %lld: '%s'",
                  (unsigned long long)seed, (long long)bad_row, err.msg);
    ck_assert_msg(has_number(err.msg, bad), "seed %llu: sentence does not name label %d: '%s'",
                  (unsigned long long)seed, (int)bad, err.msg);
    y[bad_row] = saved;
    ck_assert_int_eq(p.cls->check_batch(&p, tb->b.tensors, rows, &err), IFD_OK);
    tu_batch_free(tb);
}
END_TEST

/* ---- 4. setup ------------------------------------------------------------------------------ */

typedef struct setup_case {
    const char *program;
    int64_t features, classes;
    const char *setting; /* the one the sentence must name */
    const char *other;   /* the one it must not */
    int64_t given;
    int64_t hidden; /* mlp */
} setup_case;

static const setup_case setup_cases[] = {
    {"linear", 0, 3, "features", "classes", 0, 0},
    {"linear", -4, 3, "features", "classes", -4, 0},
    {"linear", 4, 0, "classes", "features", 0, 0},
    {"linear", 4, -1, "classes", "features", -1, 0},
    {"linear", (int64_t)1 << 40, 2, "features", "classes", (int64_t)1 << 40, 0},
    {"softmax", 0, 3, "features", "classes", 0, 0},
    {"softmax", 5, 0, "classes", "features", 0, 0},
    {"softmax", 5, 1, "classes", "features", 1, 0},
    {"softmax", 5, (int64_t)1 << 40, "classes", "features", (int64_t)1 << 40, 0},
    {"mlp", 5, 3, "hidden", "features", 0, 0},
    {"mlp", 5, 3, "hidden", "classes", -7, -7},
    {"mlp", 5, 3, "hidden", "features", (int64_t)1 << 40, (int64_t)1 << 40},
    {"mlp", 0, 3, "features", "hidden", 0, 8},
    {"mlp", 5, 1, "classes", "hidden", 1, 8},
};

START_TEST(test_setup_errors)
{
    const setup_case *c = &setup_cases[_i];
    ifd_program p;
    ifd_program_settings s = {.features = c->features, .classes = c->classes, .hidden = c->hidden};
    ifd_error err = {0};
    int rc = ifd_program_init(&p, c->program, &s, &err);
    ck_assert_msg(rc == IFD_EINVAL, "%s features=%lld classes=%lld: rc %s, want IFD_EINVAL",
                  c->program, (long long)c->features, (long long)c->classes, ifd_errname(rc));
    ck_assert_int_eq(err.code, IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, c->setting) != NULL && strstr(err.msg, c->other) == NULL,
                  "%s features=%lld classes=%lld: sentence should name '%s' (only): '%s'",
                  c->program, (long long)c->features, (long long)c->classes, c->setting, err.msg);
    if (c->given == 0) /* 0 is a setting not set (include/infeed/program.h) */
        ck_assert_msg(strstr(err.msg, ", and it is not set") && !strstr(err.msg, "got"),
                      "sentence should say the setting is not set: '%s'", err.msg);
    else
        ck_assert_msg(has_number(err.msg, c->given), "sentence should give the value %lld: '%s'",
                      (long long)c->given, err.msg);
    ck_assert_msg(strstr(err.msg, c->program) != NULL, "sentence should name the program: '%s'",
                  err.msg);
}
END_TEST

START_TEST(test_setup_unknown_program)
{
    ifd_program p;
    ifd_program_settings s = {.features = 3, .classes = 2};
    ifd_error err = {0};
    int rc = ifd_program_init(&p, "resnet_nope", &s, &err);
    ck_assert_msg(rc != IFD_OK && err.code == rc, "unknown program: rc %s", ifd_errname(rc));
    ck_assert_msg(strstr(err.msg, "linear") && strstr(err.msg, "softmax"),
                  "sentence should list the known programs: '%s'", err.msg);
    ck_assert_msg(strstr(err.msg, "resnet_nope"), "sentence should name the program given: '%s'",
                  err.msg);
    ck_assert_ptr_null(ifd_program_find("resnet_nope"));

    ifd_error_clear(&err);
    rc = ifd_program_init(&p, NULL, &s, &err);
    ck_assert_msg(rc != IFD_OK && strstr(err.msg, "linear") && strstr(err.msg, "softmax"),
                  "NULL program: rc %s, '%s'", ifd_errname(rc), err.msg);

    /* A registered program is found and listed; a second registration of its name fails. */
    static ifd_program_class extra;
    extra = ifd_program_linear;
    extra.name = "extra_prog";
    ck_assert_int_eq(ifd_program_register(&extra), IFD_OK);
    ck_assert_ptr_eq(ifd_program_find("extra_prog"), &extra);
    ck_assert_int_eq(ifd_program_register(&extra), IFD_EINVAL);
    char names[256];
    ifd_program_names(names, sizeof names);
    ck_assert_msg(strstr(names, "extra_prog") && strstr(names, "linear") &&
                      strstr(names, "softmax"),
                  "names: '%s'", names);
    ifd_error_clear(&err);
    rc = ifd_program_init(&p, "nope", &s, &err);
    ck_assert_msg(rc != IFD_OK && strstr(err.msg, "extra_prog"),
                  "sentence should list registered programs too: '%s'", err.msg);
    make_program(&p, "extra_prog", 3, 2);
    ck_assert_ptr_eq(p.cls, &extra);
}
END_TEST

/* The layout a valid setup declares, and init_params. */
START_TEST(test_setup_layout)
{
    uint64_t seed = test_seed(7, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = _i % 2;
    const char *name = cls ? "softmax" : "linear";
    int64_t d = irange(&rng, 1, 20), k = irange(&rng, cls ? 2 : 1, 12);
    ifd_program p;
    make_program(&p, name, d, k);
    ck_assert_int_eq(p.classifier, cls);
    ck_assert_int_eq(p.ninputs, 2);
    ck_assert_str_eq(p.inputs[0].name, "x");
    ck_assert_int_eq(p.inputs[0].dtype, IFD_F32);
    ck_assert_int_eq(p.inputs[0].rank, 1);
    ck_assert_int_eq(p.inputs[0].dims[0], d);
    ck_assert_str_eq(p.inputs[1].name, "y");
    if (cls) {
        ck_assert_int_eq(p.inputs[1].dtype, IFD_I32);
        ck_assert_int_eq(p.inputs[1].rank, 0);
    } else {
        ck_assert_int_eq(p.inputs[1].dtype, IFD_F32);
        ck_assert_int_eq(p.inputs[1].rank, 1);
        ck_assert_int_eq(p.inputs[1].dims[0], k);
    }
    const ifd_param_spec *w = ifd_program_param(&p, "W"), *b = ifd_program_param(&p, "b");
    ck_assert_ptr_nonnull(w);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(p.nparams, 2);
    ck_assert_int_eq(w->rank, 2);
    ck_assert_int_eq(w->dims[0], d);
    ck_assert_int_eq(w->dims[1], k);
    ck_assert_int_eq(w->offset, 0);
    ck_assert_int_eq(w->count, d * k);
    ck_assert_int_eq(b->rank, 1);
    ck_assert_int_eq(b->dims[0], k);
    ck_assert_int_eq(b->offset, d * k);
    ck_assert_int_eq(b->count, k);
    ck_assert_int_eq(p.nparam_floats, d * k + k);
    ck_assert_int_ge(p.cls->workspace_floats(&p, 17), 17 * k);

    /* Glorot weights within the bound, zero bias, a function of the seed alone. */
    int64_t np = p.nparam_floats;
    float *a1 = falloc(np), *a2 = falloc(np), *a3 = falloc(np);
    uint64_t s1 = ifd_rng_next(&rng);
    fill_nan(a1, np);
    fill_nan(a2, np);
    p.cls->init_params(&p, a1, s1);
    p.cls->init_params(&p, a2, s1);
    p.cls->init_params(&p, a3, s1 + 1);
    ck_assert_msg(memcmp(a1, a2, sizeof(float) * (size_t)np) == 0, "seed %llu: not deterministic",
                  (unsigned long long)seed);
    double bound = sqrt(6.0 / (double)(d + k)), sumsq = 0.0;
    int differ = 0;
    for (int64_t j = 0; j < d * k; j++) {
        ck_assert_msg(fabs(a1[j]) <= bound * (1 + 1e-6), "W[%lld] = %g outside +-%g", (long long)j,
                      (double)a1[j], bound);
        sumsq += (double)a1[j] * a1[j];
        differ |= a1[j] != a3[j];
    }
    ck_assert_msg(sumsq > 0.0 && differ, "seed %llu D=%lld K=%lld: W is zero or ignores the seed",
                  (unsigned long long)seed, (long long)d, (long long)k);
    for (int64_t c = 0; c < k; c++)
        ck_assert_msg(a1[d * k + c] == 0.0f, "b[%lld] = %g, want 0", (long long)c,
                      (double)a1[d * k + c]);
    free(a1);
    free(a2);
    free(a3);
}
END_TEST

/* mlp's layout: x and the label y; W1 [D,H], b1 [H], W2 [H,K], b2 [K] in that order; Glorot
 * weights within their bounds from two different streams, zero biases, a function of the seed. */
START_TEST(test_mlp_layout)
{
    uint64_t seed = test_seed(34, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = irange(&rng, 1, 20), h = irange(&rng, 1, 24), k = irange(&rng, 2, 12);
    ifd_program p;
    make_program_h(&p, "mlp", d, h, k);
    ck_assert_int_eq(p.classifier, 1);
    ck_assert_int_eq(p.predict_cols, k);
    ck_assert_int_eq(p.ninputs, 2);
    ck_assert_str_eq(p.inputs[0].name, "x");
    ck_assert_int_eq(p.inputs[0].dtype, IFD_F32);
    ck_assert_int_eq(p.inputs[0].dims[0], d);
    ck_assert_str_eq(p.inputs[1].name, "y");
    ck_assert_int_eq(p.inputs[1].dtype, IFD_I32);
    ck_assert_int_eq(p.inputs[1].rank, 0);
    ck_assert_uint_eq(p.labels, 2u);
    static const char *const names[] = {"W1", "b1", "W2", "b2"};
    int64_t dims[4][2] = {{d, h}, {h, 0}, {h, k}, {k, 0}}, offset = 0;
    ck_assert_int_eq(p.nparams, 4);
    for (int i = 0; i < 4; i++) {
        const ifd_param_spec *ps = ifd_program_param(&p, names[i]);
        ck_assert_ptr_eq(ps, &p.params[i]);
        ck_assert_int_eq(ps->rank, dims[i][1] ? 2 : 1);
        ck_assert_int_eq(ps->dims[0], dims[i][0]);
        if (dims[i][1])
            ck_assert_int_eq(ps->dims[1], dims[i][1]);
        ck_assert_int_eq(ps->offset, offset);
        ck_assert_int_eq(ps->count, dims[i][0] * (dims[i][1] ? dims[i][1] : 1));
        offset += ps->count;
    }
    ck_assert_int_eq(p.nparam_floats, offset);
    ck_assert_int_ge(p.cls->workspace_floats(&p, 17), 17 * (h + k));

    int64_t np = p.nparam_floats;
    float *a1 = falloc(np), *a2 = falloc(np), *a3 = falloc(np), *w2same = falloc(h * k);
    uint64_t s1 = ifd_rng_next(&rng);
    p.cls->init_params(&p, a1, s1);
    p.cls->init_params(&p, a2, s1);
    p.cls->init_params(&p, a3, s1 + 1);
    ck_assert_msg(memcmp(a1, a2, sizeof(float) * (size_t)np) == 0, "seed %llu: not deterministic",
                  (unsigned long long)seed);
    const float *w1 = a1, *b1 = a1 + d * h, *w2 = b1 + h, *b2 = w2 + h * k;
    double bound1 = sqrt(6.0 / (double)(d + h)), bound2 = sqrt(6.0 / (double)(h + k));
    int differ = 0;
    for (int64_t j = 0; j < d * h; j++) {
        ck_assert_msg(fabs(w1[j]) <= bound1 * (1 + 1e-6), "W1[%lld] = %g outside +-%g",
                      (long long)j, (double)w1[j], bound1);
        differ |= w1[j] != a3[j];
    }
    for (int64_t j = 0; j < h * k; j++)
        ck_assert_msg(fabs(w2[j]) <= bound2 * (1 + 1e-6), "W2[%lld] = %g outside +-%g",
                      (long long)j, (double)w2[j], bound2);
    for (int64_t j = 0; j < h; j++)
        ck_assert_msg(b1[j] == 0.0f, "b1[%lld] = %g", (long long)j, (double)b1[j]);
    for (int64_t j = 0; j < k; j++)
        ck_assert_msg(b2[j] == 0.0f, "b2[%lld] = %g", (long long)j, (double)b2[j]);
    ck_assert_msg(differ, "seed %llu: W1 ignores the seed", (unsigned long long)seed);
    /* W2 is not the stream W1 starts from (the same numbers scaled to another bound). */
    ifd_program_init_glorot(w2same, h, k, s1);
    int same = 0;
    for (int64_t j = 0; j < h * k; j++)
        same += w2[j] == w2same[j];
    ck_assert_msg(same < h * k || h * k == 0, "seed %llu: W2 is drawn from W1's stream",
                  (unsigned long long)seed);
    free(a1);
    free(a2);
    free(a3);
    free(w2same);
}
END_TEST

/* ---- 5. learning through ifd_step_train ---------------------------------------------------- */

/* A random linear teacher: regression targets x W + b, or labels argmax(x W + b) for rows whose
 * top two logits are at least `margin` apart. */
typedef struct teacher {
    int cls;
    int64_t d, k;
    double *w, *b;
    double margin;
} teacher;

static int64_t teacher_eval(const teacher *t, const float *x, double *z, double *gap)
{
    int64_t arg = 0;
    for (int64_t c = 0; c < t->k; c++) {
        double s = t->b[c];
        for (int64_t j = 0; j < t->d; j++)
            s += (double)x[j] * t->w[j * t->k + c];
        z[c] = s;
        if (s > z[arg])
            arg = c;
    }
    double second = -INFINITY;
    for (int64_t c = 0; c < t->k; c++)
        if (c != arg && z[c] > second)
            second = z[c];
    *gap = z[arg] - second;
    return arg;
}

static void teacher_batch(const teacher *t, ifd_rng *rng, int64_t rows, float *x, void *y)
{
    double *z = xmalloc(sizeof(double) * (size_t)t->k);
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * t->d;
        int tries = 0;
        for (;;) {
            for (int64_t j = 0; j < t->d; j++)
                xr[j] = (float)urand(rng, -1.0, 1.0);
            double gap;
            int64_t arg = teacher_eval(t, xr, z, &gap);
            if (!t->cls) {
                for (int64_t c = 0; c < t->k; c++)
                    ((float *)y)[r * t->k + c] = (float)z[c];
                break;
            }
            if (gap >= t->margin) {
                ((int32_t *)y)[r] = (int32_t)arg;
                break;
            }
            ck_assert_msg(++tries < 100000, "no sample with margin %g", t->margin);
        }
    }
    free(z);
}

static void teacher_init(teacher *t, ifd_rng *rng, int cls, int64_t d, int64_t k)
{
    t->cls = cls;
    t->d = d;
    t->k = k;
    t->w = xmalloc(sizeof(double) * (size_t)(d * k));
    t->b = xmalloc(sizeof(double) * (size_t)k);
    t->margin = cls ? 0.1 : 0.0;
    /* Classifiers: redraw until no class takes more than 3/4 of the data, so that a high
     * accuracy cannot come from predicting one class. */
    for (int attempt = 0;; attempt++) {
        for (int64_t j = 0; j < d * k; j++)
            t->w[j] = urand(rng, -1.0, 1.0);
        for (int64_t c = 0; c < k; c++)
            t->b[c] = cls ? urand(rng, -0.2, 0.2) : urand(rng, -1.0, 1.0);
        if (!cls)
            return;
        enum { N = 400 };
        float *x = falloc(N * d);
        int32_t *y = xmalloc(sizeof(int32_t) * N);
        int64_t *hist = calloc((size_t)k, sizeof(int64_t)), top = 0;
        teacher_batch(t, rng, N, x, y);
        for (int r = 0; r < N; r++)
            hist[y[r]]++;
        for (int64_t c = 0; c < k; c++)
            if (hist[c] > top)
                top = hist[c];
        free(x);
        free(y);
        free(hist);
        if (top <= 3 * N / 4)
            return;
        ck_assert_msg(attempt < 100, "no balanced teacher for D=%lld K=%lld", (long long)d,
                      (long long)k);
    }
}

static void teacher_free(teacher *t)
{
    free(t->w);
    free(t->b);
}

/* A batch of a program's two inputs in malloc'd buffers. */
typedef struct data {
    int64_t rows;
    float *x;
    void *y;
    ifd_tensor in[2];
} data;

static void data_make(data *b, const teacher *t, ifd_rng *rng, int64_t rows)
{
    b->rows = rows;
    b->x = falloc(rows * t->d);
    b->y = t->cls ? xmalloc(sizeof(int32_t) * (size_t)rows) : (void *)falloc(rows * t->k);
    teacher_batch(t, rng, rows, b->x, b->y);
    int64_t xd[2] = {rows, t->d}, yd[2] = {rows, t->k};
    ck_assert_int_eq(ifd_tensor_init(&b->in[0], IFD_F32, 2, xd, b->x), IFD_OK);
    if (t->cls)
        ck_assert_int_eq(ifd_tensor_init(&b->in[1], IFD_I32, 1, yd, b->y), IFD_OK);
    else
        ck_assert_int_eq(ifd_tensor_init(&b->in[1], IFD_F32, 2, yd, b->y), IFD_OK);
}

static void data_free(data *b)
{
    free(b->x);
    free(b->y);
}

/* The all-reduce of a single replica: the sum of one vector is itself. Counts its calls. */
typedef struct fake_ar {
    int calls;
    int64_t last_n;
    int rc;
} fake_ar;

static int fake_allreduce(void *ctx, float *buf, int64_t n, ifd_error *err)
{
    (void)buf;
    fake_ar *a = ctx;
    a->calls++;
    a->last_n = n;
    if (a->rc)
        return ifd_error_set(err, a->rc, "fake all-reduce failed");
    return IFD_OK;
}

/* One replica's mirror and what ifd_step_train needs around it. */
typedef struct trainer {
    ifd_program p;
    ifd_ops ops;
    ifd_step_ops sops;
    fake_ar ar;
    ifd_replica_state st;
} trainer;

static void trainer_init_h(trainer *t, const char *name, int64_t d, int64_t h, int64_t k,
                           int64_t max_rows, uint64_t init_seed)
{
    memset(t, 0, sizeof *t);
    make_program_h(&t->p, name, d, h, k);
    ifd_cpu_ops_init(&t->ops, NULL);
    ifd_cpu_step_ops_init(&t->sops);
    t->sops.allreduce_sum = fake_allreduce;
    int64_t n = t->p.nparam_floats;
    t->st.params = falloc(n);
    t->st.grads = falloc(n);
    t->st.slot0 = calloc((size_t)n, sizeof(float));
    t->st.slot1 = calloc((size_t)n, sizeof(float));
    int64_t ws = t->p.cls->workspace_floats(&t->p, max_rows);
    t->st.workspace = falloc(ws);
    fill_nan(t->st.workspace, ws);
    t->st.step = calloc(1, sizeof(int64_t));
    t->st.opt_step = calloc(1, sizeof(int64_t));
    t->p.cls->init_params(&t->p, t->st.params, init_seed);
}

static void trainer_init(trainer *t, const char *name, int64_t d, int64_t k, int64_t max_rows,
                         uint64_t init_seed)
{
    trainer_init_h(t, name, d, 0, k, max_rows, init_seed);
}

static ifd_step_out trainer_step(trainer *t, const ifd_optimizer *opt, const data *b)
{
    ifd_step_out out = {0};
    ifd_error err = {0};
    int rc = ifd_step_train(&t->p, &t->ops, &t->sops, &t->ar, &t->st, opt, 1.0f, b->in, b->rows,
                            &out, &err);
    ck_assert_msg(rc == IFD_OK, "ifd_step_train: %s", ifd_error_text(&err));
    return out;
}

/* The loss (and correct count) of the current parameters, without an update. */
static ifd_step_out trainer_eval(trainer *t, const data *b)
{
    float *g = falloc(t->p.nparam_floats);
    ifd_step_out out;
    run_step(&t->p, b->in, b->rows, t->st.params, g, 1.0f, &out);
    free(g);
    return out;
}

static void trainer_free(trainer *t)
{
    free(t->st.params);
    free(t->st.grads);
    free(t->st.slot0);
    free(t->st.slot1);
    free(t->st.workspace);
    free(t->st.step);
    free(t->st.opt_step);
}

static ifd_optimizer make_opt(ifd_optimizer_kind kind, float lr)
{
    ifd_optimizer o = {
        .kind = kind,
        .learning_rate = lr,
        .momentum = 0.9f,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .epsilon = 1e-7f,
    };
    return o;
}

START_TEST(test_learn_softmax_accuracy)
{
    uint64_t seed = test_seed(10, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = irange(&rng, 2, 10), k = irange(&rng, 2, 5), rows = 64, steps = 1500;
    teacher t;
    teacher_init(&t, &rng, 1, d, k);
    trainer tr;
    trainer_init(&tr, "softmax", d, k, rows, ifd_rng_next(&rng));
    ifd_optimizer opt = make_opt(IFD_OPT_ADAM, 0.05f);
    data test;
    data_make(&test, &t, &rng, 4000);
    ifd_step_out before = trainer_eval(&tr, &test);
    for (int64_t s = 0; s < steps; s++) {
        data b;
        data_make(&b, &t, &rng, rows);
        ifd_step_out out = trainer_step(&tr, &opt, &b);
        ck_assert_msg(isfinite(out.loss) && out.count == (float)rows,
                      "seed %llu step %lld: loss %g count %g", (unsigned long long)seed,
                      (long long)s, (double)out.loss, (double)out.count);
        data_free(&b);
    }
    ck_assert_int_eq(*tr.st.step, steps);
    ck_assert_int_eq(tr.ar.calls, steps);
    ck_assert_int_eq(tr.ar.last_n, tr.p.nparam_floats);
    ifd_step_out after = trainer_eval(&tr, &test);
    int64_t ref_correct, ambiguous;
    ref_loss(&tr.p, test.in, test.rows, tr.st.params, &ref_correct, &ambiguous);
    ck_assert_msg(after.correct >= 0.95f * (float)test.rows,
                  "seed %llu D=%lld K=%lld: held-out accuracy %.4f (before training %.4f, loss "
                  "%g -> %g)",
                  (unsigned long long)seed, (long long)d, (long long)k,
                  (double)after.correct / (double)test.rows,
                  (double)before.correct / (double)test.rows, (double)before.loss,
                  (double)after.loss);
    ck_assert_msg(
        after.correct >= (float)ref_correct && after.correct <= (float)(ref_correct + ambiguous),
        "seed %llu: correct %g, own argmax %lld (+%lld near ties)", (unsigned long long)seed,
        (double)after.correct, (long long)ref_correct, (long long)ambiguous);
    data_free(&test);
    trainer_free(&tr);
    teacher_free(&t);
}
END_TEST

/* XOR of the signs of two features (label 1 when x0 x1 > 0): no line separates the classes, a
 * hidden layer does. */
static void xor_data(data *b, ifd_rng *rng, int64_t rows)
{
    b->rows = rows;
    b->x = falloc(rows * 2);
    int32_t *y = xmalloc(sizeof(int32_t) * (size_t)rows);
    b->y = y;
    for (int64_t r = 0; r < rows; r++) {
        float *x = b->x + 2 * r;
        do {
            x[0] = (float)urand(rng, -1.0, 1.0);
            x[1] = (float)urand(rng, -1.0, 1.0);
        } while (fabsf(x[0]) < 0.05f || fabsf(x[1]) < 0.05f);
        y[r] = x[0] * x[1] > 0.0f;
    }
    int64_t xd[2] = {rows, 2}, yd[1] = {rows};
    ck_assert_int_eq(ifd_tensor_init(&b->in[0], IFD_F32, 2, xd, b->x), IFD_OK);
    ck_assert_int_eq(ifd_tensor_init(&b->in[1], IFD_I32, 1, yd, b->y), IFD_OK);
}

/* Held-out accuracy after training name (hidden width h) on XOR. */
static double xor_accuracy(const char *name, int64_t h, uint64_t seed)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    trainer tr;
    trainer_init_h(&tr, name, 2, h, 2, 64, ifd_rng_next(&rng));
    ifd_optimizer opt = make_opt(IFD_OPT_ADAM, 0.03f);
    for (int s = 0; s < 1500; s++) {
        data b;
        xor_data(&b, &rng, 64);
        trainer_step(&tr, &opt, &b);
        data_free(&b);
    }
    data test;
    xor_data(&test, &rng, 2000);
    double acc = (double)trainer_eval(&tr, &test).correct / (double)test.rows;
    data_free(&test);
    trainer_free(&tr);
    return acc;
}

START_TEST(test_learn_mlp_beats_softmax_on_xor)
{
    uint64_t seed = test_seed(35, _i);
    double mlp = xor_accuracy("mlp", 16, seed), softmax = xor_accuracy("softmax", 0, seed);
    ck_assert_msg(mlp >= 0.95 && softmax <= 0.8,
                  "seed %llu: held-out XOR accuracy mlp (H=16) %.4f, softmax %.4f",
                  (unsigned long long)seed, mlp, softmax);
}
END_TEST

START_TEST(test_learn_linear_recovers_teacher)
{
    uint64_t seed = test_seed(11, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = irange(&rng, 1, 10), k = irange(&rng, 1, 6), rows = 64, steps = 1500;
    teacher t;
    teacher_init(&t, &rng, 0, d, k);
    trainer tr;
    trainer_init(&tr, "linear", d, k, rows, ifd_rng_next(&rng));
    ifd_optimizer opt = make_opt(IFD_OPT_SGD, 0.3f);
    for (int64_t s = 0; s < steps; s++) {
        data b;
        data_make(&b, &t, &rng, rows);
        trainer_step(&tr, &opt, &b);
        data_free(&b);
    }
    const float *w = tr.st.params + ifd_program_param(&tr.p, "W")->offset;
    const float *bias = tr.st.params + ifd_program_param(&tr.p, "b")->offset;
    double worst = 0.0;
    int64_t at = -1;
    for (int64_t j = 0; j < d * k; j++) {
        double e = fabs((double)w[j] - t.w[j]);
        if (!(e <= worst)) {
            worst = e;
            at = j;
        }
    }
    for (int64_t c = 0; c < k; c++) {
        double e = fabs((double)bias[c] - t.b[c]);
        if (!(e <= worst)) {
            worst = e;
            at = d * k + c;
        }
    }
    char pname[48];
    ck_assert_msg(worst <= 1e-3,
                  "seed %llu D=%lld K=%lld: max |param - teacher| = %g at %s after %lld steps",
                  (unsigned long long)seed, (long long)d, (long long)k, worst,
                  param_name(&tr.p, at < 0 ? 0 : at, pname, sizeof pname), (long long)steps);
    trainer_free(&tr);
    teacher_free(&t);
}
END_TEST

/* Every optimizer lowers the loss of a fixed batch. _i: program (even linear, odd softmax) and
 * optimizer (sgd, momentum, adam). */
START_TEST(test_learn_optimizers_decrease_loss)
{
    uint64_t seed = test_seed(12, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = _i % 2;
    ifd_optimizer_kind kind = (ifd_optimizer_kind)((_i / 2) % 3);
    static const float lrs[2][3] = {{0.2f, 0.03f, 0.03f}, {0.5f, 0.1f, 0.05f}};
    int64_t d = irange(&rng, 2, 10), k = irange(&rng, 2, 5), rows = irange(&rng, 16, 64);
    int steps = 100;
    teacher t;
    teacher_init(&t, &rng, cls, d, k);
    trainer tr;
    trainer_init(&tr, cls ? "softmax" : "linear", d, k, rows, ifd_rng_next(&rng));
    ifd_optimizer opt = make_opt(kind, lrs[cls][kind]);
    data b;
    data_make(&b, &t, &rng, rows);
    float first = trainer_eval(&tr, &b).loss, last = 0.0f;
    for (int s = 0; s < steps; s++) {
        ifd_step_out out = trainer_step(&tr, &opt, &b);
        if (s == 0)
            ck_assert_msg(out.loss == first,
                          "the step's loss %.9g is not the loss before the "
                          "update %.9g",
                          (double)out.loss, (double)first);
        last = out.loss;
    }
    float final = trainer_eval(&tr, &b).loss;
    ck_assert_msg(final < 0.5f * first && last < first,
                  "seed %llu %s %s D=%lld K=%lld rows=%lld: loss %g -> %g (last step %g)",
                  (unsigned long long)seed, cls ? "softmax" : "linear", ifd_optimizer_name(kind),
                  (long long)d, (long long)k, (long long)rows, (double)first, (double) final,
                  (double)last);
    data_free(&b);
    trainer_free(&tr);
    teacher_free(&t);
}
END_TEST

/* One ifd_step_train: the program's gradients, the all-reduce over every parameter, the update,
 * the step counter and the outfeed count; a failed all-reduce leaves the mirror untouched. */
START_TEST(test_step_train_one_step)
{
    uint64_t seed = test_seed(13, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = _i % 2;
    int64_t d = irange(&rng, 1, 9), k = irange(&rng, 2, 6), rows = irange(&rng, 1, 30);
    trainer tr;
    trainer_init(&tr, cls ? "softmax" : "linear", d, k, rows, ifd_rng_next(&rng));
    int64_t np = tr.p.nparam_floats;
    tu_batch *tb = tu_batch_random(&tr.p, rows, 0, &rng);
    float scale = (float)urand(&rng, 0.1, 1.0), lr = (float)urand(&rng, 0.01, 1.0);
    *tr.st.step = irange(&rng, 0, 1000);
    int64_t step0 = *tr.st.step;
    float *p0 = falloc(np), *g = falloc(np);
    memcpy(p0, tr.st.params, sizeof(float) * (size_t)np);
    ifd_step_out want;
    run_step(&tr.p, tb->b.tensors, rows, p0, g, scale, &want);

    ifd_optimizer opt = make_opt(IFD_OPT_SGD, lr);
    ifd_step_out out = {0};
    ifd_error err = {0};
    fill_nan(tr.st.grads, np);
    int rc = ifd_step_train(&tr.p, &tr.ops, &tr.sops, &tr.ar, &tr.st, &opt, scale, tb->b.tensors,
                            rows, &out, &err);
    ck_assert_msg(rc == IFD_OK, "%s", ifd_error_text(&err));
    ck_assert_int_eq(tr.ar.calls, 1);
    ck_assert_int_eq(tr.ar.last_n, np);
    ck_assert_int_eq(*tr.st.step, step0 + 1);
    ck_assert_int_eq(*tr.st.opt_step, 1); /* the optimizer's own count, not the global step */
    ck_assert_msg(out.count == (float)rows, "count %g, want %lld", (double)out.count,
                  (long long)rows);
    ck_assert_msg(out.loss == want.loss && out.correct == want.correct,
                  "seed %llu: loss %g correct %g, want %g %g", (unsigned long long)seed,
                  (double)out.loss, (double)out.correct, (double)want.loss, (double)want.correct);
    for (int64_t j = 0; j < np; j++) {
        double pj = (double)p0[j] - (double)lr * (double)g[j];
        double tol = 2.5e-7 * (fabs((double)p0[j]) + fabs((double)lr * g[j])) + 1e-30;
        char pname[48];
        ck_assert_msg(tr.st.grads[j] == g[j] && fabs((double)tr.st.params[j] - pj) <= tol,
                      "seed %llu %s: %s: grad %g (want %g), param %.9g (want %.9g)",
                      (unsigned long long)seed, tr.p.cls->name,
                      param_name(&tr.p, j, pname, sizeof pname), (double)tr.st.grads[j],
                      (double)g[j], (double)tr.st.params[j], pj);
    }

    /* A failed all-reduce: the error comes back, the mirror and the step stay as they were. */
    memcpy(p0, tr.st.params, sizeof(float) * (size_t)np);
    tr.ar.rc = IFD_ESTOPPED;
    ifd_error_clear(&err);
    rc = ifd_step_train(&tr.p, &tr.ops, &tr.sops, &tr.ar, &tr.st, &opt, scale, tb->b.tensors, rows,
                        &out, &err);
    ck_assert_int_eq(rc, IFD_ESTOPPED);
    ck_assert_int_eq(*tr.st.step, step0 + 1);
    ck_assert_msg(memcmp(p0, tr.st.params, sizeof(float) * (size_t)np) == 0,
                  "params changed by a step whose all-reduce failed");
    free(p0);
    free(g);
    tu_batch_free(tb);
    trainer_free(&tr);
}
END_TEST

/* ---- 6. optimizer update formulas ---------------------------------------------------------- */

START_TEST(test_optimizer_formulas)
{
    uint64_t seed = test_seed(14, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    ifd_optimizer_kind kind = (ifd_optimizer_kind)(_i % 3);
    ck_assert_int_eq(ifd_optimizer_slots(kind), (int)kind);
    int64_t n = irange(&rng, 1, 300);
    int64_t step = _i < 3 ? 0 : irange(&rng, 0, 40), step_before = step;
    ifd_optimizer opt = {
        .kind = kind,
        .learning_rate = (float)urand(&rng, 1e-3, 0.5),
        .momentum = (float)urand(&rng, 0.0, 0.99),
        .beta1 = (float)urand(&rng, 0.5, 0.95),
        .beta2 = (float)urand(&rng, 0.9, 0.9999),
        .epsilon = (float)pow(10.0, urand(&rng, -8.0, -2.0)),
    };
    float *p = falloc(n), *g = falloc(n), *m = falloc(n), *v = falloc(n);
    float *p1 = falloc(n), *m1 = falloc(n), *v1 = falloc(n);
    for (int64_t i = 0; i < n; i++) {
        p[i] = (float)urand(&rng, -2.0, 2.0);
        g[i] = (float)(urand(&rng, -1.0, 1.0) * pow(10.0, urand(&rng, -4.0, 0.0)));
        m[i] = (float)(urand(&rng, -1.0, 1.0) * pow(10.0, urand(&rng, -4.0, 0.0)));
        v[i] = (float)(ifd_rng_uniform(&rng) * pow(10.0, urand(&rng, -8.0, 0.0)));
    }
    memcpy(p1, p, sizeof(float) * (size_t)n);
    memcpy(m1, m, sizeof(float) * (size_t)n);
    memcpy(v1, v, sizeof(float) * (size_t)n);
    /* Slots the kind does not use are NULL: touching them crashes the test. */
    ifd_cpu_optimizer_apply(NULL, &opt, &step, n, p1, g, kind == IFD_OPT_SGD ? NULL : m1,
                            kind == IFD_OPT_ADAM ? v1 : NULL);

    const double e = 8.0 * FLT_EPSILON;
    double lr = opt.learning_rate, mu = opt.momentum, b1 = opt.beta1, b2 = opt.beta2,
           eps = opt.epsilon;
    double t = (double)(step + 1);
    double lr_t = lr * sqrt(1.0 - pow(b2, t)) / (1.0 - pow(b1, t));
    for (int64_t i = 0; i < n; i++) {
        double pd = p[i], gd = g[i], md = m[i], vd = v[i];
        double want_p, want_m = md, want_v = vd, tol_p, tol_m = 0.0, tol_v = 0.0;
        switch (kind) {
        case IFD_OPT_SGD:
            want_p = pd - lr * gd;
            tol_p = e * (fabs(pd) + fabs(lr * gd));
            break;
        case IFD_OPT_MOMENTUM:
            want_m = mu * md + gd;
            tol_m = e * (fabs(mu * md) + fabs(gd));
            want_p = pd - lr * want_m;
            tol_p = e * fabs(pd) + lr * (fabs(want_m) * e + tol_m);
            break;
        default:
            want_m = b1 * md + (1.0 - b1) * gd;
            want_v = b2 * vd + (1.0 - b2) * gd * gd;
            tol_m = e * (fabs(b1 * md) + fabs((1.0 - b1) * gd));
            tol_v = e * want_v;
            want_p = pd - lr_t * want_m / (sqrt(want_v) + eps);
            tol_p = e * fabs(pd) + lr_t * (fabs(want_m) * e + tol_m) / (sqrt(want_v) + eps);
            break;
        }
        ck_assert_msg(fabs((double)p1[i] - want_p) <= tol_p + 1e-30,
                      "seed %llu %s step %lld elem %lld (lr %g mu %g b1 %g b2 %g eps %g; p %g g "
                      "%g m %g v %g): param %.9g, reference %.9g",
                      (unsigned long long)seed, ifd_optimizer_name(kind), (long long)step,
                      (long long)i, lr, mu, b1, b2, eps, pd, gd, md, vd, (double)p1[i], want_p);
        if (kind != IFD_OPT_SGD)
            ck_assert_msg(fabs((double)m1[i] - want_m) <= tol_m + 1e-30,
                          "seed %llu %s elem %lld: slot0 %.9g, reference %.9g",
                          (unsigned long long)seed, ifd_optimizer_name(kind), (long long)i,
                          (double)m1[i], want_m);
        if (kind == IFD_OPT_ADAM)
            ck_assert_msg(fabs((double)v1[i] - want_v) <= tol_v + 1e-30,
                          "seed %llu adam elem %lld: slot1 %.9g, reference %.9g",
                          (unsigned long long)seed, (long long)i, (double)v1[i], want_v);
    }
    ck_assert_int_eq(step, step_before); /* read, never written */
    free(p);
    free(g);
    free(m);
    free(v);
    free(p1);
    free(m1);
    free(v1);
}
END_TEST

/* ---- 7. the cpu all-reduce ----------------------------------------------------------------- */

typedef struct ar_worker {
    pthread_t tid;
    ifd_cpu_allreduce *ar;
    int r, replicas, rounds;
    int64_t n;
    float *buf;
    float *const *inputs; /* [round * replicas + r] */
    float *const *sums;   /* [round] */
    int rc;               /* the first non-OK result, or IFD_OK */
    int rc_round;
    int64_t bad_round, bad_index; /* the first mismatch, -1 when none */
} ar_worker;

static void *ar_worker_main(void *arg)
{
    ar_worker *w = arg;
    w->rc = IFD_OK;
    w->bad_round = w->bad_index = -1;
    for (int round = 0; round < w->rounds; round++) {
        memcpy(w->buf, w->inputs[round * w->replicas + w->r], sizeof(float) * (size_t)w->n);
        int rc = ifd_cpu_allreduce_run(w->ar, w->r);
        if (rc != IFD_OK) {
            w->rc = rc;
            w->rc_round = round;
            break;
        }
        if (w->bad_round < 0 && memcmp(w->buf, w->sums[round], sizeof(float) * (size_t)w->n) != 0) {
            w->bad_round = round;
            for (int64_t i = 0; i < w->n; i++)
                if (memcmp(&w->buf[i], &w->sums[round][i], sizeof(float)) != 0) {
                    w->bad_index = i;
                    break;
                }
        }
    }
    return NULL;
}

/* Random values over a wide range of exponents, so that the order of a float sum shows. */
static float wide_random(ifd_rng *rng)
{
    return (float)(urand(rng, -1.0, 1.0) * ldexp(1.0, (int)irange(rng, -20, 20)));
}

/* Fills inputs[rounds * R] and their sums in replica order 0..R-1, in float. Returns how many
 * sums differ, bit for bit, from the sum in the reverse order. */
static int64_t ar_make_rounds(ifd_rng *rng, int R, int rounds, int64_t n, float **inputs,
                              float **sums)
{
    int64_t order_matters = 0;
    for (int round = 0; round < rounds; round++) {
        for (int r = 0; r < R; r++) {
            float *x = inputs[round * R + r] = falloc(n);
            for (int64_t i = 0; i < n; i++)
                x[i] = wide_random(rng);
        }
        float *s = sums[round] = falloc(n);
        for (int64_t i = 0; i < n; i++) {
            float acc = inputs[round * R][i];
            for (int r = 1; r < R; r++)
                acc += inputs[round * R + r][i];
            s[i] = acc;
            float rev = inputs[round * R + R - 1][i];
            for (int r = R - 2; r >= 0; r--)
                rev += inputs[round * R + r][i];
            order_matters += memcmp(&rev, &acc, sizeof acc) != 0;
        }
    }
    return order_matters;
}

START_TEST(test_allreduce_sum)
{
    uint64_t seed = test_seed(20, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int R = (int)irange(&rng, 2, 6), rounds = (int)irange(&rng, 1, 6);
    int64_t n;
    if (_i == 0)
        n = 0;
    else if (_i % 4 == 1)
        n = irange(&rng, 1, R - 1); /* some replicas own an empty chunk */
    else
        n = irange(&rng, 1, 3000);
    float **inputs = calloc((size_t)(rounds * R), sizeof(float *));
    float **sums = calloc((size_t)rounds, sizeof(float *));
    int64_t order_matters = ar_make_rounds(&rng, R, rounds, n, inputs, sums);
    if (n >= 200 && R >= 3)
        ck_assert_msg(order_matters > 0, "seed %llu: test data cannot tell summation orders apart",
                      (unsigned long long)seed);

    ifd_cpu_allreduce ar;
    ck_assert_int_eq(ifd_cpu_allreduce_init(&ar, R, n), IFD_OK);
    ar_worker *w = calloc((size_t)R, sizeof *w);
    for (int r = 0; r < R; r++) {
        w[r] = (ar_worker){.ar = &ar,
                           .r = r,
                           .replicas = R,
                           .rounds = rounds,
                           .n = n,
                           .buf = falloc(n),
                           .inputs = inputs,
                           .sums = sums};
        ifd_cpu_allreduce_bind(&ar, r, w[r].buf);
    }
    for (int r = 0; r < R; r++)
        ck_assert_int_eq(pthread_create(&w[r].tid, NULL, ar_worker_main, &w[r]), 0);
    for (int r = 0; r < R; r++)
        pthread_join(w[r].tid, NULL);
    for (int r = 0; r < R; r++) {
        ck_assert_msg(w[r].rc == IFD_OK, "seed %llu R=%d n=%lld: replica %d round %d: %s",
                      (unsigned long long)seed, R, (long long)n, r, w[r].rc_round,
                      ifd_errname(w[r].rc));
        ck_assert_msg(w[r].bad_round < 0,
                      "seed %llu R=%d n=%lld rounds=%d: replica %d round %lld element %lld: %.9g, "
                      "sum in replica order %.9g",
                      (unsigned long long)seed, R, (long long)n, rounds, r,
                      (long long)w[r].bad_round, (long long)w[r].bad_index,
                      w[r].bad_index >= 0 ? (double)w[r].buf[w[r].bad_index] : 0.0,
                      w[r].bad_index >= 0 ? (double)sums[w[r].bad_round][w[r].bad_index] : 0.0);
    }
    ifd_cpu_allreduce_fini(&ar);
    for (int r = 0; r < R; r++)
        free(w[r].buf);
    free(w);
    for (int i = 0; i < rounds * R; i++)
        free(inputs[i]);
    for (int i = 0; i < rounds; i++)
        free(sums[i]);
    free(inputs);
    free(sums);
}
END_TEST

START_TEST(test_allreduce_single_replica)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, test_seed(21, 0));
    int64_t n = 100;
    float *buf = falloc(n), *copy = falloc(n);
    for (int64_t i = 0; i < n; i++)
        copy[i] = buf[i] = wide_random(&rng);
    ifd_cpu_allreduce ar;
    ck_assert_int_eq(ifd_cpu_allreduce_init(&ar, 1, n), IFD_OK);
    ifd_cpu_allreduce_bind(&ar, 0, buf);
    for (int round = 0; round < 3; round++)
        ck_assert_int_eq(ifd_cpu_allreduce_run(&ar, 0), IFD_OK);
    ck_assert(memcmp(buf, copy, sizeof(float) * (size_t)n) == 0);
    ifd_cpu_allreduce_fini(&ar);
    free(buf);
    free(copy);
}
END_TEST

/* Waits (10 s at most) until `want` replicas wait in the all-reduce's barrier. */
static int ar_wait_arrived(ifd_cpu_allreduce *ar, int want)
{
    int64_t deadline = ifd_clock_ns() + 10 * 1000000000ll;
    for (;;) {
        ifd_mutex_lock(&ar->mu);
        int arrived = __atomic_load_n(&ar->arrived, __ATOMIC_ACQUIRE);
        ifd_mutex_unlock(&ar->mu);
        if (arrived >= want)
            return 1;
        if (ifd_clock_ns() > deadline)
            return 0;
        ifd_sleep_ns(1000000);
    }
}

/* R - 1 replicas enter a round that one replica never joins; then abort (_i even) or leave
 * (_i odd) releases them with IFD_ESTOPPED or IFD_EEOF. Both are final; an abort overrides a
 * leave. */
START_TEST(test_allreduce_abort_leave)
{
    uint64_t seed = test_seed(22, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int leave = _i % 2;
    int R = (int)irange(&rng, 2, 6), absent = (int)irange(&rng, 0, R - 1);
    int64_t n = irange(&rng, 1, 500);
    float **inputs = calloc((size_t)(2 * R), sizeof(float *));
    float **sums = calloc(2, sizeof(float *));
    ar_make_rounds(&rng, R, 2, n, inputs, sums);
    ifd_cpu_allreduce ar;
    ck_assert_int_eq(ifd_cpu_allreduce_init(&ar, R, n), IFD_OK);
    ar_worker *w = calloc((size_t)R, sizeof *w);
    for (int r = 0; r < R; r++) {
        w[r] = (ar_worker){.ar = &ar,
                           .r = r,
                           .replicas = R,
                           .rounds = 1,
                           .n = n,
                           .buf = falloc(n),
                           .inputs = inputs,
                           .sums = sums};
        ifd_cpu_allreduce_bind(&ar, r, w[r].buf);
    }
    for (int r = 0; r < R; r++)
        if (r != absent)
            ck_assert_int_eq(pthread_create(&w[r].tid, NULL, ar_worker_main, &w[r]), 0);
    int all_waiting = ar_wait_arrived(&ar, R - 1);
    if (leave)
        ifd_cpu_allreduce_leave(&ar);
    else
        ifd_cpu_allreduce_abort(&ar);
    for (int r = 0; r < R; r++)
        if (r != absent)
            pthread_join(w[r].tid, NULL);
    ck_assert_msg(all_waiting, "seed %llu R=%d: the replicas never all waited",
                  (unsigned long long)seed, R);
    int want = leave ? IFD_EEOF : IFD_ESTOPPED;
    for (int r = 0; r < R; r++)
        if (r != absent)
            ck_assert_msg(w[r].rc == want, "seed %llu R=%d absent=%d %s: replica %d got %s",
                          (unsigned long long)seed, R, absent, leave ? "leave" : "abort", r,
                          ifd_errname(w[r].rc));
    /* Later calls get the same answer without blocking. */
    ck_assert_int_eq(ifd_cpu_allreduce_run(&ar, absent), want);

    /* Both are final: a leave stays a leave until an abort overrides it, and an abort stays. */
    ck_assert_int_eq(ifd_cpu_allreduce_run(&ar, 0), want);
    ifd_cpu_allreduce_leave(&ar);
    ifd_cpu_allreduce_abort(&ar);
    ck_assert_int_eq(ifd_cpu_allreduce_run(&ar, 0), IFD_ESTOPPED);
    ifd_cpu_allreduce_leave(&ar);
    ck_assert_int_eq(ifd_cpu_allreduce_run(&ar, 0), IFD_ESTOPPED);
    ifd_cpu_allreduce_fini(&ar);
    for (int r = 0; r < R; r++)
        free(w[r].buf);
    free(w);
    for (int i = 0; i < 2 * R; i++)
        free(inputs[i]);
    for (int i = 0; i < 2; i++)
        free(sums[i]);
    free(inputs);
    free(sums);
}
END_TEST

/* ---- the suite ----------------------------------------------------------------------------- */

static TCase *tcase(Suite *s, const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return tc;
}

int main(void)
{
    Suite *s = suite_create("programs");
    TCase *tc = tcase(s, "gradients");
    tcase_add_loop_test(tc, test_grad_linear, 0, 12);
    tcase_add_loop_test(tc, test_grad_softmax, 0, 12);
    tcase_add_loop_test(tc, test_grad_mlp, 0, 16);

    tc = tcase(s, "loss");
    tcase_add_loop_test(tc, test_loss_linear, 0, 12);
    tcase_add_loop_test(tc, test_loss_softmax, 0, 12);
    tcase_add_loop_test(tc, test_loss_mlp, 0, 12);
    tcase_add_loop_test(tc, test_eval_step_matches_train, 0, 12);
    tcase_add_loop_test(tc, test_predict_step, 0, 12);
    tcase_add_loop_test(tc, test_softmax_ties, 0, 6);
    tcase_add_loop_test(tc, test_read_program, 0, 8);

    tc = tcase(s, "check_batch");
    tcase_add_loop_test(tc, test_softmax_check_batch, 0, 16);

    tc = tcase(s, "setup");
    tcase_add_loop_test(tc, test_setup_errors, 0,
                        (int)(sizeof setup_cases / sizeof setup_cases[0]));
    tcase_add_test(tc, test_setup_unknown_program);
    tcase_add_loop_test(tc, test_setup_layout, 0, 6);
    tcase_add_loop_test(tc, test_mlp_layout, 0, 6);

    tc = tcase(s, "learning");
    tcase_add_loop_test(tc, test_learn_softmax_accuracy, 0, 4);
    tcase_add_loop_test(tc, test_learn_linear_recovers_teacher, 0, 4);
    tcase_add_loop_test(tc, test_learn_mlp_beats_softmax_on_xor, 0, 3);
    tcase_add_loop_test(tc, test_learn_optimizers_decrease_loss, 0, 12);
    tcase_add_loop_test(tc, test_step_train_one_step, 0, 6);

    tc = tcase(s, "optimizers");
    tcase_add_loop_test(tc, test_optimizer_formulas, 0, 15);

    tc = tcase(s, "allreduce");
    tcase_add_loop_test(tc, test_allreduce_sum, 0, 12);
    tcase_add_test(tc, test_allreduce_single_replica);
    tcase_add_loop_test(tc, test_allreduce_abort_leave, 0, 8);

    return tu_run_suite(s);
}
