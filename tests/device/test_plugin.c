/* Program plugins (ifd_program_load_plugin, include/infeed/program.h): the example plugin
 * examples/custom_program/mlp2.c, built in this tree, loads and registers 'mlp2'; its loss,
 * gradients (against central differences of a double reference), eval and predict steps on the
 * cpu op set; and each way a plugin is refused (tests/device/bad_plugin.c), with its sentence.
 * Shapes and values are random: a failure names its seed (IFD_TEST_SEED replays it). */
#include "core/rng.h"
#include "device/step.h"
#include <infeed/program.h>
#include "tests/util/program_ref.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef IFD_PLUGIN_DIR
#error "IFD_PLUGIN_DIR: the folder of the test plugins (tests/CMakeLists.txt)"
#endif
#ifndef MLP2_WEIGHT_DECAY
#error "MLP2_WEIGHT_DECAY: the weight decay the test's mlp2 is built with"
#endif

#define MLP2_PATH IFD_PLUGIN_DIR "/ifd_mlp2_decay.so"

static void load_ok(const char *path)
{
    ifd_error err;
    ifd_error_clear(&err);
    int rc = ifd_program_load_plugin(path, &err);
    ck_assert_msg(rc == IFD_OK, "loading %s: %s", path, ifd_error_text(&err));
}

/* Loading path fails with IFD_EINVAL and a sentence holding each of the NULL-ended parts; the
 * registered names stay as they were. */
static void load_fails(const char *path, ...)
{
    char before[512], after[512];
    ifd_program_names(before, sizeof before);
    ifd_error err;
    ifd_error_clear(&err);
    int rc = ifd_program_load_plugin(path, &err);
    ck_assert_msg(rc == IFD_EINVAL, "loading %s: rc %d (%s)", path, rc, ifd_error_text(&err));
    ck_assert_msg(strchr(err.msg, '\n') == NULL, "two lines: %s", err.msg);
    va_list ap;
    va_start(ap, path);
    for (const char *part = va_arg(ap, const char *); part; part = va_arg(ap, const char *))
        ck_assert_msg(strstr(err.msg, part) != NULL, "'%s' not in: %s", part, err.msg);
    va_end(ap);
    ck_assert_str_eq(ifd_program_names(after, sizeof after), before);
}

START_TEST(test_load_registers)
{
    ck_assert_ptr_null(ifd_program_find("mlp2"));
    load_ok(MLP2_PATH);
    const ifd_program_class *c = ifd_program_find("mlp2");
    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_nonnull(c->predict_step);
    /* Again (the same file from the config file and a flag): nothing new, no error. */
    char names[512];
    ifd_program_names(names, sizeof names);
    load_ok(MLP2_PATH);
    char again[512];
    ck_assert_str_eq(ifd_program_names(again, sizeof again), names);
    ck_assert_str_eq(names, "linear, softmax, mlp, read, charlm, mlp2");
    /* A built-in is still there. */
    ck_assert_ptr_nonnull(ifd_program_find("mlp"));
}
END_TEST

START_TEST(test_load_relative_name)
{
    /* A name without '/' is the file in the current folder, not a library path search. */
    ck_assert_int_eq(chdir(IFD_PLUGIN_DIR), 0);
    load_ok("ifd_mlp2_decay.so");
    ck_assert_ptr_nonnull(ifd_program_find("mlp2"));
    load_fails("ifd_no_such_plugin.so", "program library 'ifd_no_such_plugin.so': cannot load it: ",
               "./ifd_no_such_plugin.so", NULL);
}
END_TEST

START_TEST(test_load_errors)
{
    load_fails("/nonexistent/dir/model.so",
               "program library '/nonexistent/dir/model.so': cannot load it: ",
               "No such file or directory", NULL);
    load_fails("", "program library: expected a file name", NULL);
    /* Not a shared object at all. */
    char path[] = "/tmp/ifd_not_a_plugin_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "hello\n", 6), 6);
    close(fd);
    load_fails(path, "cannot load it: ", NULL);
    unlink(path);
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_noentry.so",
               "ifd_bad_plugin_noentry.so': no entry point (symbol ifd_program_plugin_abi)",
               "IFD_PROGRAM_PLUGIN", NULL);
    char abi[80];
    snprintf(abi, sizeof abi, "built for program ABI version 99, expected version %d",
             IFD_PROGRAM_ABI_VERSION);
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_abi.so", abi, NULL);
    /* A plugin built before gemm_bias's ABI (5): both versions named. */
    ck_assert_int_eq(IFD_PROGRAM_ABI_VERSION, 5);
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_abi4.so",
               "built for program ABI version 4, expected version 5", NULL);
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_builtin.so",
               "registers program 'mlp', the name of a built-in program", NULL);
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_fail.so",
               "its ifd_program_plugin_init failed: this plugin needs a GPU it did not find", NULL);
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_empty.so", "registers no program", NULL);
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_incomplete.so",
               "registers a program class 'incomplete' without all of name, setup", NULL);
    /* Two of one name: neither is registered. */
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_twice.so", "registers program 'bad' twice", NULL);
    ck_assert_ptr_null(ifd_program_find("bad"));
    /* A refusal the entry point ignores still fails the load, with the refusal's sentence. */
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_ignore.so",
               "ifd_bad_plugin_ignore.so': registers program 'softmax', the name of a built-in "
               "program",
               NULL);
    ck_assert_ptr_null(ifd_program_find("bad"));
    /* Another plugin's name. */
    load_ok(MLP2_PATH);
    load_fails(IFD_PLUGIN_DIR "/ifd_bad_plugin_plugin.so",
               "registers program 'mlp2', a name program library '" MLP2_PATH
               "' registered already",
               NULL);
}
END_TEST

/* ---- mlp2's step against a double reference ---------------------------------------------------
 */

typedef struct ref {
    double loss;
    unsigned char *active; /* rows x H: the ReLU's pattern */
    double *probs;         /* rows x K */
} ref;

/* The loss of mlp2 in double: the mean cross-entropy plus decay / 2 * |W|^2 of the weights. */
static void ref_run(const ifd_program *p, const float *x, const int32_t *y, int64_t rows,
                    const float *params, ref *out)
{
    int64_t d = p->settings.features, h = p->settings.hidden, k = p->settings.classes;
    const float *w[3], *b[3];
    for (int i = 0; i < 3; i++) {
        w[i] = params + p->params[2 * i].offset;
        b[i] = params + p->params[2 * i + 1].offset;
    }
    double *a1 = malloc(sizeof(double) * (size_t)h), *a2 = malloc(sizeof(double) * (size_t)h);
    double *z = malloc(sizeof(double) * (size_t)k);
    double total = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < h; j++) {
            double s = b[0][j];
            for (int64_t i = 0; i < d; i++)
                s += (double)x[r * d + i] * w[0][i * h + j];
            a1[j] = tanh(s);
        }
        for (int64_t j = 0; j < h; j++) {
            double s = b[1][j];
            for (int64_t i = 0; i < h; i++)
                s += a1[i] * w[1][i * h + j];
            out->active[r * h + j] = s > 0;
            a2[j] = s > 0 ? s : 0.0;
        }
        double mx = -INFINITY;
        for (int64_t j = 0; j < k; j++) {
            double s = b[2][j];
            for (int64_t i = 0; i < h; i++)
                s += a2[i] * w[2][i * k + j];
            z[j] = s;
            mx = s > mx ? s : mx;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < k; j++)
            sum += exp(z[j] - mx);
        double lse = mx + log(sum);
        for (int64_t j = 0; j < k; j++)
            out->probs[r * k + j] = exp(z[j] - lse);
        total += lse - z[y[r]];
    }
    double pen = 0.0;
    for (int i = 0; i < 3; i++)
        for (int64_t j = 0; j < p->params[2 * i].count; j++)
            pen += 0.5 * (double)MLP2_WEIGHT_DECAY * (double)w[i][j] * (double)w[i][j];
    out->loss = total / (double)rows + pen;
    free(a1);
    free(a2);
    free(z);
}

START_TEST(test_mlp2_gradients)
{
    load_ok(MLP2_PATH);
    ifd_rng rng;
    seed_rng(&rng);
    int kinked = 0; /* trials with a pre-activation within the difference step of 0 */
    for (int trial = 0; trial < 8; trial++) {
        int64_t d = rand_between(&rng, 1, 8), h = rand_between(&rng, 1, 10);
        int64_t k = rand_between(&rng, 2, 6), rows = rand_between(&rng, 1, 30);
        ifd_program_settings s = {.features = d, .classes = k, .hidden = h};
        ifd_program p;
        ifd_error err;
        ifd_error_clear(&err);
        RASSERT(ifd_program_init(&p, "mlp2", &s, &err) == IFD_OK, "%s", ifd_error_text(&err));
        char what[96];
        snprintf(what, sizeof what, "mlp2 D=%" PRId64 " H=%" PRId64 " K=%" PRId64 " rows=%" PRId64,
                 d, h, k, rows);
        int64_t np = p.nparam_floats;
        RASSERT(np == d * h + h + h * h + h + h * k + k, "%s: %" PRId64 " parameters", what, np);
        float *params = malloc(sizeof(float) * (size_t)np);
        float *grads = malloc(sizeof(float) * (size_t)np);
        float *g2 = malloc(sizeof(float) * (size_t)np);
        p.cls->init_params(&p, params, ifd_rng_next(&rng));
        for (int64_t j = 0; j < np; j++)
            params[j] += (float)(ifd_rng_uniform(&rng) - 0.5);
        tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
        const ifd_tensor *in = tb->b.tensors;
        const float *x = in[0].data;
        const int32_t *y = in[1].data;
        ref r0 = {.active = malloc((size_t)(rows * h)),
                  .probs = malloc(sizeof(double) * (size_t)(rows * k))};
        ref ru = r0, rd = r0;
        ru.active = malloc((size_t)(rows * h));
        rd.active = malloc((size_t)(rows * h));

        for (int64_t j = 0; j < np; j++)
            grads[j] = NAN;
        ifd_step_out out;
        tu_run_any_step(&p, in, rows, params, grads, 1.0f, &out, NULL);
        ref_run(&p, x, y, rows, params, &r0);
        RASSERT(fabs((double)out.loss - r0.loss) <= 1e-5 * fabs(r0.loss) + 1e-6,
                "%s: loss %.9g, reference %.9g", what, (double)out.loss, r0.loss);

        int64_t skipped = 0;
        double biggest = 0.0;
        for (int64_t j = 0; j < np; j++) {
            RASSERT(isfinite(grads[j]), "%s: gradient %" PRId64 " not written", what, j);
            float orig = params[j], up = orig + 1e-5f, dn = orig - 1e-5f;
            params[j] = up;
            ref_run(&p, x, y, rows, params, &ru);
            params[j] = dn;
            ref_run(&p, x, y, rows, params, &rd);
            params[j] = orig;
            if (memcmp(ru.active, rd.active, (size_t)(rows * h)) != 0) {
                skipped++; /* a ReLU kink within the step */
                continue;
            }
            double num = (ru.loss - rd.loss) / ((double)up - (double)dn);
            biggest = fabs(num) > biggest ? fabs(num) : biggest;
            RASSERT(fabs((double)grads[j] - num) <= 2e-4 + 1e-2 * fabs(num),
                    "%s: d loss / d param %" PRId64 ": analytic %.7g, central difference %.7g",
                    what, j, (double)grads[j], num);
        }
        /* A pre-activation within 1e-5 of 0 flips for every parameter upstream of it, so a trial
         * can skip many (about 1 in 100 draws); more than 2 such trials in 8 is a bug. */
        if (skipped > np / 10)
            kinked++;
        else
            RASSERT(biggest > 1e-2, "%s: every gradient tiny (%g)", what, biggest);
        RASSERT(kinked <= 2,
                "%s: %d trials skipped more than a tenth of the parameters at a kink "
                "(this one %" PRId64 " of %" PRId64 ")",
                what, kinked, skipped, np);

        /* Eval: the same loss, no gradient written. */
        ifd_step_out ev;
        tu_run_any_step(&p, in, rows, params, NULL, 1.0f, &ev, NULL);
        RASSERT(ev.loss == out.loss, "%s: eval loss %.9g, train loss %.9g", what, (double)ev.loss,
                (double)out.loss);
        /* The scale multiplies the loss (decay included) and every gradient. */
        ifd_step_out so;
        tu_run_any_step(&p, in, rows, params, g2, 0.25f, &so, NULL);
        RASSERT(fabs((double)so.loss - 0.25 * out.loss) <= 1e-6 * fabs(out.loss),
                "%s: scale 0.25: loss %.9g, want %.9g", what, (double)so.loss,
                0.25 * (double)out.loss);
        for (int64_t j = 0; j < np; j++)
            RASSERT(fabs((double)g2[j] - 0.25 * grads[j]) <= 1e-5 * fabs(grads[j]) + 1e-7,
                    "%s: scale 0.25: gradient %" PRId64 " %.9g, want %.9g", what, j, (double)g2[j],
                    0.25 * (double)grads[j]);
        /* Predict: the reference's probabilities. */
        float *pred = malloc(sizeof(float) * (size_t)(rows * k));
        RASSERT(p.predict_cols == k, "%s: predict_cols %" PRId64, what, p.predict_cols);
        tu_run_any_step(&p, in, rows, params, NULL, 1.0f, &so, pred);
        for (int64_t i = 0; i < rows * k; i++)
            RASSERT(fabs((double)pred[i] - r0.probs[i]) <= 1e-5,
                    "%s: probability %" PRId64 ": %.7g, reference %.7g", what, i, (double)pred[i],
                    r0.probs[i]);
        free(pred);
        free(r0.active);
        free(r0.probs);
        free(ru.active);
        free(rd.active);
        tu_batch_free(tb);
        free(params);
        free(grads);
        free(g2);
        ifd_program_free(&p);
    }
}
END_TEST

/* mlp2's own setting weight_decay (program_config, kept in the program's state): the loss of
 * random weights differs from the default's by the penalty's difference; bad values and unknown
 * keys are refused with the library's sentences. */
START_TEST(test_mlp2_weight_decay_setting)
{
    load_ok(MLP2_PATH);
    ifd_rng rng;
    seed_rng(&rng);
    int64_t d = rand_between(&rng, 1, 8), h = rand_between(&rng, 1, 10);
    int64_t k = rand_between(&rng, 2, 6), rows = rand_between(&rng, 1, 30);
    double decay = (double)rand_between(&rng, 1, 1000) / 1000.0;
    char text[64];
    snprintf(text, sizeof text, "{\"weight_decay\": %.3f}", decay);
    ifd_program_settings s = {.features = d, .classes = k, .hidden = h};
    ifd_program p, q;
    ifd_error err;
    ifd_error_clear(&err);
    RASSERT(ifd_program_init(&p, "mlp2", &s, &err) == IFD_OK, "%s", err.msg);
    s.config = text;
    RASSERT(ifd_program_init(&q, "mlp2", &s, &err) == IFD_OK, "%s", err.msg);
    float *params = malloc(sizeof(float) * (size_t)p.nparam_floats);
    ifd_program_init_params(&p, params, ifd_rng_next(&rng));
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    ifd_step_out a, b;
    float scale = (float)(1.0 / (double)rand_between(&rng, 1, 4));
    tu_run_any_step(&p, tb->b.tensors, rows, params, NULL, scale, &a, NULL);
    tu_run_any_step(&q, tb->b.tensors, rows, params, NULL, scale, &b, NULL);
    double sq = 0.0;
    for (int i = 0; i < 3; i++) {
        const ifd_param_spec *ps = &p.params[2 * i];
        for (int64_t j = 0; j < ps->count; j++)
            sq += (double)params[ps->offset + j] * params[ps->offset + j];
    }
    double want = scale * 0.5 * (decay - (double)MLP2_WEIGHT_DECAY) * sq;
    RASSERT(fabs(((double)b.loss - a.loss) - want) <= 1e-4 * (fabs(b.loss) + fabs(a.loss)) + 1e-6,
            "loss %.9g with decay %g, %.9g with %g: difference %.9g, want %.9g", (double)b.loss,
            decay, (double)a.loss, (double)MLP2_WEIGHT_DECAY, (double)b.loss - a.loss, want);
    free(params);
    tu_batch_free(tb);
    ifd_program_free(&p);
    ifd_program_free(&q);
    s.config = "{\"weight_decay\": 2}";
    ck_assert_int_eq(ifd_program_init(&p, "mlp2", &s, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "program 'mlp2': program_config setting 'weight_decay': expected a "
                              "number from 0 to 1, got 2");
    s.config = "{\"decay\": 0.1}";
    ck_assert_int_eq(ifd_program_init(&p, "mlp2", &s, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "program 'mlp2': program_config setting 'decay': the program has no "
                              "such setting (it reads weight_decay)");
}
END_TEST

START_TEST(test_mlp2_setup_errors)
{
    load_ok(MLP2_PATH);
    ifd_program p;
    ifd_error err;
    ifd_program_settings s = {.features = 4, .classes = 3, .hidden = 0};
    ifd_error_clear(&err);
    ck_assert_int_eq(ifd_program_init(&p, "mlp2", &s, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "program 'mlp2': setting 'hidden' must be between 1 and 1048576, "
                              "and it is not set");
    s = (ifd_program_settings){.features = 4, .classes = 1, .hidden = 5};
    ck_assert_int_eq(ifd_program_init(&p, "mlp2", &s, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "'classes' must be between 2") != NULL, "%s", err.msg);
    /* The label check names the row and the label. */
    s = (ifd_program_settings){.features = 2, .classes = 3, .hidden = 2};
    ck_assert_int_eq(ifd_program_init(&p, "mlp2", &s, &err), IFD_OK);
    ifd_rng rng;
    seed_rng(&rng);
    tu_batch *tb = tu_batch_random(&p, 5, 0, &rng);
    ((int32_t *)tb->data[1])[3] = 3;
    ck_assert_int_eq(p.cls->check_batch(&p, tb->b.tensors, 5, &err), IFD_ERANGE);
    ck_assert_str_eq(err.msg, "tensor 'y' row 3: label 3 is out of range, expected 0 <= label < 3");
    tu_batch_free(tb);
    ifd_program_free(&p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plugin");
    TCase *tc = tcase_create("plugin");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_load_registers);
    tcase_add_test(tc, test_load_relative_name);
    tcase_add_test(tc, test_load_errors);
    tcase_add_test(tc, test_mlp2_gradients);
    tcase_add_test(tc, test_mlp2_setup_errors);
    tcase_add_loop_test(tc, test_mlp2_weight_decay_setting, 0, 5);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
