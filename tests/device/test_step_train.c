/* Training through ifd_step_train (device/step.h) with one replica: the built-in programs learn
 * a random teacher (softmax's held-out accuracy, linear's recovered weights, mlp beating softmax
 * on XOR), every optimizer lowers the loss, one step's gradients, all-reduce and update; and the
 * optimizers' update formulas against a double reference.
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

/* ---- learning through ifd_step_train --------------------------------------------------------- */

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
    double *z = tu_xmalloc(sizeof(double) * (size_t)t->k);
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * t->d;
        int tries = 0;
        for (;;) {
            for (int64_t j = 0; j < t->d; j++)
                xr[j] = (float)tu_urand(rng, -1.0, 1.0);
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
    t->w = tu_xmalloc(sizeof(double) * (size_t)(d * k));
    t->b = tu_xmalloc(sizeof(double) * (size_t)k);
    t->margin = cls ? 0.1 : 0.0;
    /* Classifiers: redraw until no class takes more than 3/4 of the data, so that a high
     * accuracy cannot come from predicting one class. */
    for (int attempt = 0;; attempt++) {
        for (int64_t j = 0; j < d * k; j++)
            t->w[j] = tu_urand(rng, -1.0, 1.0);
        for (int64_t c = 0; c < k; c++)
            t->b[c] = cls ? tu_urand(rng, -0.2, 0.2) : tu_urand(rng, -1.0, 1.0);
        if (!cls)
            return;
        enum { N = 400 };
        float *x = tu_falloc(N * d);
        int32_t *y = tu_xmalloc(sizeof(int32_t) * N);
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
    b->x = tu_falloc(rows * t->d);
    b->y = t->cls ? tu_xmalloc(sizeof(int32_t) * (size_t)rows) : (void *)tu_falloc(rows * t->k);
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
    tu_make_program_h(&t->p, name, d, h, k);
    ifd_cpu_ops_init(&t->ops, NULL);
    ifd_cpu_step_ops_init(&t->sops);
    t->sops.allreduce_sum = fake_allreduce;
    int64_t n = t->p.nparam_floats;
    t->st.params = tu_falloc(n);
    t->st.grads = tu_falloc(n);
    t->st.slot0 = calloc((size_t)n, sizeof(float));
    t->st.slot1 = calloc((size_t)n, sizeof(float));
    int64_t ws = t->p.cls->workspace_floats(&t->p, max_rows);
    t->st.workspace = tu_falloc(ws);
    tu_fill_nan(t->st.workspace, ws);
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
    float *g = tu_falloc(t->p.nparam_floats);
    ifd_step_out out;
    tu_run_step(&t->p, b->in, b->rows, t->st.params, g, 1.0f, &out);
    free(g);
    return out;
}

static void trainer_free(trainer *t)
{
    ifd_program_free(&t->p);
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
    uint64_t seed = tu_test_seed(10, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = rand_between(&rng, 2, 10), k = rand_between(&rng, 2, 5), rows = 64, steps = 1500;
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
    tu_ref_loss(&tr.p, test.in, test.rows, tr.st.params, &ref_correct, &ambiguous);
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
    b->x = tu_falloc(rows * 2);
    int32_t *y = tu_xmalloc(sizeof(int32_t) * (size_t)rows);
    b->y = y;
    for (int64_t r = 0; r < rows; r++) {
        float *x = b->x + 2 * r;
        do {
            x[0] = (float)tu_urand(rng, -1.0, 1.0);
            x[1] = (float)tu_urand(rng, -1.0, 1.0);
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
    uint64_t seed = tu_test_seed(35, _i);
    double mlp = xor_accuracy("mlp", 16, seed), softmax = xor_accuracy("softmax", 0, seed);
    ck_assert_msg(mlp >= 0.95 && softmax <= 0.8,
                  "seed %llu: held-out XOR accuracy mlp (H=16) %.4f, softmax %.4f",
                  (unsigned long long)seed, mlp, softmax);
}
END_TEST

START_TEST(test_learn_linear_recovers_teacher)
{
    uint64_t seed = tu_test_seed(11, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = rand_between(&rng, 1, 10), k = rand_between(&rng, 1, 6), rows = 64, steps = 1500;
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
                  tu_param_name(&tr.p, at < 0 ? 0 : at, pname, sizeof pname), (long long)steps);
    trainer_free(&tr);
    teacher_free(&t);
}
END_TEST

/* Every optimizer lowers the loss of a fixed batch. _i: program (even linear, odd softmax) and
 * optimizer (sgd, momentum, adam). */
START_TEST(test_learn_optimizers_decrease_loss)
{
    uint64_t seed = tu_test_seed(12, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = _i % 2;
    ifd_optimizer_kind kind = (ifd_optimizer_kind)((_i / 2) % 3);
    static const float lrs[2][3] = {{0.2f, 0.03f, 0.03f}, {0.5f, 0.1f, 0.05f}};
    int64_t d = rand_between(&rng, 2, 10), k = rand_between(&rng, 2, 5),
            rows = rand_between(&rng, 16, 64);
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
    uint64_t seed = tu_test_seed(13, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = _i % 2;
    int64_t d = rand_between(&rng, 1, 9), k = rand_between(&rng, 2, 6),
            rows = rand_between(&rng, 1, 30);
    trainer tr;
    trainer_init(&tr, cls ? "softmax" : "linear", d, k, rows, ifd_rng_next(&rng));
    int64_t np = tr.p.nparam_floats;
    tu_batch *tb = tu_batch_random(&tr.p, rows, 0, &rng);
    float scale = (float)tu_urand(&rng, 0.1, 1.0), lr = (float)tu_urand(&rng, 0.01, 1.0);
    *tr.st.step = rand_between(&rng, 0, 1000);
    int64_t step0 = *tr.st.step;
    float *p0 = tu_falloc(np), *g = tu_falloc(np);
    memcpy(p0, tr.st.params, sizeof(float) * (size_t)np);
    ifd_step_out want;
    tu_run_step(&tr.p, tb->b.tensors, rows, p0, g, scale, &want);

    ifd_optimizer opt = make_opt(IFD_OPT_SGD, lr);
    ifd_step_out out = {0};
    ifd_error err = {0};
    tu_fill_nan(tr.st.grads, np);
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
                      tu_param_name(&tr.p, j, pname, sizeof pname), (double)tr.st.grads[j],
                      (double)g[j], (double)tr.st.params[j], pj);
    }
    /* The runtime's outfeed values: the all-reduced gradients' norm before the update, the
     * parameters' after it, the learning rate. */
    double gn = 0.0, pn = 0.0;
    for (int64_t j = 0; j < np; j++) {
        gn += (double)g[j] * (double)g[j];
        pn += (double)tr.st.params[j] * (double)tr.st.params[j];
    }
    ck_assert_msg(fabs(out.grad_norm - sqrt(gn)) <= 1.5e-5 * sqrt(gn) &&
                      fabs(out.param_norm - sqrt(pn)) <= 1.5e-5 * sqrt(pn) &&
                      out.learning_rate == lr,
                  "seed %llu: grad_norm %.9g (want %.9g), param_norm %.9g (want %.9g), "
                  "learning_rate %g (want %g)",
                  (unsigned long long)seed, (double)out.grad_norm, sqrt(gn), (double)out.param_norm,
                  sqrt(pn), (double)out.learning_rate, (double)lr);

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

/* ---- optimizer update formulas --------------------------------------------------------------- */

START_TEST(test_optimizer_formulas)
{
    uint64_t seed = tu_test_seed(14, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    ifd_optimizer_kind kind = (ifd_optimizer_kind)(_i % 3);
    ck_assert_int_eq(ifd_optimizer_slots(kind), (int)kind);
    int64_t n = rand_between(&rng, 1, 300);
    int64_t step = _i < 3 ? 0 : rand_between(&rng, 0, 40), step_before = step;
    ifd_optimizer opt = {
        .kind = kind,
        .learning_rate = (float)tu_urand(&rng, 1e-3, 0.5),
        .momentum = (float)tu_urand(&rng, 0.0, 0.99),
        .beta1 = (float)tu_urand(&rng, 0.5, 0.95),
        .beta2 = (float)tu_urand(&rng, 0.9, 0.9999),
        .epsilon = (float)pow(10.0, tu_urand(&rng, -8.0, -2.0)),
    };
    float *p = tu_falloc(n), *g = tu_falloc(n), *m = tu_falloc(n), *v = tu_falloc(n);
    float *p1 = tu_falloc(n), *m1 = tu_falloc(n), *v1 = tu_falloc(n);
    for (int64_t i = 0; i < n; i++) {
        p[i] = (float)tu_urand(&rng, -2.0, 2.0);
        g[i] = (float)(tu_urand(&rng, -1.0, 1.0) * pow(10.0, tu_urand(&rng, -4.0, 0.0)));
        m[i] = (float)(tu_urand(&rng, -1.0, 1.0) * pow(10.0, tu_urand(&rng, -4.0, 0.0)));
        v[i] = (float)(ifd_rng_uniform(&rng) * pow(10.0, tu_urand(&rng, -8.0, 0.0)));
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

int main(void)
{
    Suite *s = suite_create("step_train");
    TCase *tc = tu_tcase(s, "learning", 60);
    tcase_add_loop_test(tc, test_learn_softmax_accuracy, 0, 4);
    tcase_add_loop_test(tc, test_learn_linear_recovers_teacher, 0, 4);
    tcase_add_loop_test(tc, test_learn_mlp_beats_softmax_on_xor, 0, 3);
    tcase_add_loop_test(tc, test_learn_optimizers_decrease_loss, 0, 12);
    tcase_add_loop_test(tc, test_step_train_one_step, 0, 6);
    tc = tu_tcase(s, "optimizers", 60);
    tcase_add_loop_test(tc, test_optimizer_formulas, 0, 15);
    return tu_run_suite(s);
}
