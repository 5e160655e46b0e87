/* A built-in program's setup and checks: the layout and initial parameters a valid setup
 * declares, the sentence that names the setting a bad setup got wrong, unknown and registered
 * programs, and the label check of softmax and mlp batches.
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

extern const ifd_program_class ifd_program_linear;

/* ---- check_batch ----------------------------------------------------------------------------- */

/* softmax and mlp: every label in [0, K), else IFD_ERANGE naming the row and the label. */
START_TEST(test_softmax_check_batch)
{
    uint64_t seed = tu_test_seed(6, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = rand_between(&rng, 1, 6), k = rand_between(&rng, 2, 12),
            rows = rand_between(&rng, 2, 40);
    const char *name = (_i / 4) % 2 ? "mlp" : "softmax";
    ifd_program p;
    tu_make_program_h(&p, name, d, 5, k);
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
        bad = (int32_t)(k + rand_between(&rng, 1, 1000));
        break;
    default:
        bad = (int32_t)-rand_between(&rng, 2, 100000);
        break;
    }
    int64_t bad_row;
    do
        bad_row = rand_between(&rng, 1, rows - 1);
    while (bad_row == k || bad_row == bad);
    int32_t saved = y[bad_row];
    y[bad_row] = bad;
    ifd_error_clear(&err);
    rc = p.cls->check_batch(&p, tb->b.tensors, rows, &err);
    ck_assert_msg(
        rc == IFD_ERANGE, "seed %llu K=%lld: label %d at row %lld: rc %s, want IFD_ERANGE",
        (unsigned long long)seed, (long long)k, (int)bad, (long long)bad_row, ifd_errname(rc));
    ck_assert_int_eq(err.code, IFD_ERANGE);
    ck_assert_msg(tu_has_number(err.msg, bad_row),
                  "seed %llu: sentence does not name row %lld: '%s'", (unsigned long long)seed,
                  (long long)bad_row, err.msg);
    ck_assert_msg(tu_has_number(err.msg, bad), "seed %llu: sentence does not name label %d: '%s'",
                  (unsigned long long)seed, (int)bad, err.msg);
    y[bad_row] = saved;
    ck_assert_int_eq(p.cls->check_batch(&p, tb->b.tensors, rows, &err), IFD_OK);
    tu_batch_free(tb);
    ifd_program_free(&p);
}
END_TEST

/* ---- setup ----------------------------------------------------------------------------------- */

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
        ck_assert_msg(tu_has_number(err.msg, c->given), "sentence should give the value %lld: '%s'",
                      (long long)c->given, err.msg);
    ck_assert_msg(strstr(err.msg, c->program) != NULL, "sentence should name the program: '%s'",
                  err.msg);
    ifd_program_free(&p);
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
    tu_make_program(&p, "extra_prog", 3, 2);
    ck_assert_ptr_eq(p.cls, &extra);
    ifd_program_free(&p);
}
END_TEST

/* Outfeed tensors: what ifd_program_add_outfeed refuses, the classifiers' declarations and the
 * layout of a step's area. */
START_TEST(test_outfeed_decls)
{
    ifd_program p;
    memset(&p, 0, sizeof p);
    int64_t ok[2] = {3, 2}, zero[1] = {0};
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "a", IFD_F32, 1, 2, ok), IFD_OK);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "a", IFD_I32, 1, 0, NULL), IFD_EINVAL); /* taken */
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "loss", IFD_F32, 0, 0, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "grad_norm", IFD_F32, 0, 0, NULL), IFD_EINVAL);
    /* a name that JSON or a subscription topic would have to escape */
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "a\"b", IFD_F32, 1, 0, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "a b", IFD_F32, 1, 0, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "", IFD_F32, 0, 0, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "b", IFD_I64, 0, 0, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "b", IFD_F32, 2, 0, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "b", IFD_F32, 0, 1, zero), IFD_EINVAL);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "b", IFD_F32, 0, IFD_MAX_RANK, ok), IFD_EINVAL);
    ck_assert_int_eq(p.noutfeeds, 1);
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "b", IFD_I32, 0, 0, NULL), IFD_OK);
    for (int i = 2; i < IFD_MAX_OUTFEEDS; i++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        ck_assert_int_eq(ifd_program_add_outfeed(&p, name, IFD_F32, 1, 0, NULL), IFD_OK);
    }
    ck_assert_int_eq(ifd_program_add_outfeed(&p, "more", IFD_F32, 1, 0, NULL), IFD_EINVAL);
    /* a: 6 floats a row; b: one int32 a step; each at a multiple of 256, none overlapping */
    ck_assert_int_eq(ifd_program_outfeed_value_bytes(&p, 0), 24);
    ck_assert_int_eq(ifd_program_outfeed_value_bytes(&p, 1), 4);
    int64_t offs[IFD_MAX_OUTFEEDS];
    int64_t rows = 100, total = ifd_program_outfeed_layout(&p, rows, offs);
    for (int i = 0; i < p.noutfeeds; i++) {
        int64_t len = ifd_program_outfeed_value_bytes(&p, i) * (p.outfeeds[i].per_row ? rows : 1);
        ck_assert_int_eq(offs[i] % 256, 0);
        ck_assert_int_le(offs[i] + len, i + 1 < p.noutfeeds ? offs[i + 1] : total);
    }
    /* The classifiers declare class, confidence and label; linear none. */
    static const char *const names[] = {"class", "confidence", "label"};
    static const ifd_dtype dts[] = {IFD_I32, IFD_F32, IFD_I32};
    tu_make_program_h(&p, "mlp", 3, 4, 2);
    ck_assert_int_eq(p.noutfeeds, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_str_eq(p.outfeeds[i].name, names[i]);
        ck_assert_int_eq(p.outfeeds[i].dtype, dts[i]);
        ck_assert_int_eq(p.outfeeds[i].per_row, 1);
        ck_assert_int_eq(p.outfeeds[i].rank, 0);
    }
    ifd_program_free(&p);
    tu_make_program(&p, "softmax", 3, 2);
    ck_assert_int_eq(p.noutfeeds, 3);
    ifd_program_free(&p);
    tu_make_program(&p, "linear", 3, 2);
    ck_assert_int_eq(p.noutfeeds, 0);
    ck_assert_int_eq(ifd_program_outfeed_layout(&p, 50, offs), 0);
    ifd_program_free(&p);
}
END_TEST

/* The layout a valid setup declares, and init_params. */
START_TEST(test_setup_layout)
{
    uint64_t seed = tu_test_seed(7, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int cls = _i % 2;
    const char *name = cls ? "softmax" : "linear";
    int64_t d = rand_between(&rng, 1, 20), k = rand_between(&rng, cls ? 2 : 1, 12);
    ifd_program p;
    tu_make_program(&p, name, d, k);
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
    float *a1 = tu_falloc(np), *a2 = tu_falloc(np), *a3 = tu_falloc(np);
    uint64_t s1 = ifd_rng_next(&rng);
    tu_fill_nan(a1, np);
    tu_fill_nan(a2, np);
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
    ifd_program_free(&p);
}
END_TEST

/* mlp's layout: x and the label y; W1 [D,H], b1 [H], W2 [H,K], b2 [K] in that order; Glorot
 * weights within their bounds from two different streams, zero biases, a function of the seed. */
START_TEST(test_mlp_layout)
{
    uint64_t seed = tu_test_seed(34, _i);
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    int64_t d = rand_between(&rng, 1, 20), h = rand_between(&rng, 1, 24),
            k = rand_between(&rng, 2, 12);
    ifd_program p;
    tu_make_program_h(&p, "mlp", d, h, k);
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
    float *a1 = tu_falloc(np), *a2 = tu_falloc(np), *a3 = tu_falloc(np), *w2same = tu_falloc(h * k);
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
    ifd_program_free(&p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("program_setup");
    TCase *tc = tu_tcase(s, "check_batch", 60);
    tcase_add_loop_test(tc, test_softmax_check_batch, 0, 16);
    tc = tu_tcase(s, "setup", 60);
    tcase_add_loop_test(tc, test_setup_errors, 0,
                        (int)(sizeof setup_cases / sizeof setup_cases[0]));
    tcase_add_test(tc, test_setup_unknown_program);
    tcase_add_test(tc, test_outfeed_decls);
    tcase_add_loop_test(tc, test_setup_layout, 0, 6);
    tcase_add_loop_test(tc, test_mlp_layout, 0, 6);
    return tu_run_suite(s);
}
