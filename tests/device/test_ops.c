/* The ops added for plugins' models (tanh, tanh_grad, l2_decay) on the cpu op set, against a
 * double reference and central differences, over random sizes and values. The cuda backend's
 * kernels call the same device/math.h formulas. Each test prints its seed when it fails
 * (IFD_TEST_SEED replays it). */
#include "core/rng.h"
#include "device/step.h"
#include <infeed/program.h>
#include "tests/util/numbers.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <stdio.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_tanh)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    for (int trial = 0; trial < 20; trial++) {
        int64_t n = rand_between(&rng, 0, 3000);
        double span = tu_urand(&rng, 0.1, 12.0);
        float *x = tu_falloc(n), *y = tu_falloc(n), *dy = tu_falloc(n), *dx = tu_falloc(n);
        for (int64_t i = 0; i < n; i++) {
            x[i] = (float)tu_urand(&rng, -span, span);
            dy[i] = (float)tu_urand(&rng, -2, 2);
        }
        ops.tanh(ops.ctx, n, x, y);
        ops.tanh_grad(ops.ctx, n, y, dy, dx);
        for (int64_t i = 0; i < n; i++) {
            double want = tanh((double)x[i]);
            RASSERT(fabs((double)y[i] - want) <= 2e-7 + 2e-6 * fabs(want),
                    "n=%" PRId64 ": tanh(%.9g) = %.9g, want %.9g", n, (double)x[i], (double)y[i],
                    want);
            /* The gradient against the central difference of tanh in double. */
            double e = 1e-4, num = (tanh((double)x[i] + e) - tanh((double)x[i] - e)) / (2 * e);
            double g = (double)dy[i] * num;
            RASSERT(fabs((double)dx[i] - g) <= 1e-5 + 1e-4 * fabs(g),
                    "n=%" PRId64 ": tanh_grad at x=%.9g dy=%.9g: %.9g, central difference %.9g", n,
                    (double)x[i], (double)dy[i], (double)dx[i], g);
        }
        /* In place, as programs call them: y = x, dx = dy. */
        memcpy(dx, x, sizeof(float) * (size_t)n);
        ops.tanh(ops.ctx, n, dx, dx);
        RASSERT(n == 0 || memcmp(dx, y, sizeof(float) * (size_t)n) == 0, "tanh in place differs");
        memcpy(x, dy, sizeof(float) * (size_t)n);
        ops.tanh_grad(ops.ctx, n, y, x, x);
        ops.tanh_grad(ops.ctx, n, y, dy, dx);
        RASSERT(n == 0 || memcmp(dx, x, sizeof(float) * (size_t)n) == 0,
                "tanh_grad in place differs");
        free(x);
        free(y);
        free(dy);
        free(dx);
    }
}
END_TEST

START_TEST(test_l2_decay)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    for (int trial = 0; trial < 20; trial++) {
        int64_t n = rand_between(&rng, 0, 2000);
        float decay = (float)tu_urand(&rng, 1e-4, 0.5), scale = (float)tu_urand(&rng, 0.1, 2.0);
        float before = (float)tu_urand(&rng, 0, 3);
        float *w = tu_falloc(n), *g = tu_falloc(n), *g0 = tu_falloc(n);
        for (int64_t i = 0; i < n; i++) {
            w[i] = (float)tu_urand(&rng, -3, 3);
            g0[i] = g[i] = (float)tu_urand(&rng, -1, 1);
        }
        ifd_step_out out = {.loss = before};
        ops.l2_decay(ops.ctx, n, decay, scale, w, g, &out);
        double pen = 0.0;
        for (int64_t i = 0; i < n; i++)
            pen += 0.5 * (double)decay * (double)w[i] * (double)w[i];
        double want = (double)before + (double)scale * pen;
        RASSERT(fabs((double)out.loss - want) <= 1e-6 * fabs(want) + 1e-7,
                "n=%" PRId64 " decay %g scale %g: loss %.9g, want %.9g (%.9g before)", n,
                (double)decay, (double)scale, (double)out.loss, want, (double)before);
        /* Each gradient: what it held plus the central difference of the scaled penalty. */
        for (int64_t i = 0; i < n; i++) {
            double e = 1e-3, wi = (double)w[i];
            double num = (double)scale * 0.5 * (double)decay *
                         ((wi + e) * (wi + e) - (wi - e) * (wi - e)) / (2 * e);
            double gw = (double)g0[i] + num;
            RASSERT(fabs((double)g[i] - gw) <= 1e-6 + 1e-5 * fabs(gw),
                    "n=%" PRId64 " decay %g scale %g: grad[%" PRId64 "] %.9g, want %.9g", n,
                    (double)decay, (double)scale, i, (double)g[i], gw);
        }
        /* Eval (grad NULL): the loss only. */
        ifd_step_out ev = {.loss = before};
        ops.l2_decay(ops.ctx, n, decay, scale, w, NULL, &ev);
        RASSERT(ev.loss == out.loss, "eval loss %.9g, train loss %.9g", (double)ev.loss,
                (double)out.loss);
        free(w);
        free(g);
        free(g0);
    }
}
END_TEST

/* classify: the argmax (first of equal maxima) and its softmax probability, against double. */
START_TEST(test_classify)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    for (int trial = 0; trial < 30; trial++) {
        int64_t rows = rand_between(&rng, 0, 200), k = rand_between(&rng, 1, 12);
        float *z = tu_falloc(rows * k + 1), *conf = tu_falloc(rows + 1);
        int32_t *cls = calloc((size_t)rows + 1, sizeof *cls);
        for (int64_t i = 0; i < rows * k; i++) /* some ties: a few values, repeated */
            z[i] = trial % 3 == 0 ? (float)rand_between(&rng, -2, 2) : (float)tu_urand(&rng, -8, 8);
        ops.classify(ops.ctx, rows, k, z, cls, conf);
        for (int64_t r = 0; r < rows; r++) {
            const float *row = z + r * k;
            int64_t arg = 0;
            for (int64_t j = 1; j < k; j++)
                if (row[j] > row[arg])
                    arg = j;
            double sum = 0.0;
            for (int64_t j = 0; j < k; j++)
                sum += exp((double)row[j] - (double)row[arg]);
            RASSERT(cls[r] == arg,
                    "rows %" PRId64 " k %" PRId64 ": row %" PRId64 " class %d, "
                    "expected %" PRId64,
                    rows, k, r, cls[r], arg);
            RASSERT(fabs(conf[r] - 1.0 / sum) <= 1e-6,
                    "row %" PRId64 ": confidence %.8g, "
                    "expected %.8g",
                    r, (double)conf[r], 1.0 / sum);
        }
        /* Either output may be NULL: the other is the same. */
        int32_t *cls2 = calloc((size_t)rows + 1, sizeof *cls2);
        float *conf2 = tu_falloc(rows + 1);
        ops.classify(ops.ctx, rows, k, z, cls2, NULL);
        ops.classify(ops.ctx, rows, k, z, NULL, conf2);
        RASSERT(memcmp(cls, cls2, sizeof *cls * (size_t)rows) == 0 &&
                    memcmp(conf, conf2, sizeof *conf * (size_t)rows) == 0,
                "classify with a NULL output differs");
        free(z);
        free(conf);
        free(cls);
        free(cls2);
        free(conf2);
    }
}
END_TEST

/* softmax_xent_classify: softmax_xent's loss, correct and dlogits and classify's class and
 * confidence, bit for bit, in one pass. */
START_TEST(test_softmax_xent_classify)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    for (int trial = 0; trial < 20; trial++) {
        int64_t rows = rand_between(&rng, 1, 100), k = rand_between(&rng, 1, 9);
        float *z = tu_falloc(rows * k), *d1 = tu_falloc(rows * k), *d2 = tu_falloc(rows * k);
        float *conf1 = tu_falloc(rows), *conf2 = tu_falloc(rows);
        int32_t *y = calloc((size_t)rows, sizeof *y), *cls1 = calloc((size_t)rows, sizeof *cls1),
                *cls2 = calloc((size_t)rows, sizeof *cls2);
        for (int64_t i = 0; i < rows * k; i++)
            z[i] = (float)tu_urand(&rng, -5, 5);
        for (int64_t r = 0; r < rows; r++)
            y[r] = (int32_t)rand_between(&rng, 0, k - 1);
        float scale = (float)tu_urand(&rng, 0.1, 1.0);
        ifd_step_out o1 = {0}, o2 = {0};
        ops.softmax_xent(ops.ctx, rows, k, z, y, scale, d1, &o1);
        ops.classify(ops.ctx, rows, k, z, cls1, conf1);
        ops.softmax_xent_classify(ops.ctx, rows, k, z, y, scale, d2, &o2, cls2, conf2);
        RASSERT(o1.loss == o2.loss && o1.correct == o2.correct &&
                    memcmp(d1, d2, sizeof *d1 * (size_t)(rows * k)) == 0 &&
                    memcmp(cls1, cls2, sizeof *cls1 * (size_t)rows) == 0 &&
                    memcmp(conf1, conf2, sizeof *conf1 * (size_t)rows) == 0,
                "rows %" PRId64 " k %" PRId64 ": the fused op differs", rows, k);
        ifd_step_out o3 = {0}; /* and without the classify outputs */
        ops.softmax_xent_classify(ops.ctx, rows, k, z, y, scale, d2, &o3, NULL, NULL);
        RASSERT(o3.loss == o1.loss && o3.correct == o1.correct, "without outputs");
        free(z);
        free(d1);
        free(d2);
        free(conf1);
        free(conf2);
        free(y);
        free(cls1);
        free(cls2);
    }
}
END_TEST

START_TEST(test_copy)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_ops ops;
    ifd_cpu_ops_init(&ops, NULL);
    int64_t n = rand_between(&rng, 0, 4000);
    unsigned char *src = malloc((size_t)n + 1), *dst = calloc((size_t)n + 2, 1);
    for (int64_t i = 0; i < n; i++)
        src[i] = (unsigned char)rand_between(&rng, 0, 255);
    dst[n] = 0xA5;
    ops.copy(ops.ctx, dst, src, n);
    RASSERT(memcmp(dst, src, (size_t)n) == 0 && dst[n] == 0xA5, "copy of %" PRId64 " bytes", n);
    free(src);
    free(dst);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_tanh);
    tcase_add_test(tc, test_l2_decay);
    tcase_add_test(tc, test_classify);
    tcase_add_test(tc, test_copy);
    tcase_add_test(tc, test_softmax_xent_classify);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
