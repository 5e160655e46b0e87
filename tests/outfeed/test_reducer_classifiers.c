/*
 * The classifier host calls (outfeed/reducers.c): confusion, class_accuracy, precision_recall,
 * top_k and auc against loops written here, on random class counts, rows and step splits; rows
 * out of range are errors that name the tensor, the row and the value and add nothing.
 */
#include "outfeed/reducers.h"
#include "tests/util/numbers.h"
#include "tests/util/reducer_data.h"
#include "tests/util/testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void assert_ratios(const json_t *a, const int64_t *n, const int64_t *d, int64_t k,
                          const char *what)
{
    for (int64_t c = 0; c < k; c++) {
        json_t *v = json_array_get(a, (size_t)c);
        if (d[c] == 0)
            RASSERT(json_is_null(v), "%s[%lld]: expected null (no rows)", what, (long long)c);
        else
            RASSERT(tu_json_num(v, NULL) == (double)n[c] / (double)d[c], "%s[%lld]", what,
                    (long long)c);
    }
}

START_TEST(classifier_counts_match_loops)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t k = rand_between(&rng, 1, 12), rows = rand_between(&rng, 0, 500);
    tu_vals p, y;
    tu_classes_random(&p, &y, &rng, k, rows);
    int64_t *m = calloc((size_t)(k * k), sizeof(int64_t)), *diag = calloc((size_t)k, 8),
            *actual = calloc((size_t)k, 8), *predicted = calloc((size_t)k, 8);
    for (int64_t i = 0; i < rows; i++) {
        m[TU_I(&y)[i] * k + TU_I(&p)[i]]++;
        actual[TU_I(&y)[i]]++;
        predicted[TU_I(&p)[i]]++;
        diag[TU_I(&y)[i]] += TU_I(&y)[i] == TU_I(&p)[i];
    }
    char spec[64];
    snprintf(spec, sizeof spec, "confusion:classes=%lld", (long long)k);
    /* the class count from the spec or from the program */
    json_t *c = _i % 2 ? tu_reduce(spec, 0, &p, &y, &rng) : tu_reduce("confusion", k, &p, &y, &rng);
    ck_assert_int_eq((int64_t)json_array_size(c), k);
    for (int64_t i = 0; i < k; i++)
        tu_assert_int_array(json_array_get(c, (size_t)i), m + i * k, k, "confusion row");
    json_t *a = tu_reduce("class_accuracy", k, &p, &y, &rng);
    assert_ratios(json_object_get(a, "accuracy"), diag, actual, k, "accuracy");
    tu_assert_int_array(json_object_get(a, "correct"), diag, k, "correct");
    tu_assert_int_array(json_object_get(a, "count"), actual, k, "count");
    json_t *pr = tu_reduce("precision_recall", k, &p, &y, &rng);
    assert_ratios(json_object_get(pr, "precision"), diag, predicted, k, "precision");
    assert_ratios(json_object_get(pr, "recall"), diag, actual, k, "recall");
    tu_assert_int_array(json_object_get(pr, "predicted"), predicted, k, "predicted");
    json_decref(c), json_decref(a), json_decref(pr);
    free(m), free(diag), free(actual), free(predicted), free(p.data), free(y.data);
}
END_TEST

START_TEST(top_k_ranks_with_ties)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t c = rand_between(&rng, 1, 12), k = rand_between(&rng, 1, c),
            rows = rand_between(&rng, 0, 400), hits = 0;
    int64_t dims[2] = {rows, c};
    tu_vals s, y;
    tu_vals_init(&s, IFD_F32, 2, dims);
    tu_vals_init(&y, IFD_I32, 1, dims);
    for (int64_t i = 0; i < rows * c; i++) /* few distinct scores: many ties, some NaN */
        TU_F(&s)[i] = ifd_rng_below(&rng, 50) == 0 ? NAN : (float)ifd_rng_below(&rng, 4);
    for (int64_t i = 0; i < rows; i++) {
        TU_I(&y)[i] = (int32_t)ifd_rng_below(&rng, (uint64_t)c);
        float mine = TU_F(&s)[i * c + TU_I(&y)[i]];
        int64_t greater = 0;
        for (int64_t j = 0; j < c; j++)
            greater += TU_F(&s)[i * c + j] > mine;
        hits += !isnan(mine) && greater < k;
    }
    char spec[64], key[32];
    snprintf(spec, sizeof spec, "top_k:%lld", (long long)k);
    snprintf(key, sizeof key, "top_%lld", (long long)k);
    ifd_reducer *r = tu_reducer_make(spec, 0);
    ck_assert_str_eq(ifd_reducer_key(r), key);
    ifd_reducer_destroy(r);
    json_t *j = tu_reduce(spec, 0, &s, &y, &rng);
    ck_assert_int_eq(tu_json_int(j, "hits"), hits);
    ck_assert_int_eq(tu_json_int(j, "count"), rows);
    if (rows)
        ck_assert(tu_json_num(j, "accuracy") == (double)hits / (double)rows);
    else
        ck_assert(json_is_null(json_object_get(j, "accuracy")));
    json_decref(j);
    free(s.data), free(y.data);
}
END_TEST

START_TEST(auc_matches_the_tf_definition)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t rows = rand_between(&rng, 1, 600), cols = _i % 2 ? 2 : 1;
    int64_t n = _i % 3 == 0 ? 200 : rand_between(&rng, 2, 60);
    int64_t dims[2] = {rows, cols};
    tu_vals s, y;
    tu_vals_init(&s, IFD_F32, cols == 2 ? 2 : 1, dims);
    tu_vals_init(&y, IFD_I32, 1, dims);
    float *score = tu_falloc(rows);
    for (int64_t i = 0; i < rows; i++) {
        TU_I(&y)[i] = (int32_t)ifd_rng_below(&rng, 2);
        const float special[] = {0.0f, 1.0f, 0.5f};
        score[i] = ifd_rng_below(&rng, 10) == 0
                       ? special[ifd_rng_below(&rng, 3)]
                       : (float)fmin(1, fmax(0, tu_urand(&rng, -0.2, 0.8) + 0.4 * TU_I(&y)[i]));
        TU_F(&s)[i * cols + cols - 1] = score[i];
        if (cols == 2)
            TU_F(&s)[i * 2] = 1.0f - score[i];
    }
    float *thr = tu_falloc(n);
    int64_t *tp = calloc((size_t)n, 8), *fp = calloc((size_t)n, 8), npos = 0, nneg = 0;
    thr[0] = (float)(0.0 - 1e-7);
    thr[n - 1] = (float)(1.0 + 1e-7);
    for (int64_t i = 1; i < n - 1; i++)
        thr[i] = (float)((double)i / (double)(n - 1));
    for (int64_t i = 0; i < rows; i++) {
        npos += TU_I(&y)[i], nneg += !TU_I(&y)[i];
        for (int64_t t = 0; t < n; t++)
            if (score[i] > thr[t])
                (TU_I(&y)[i] ? tp : fp)[t]++;
    }
    double auc = 0;
    for (int64_t t = 0; t + 1 < n; t++) {
        double x0 = fp[t] / (nneg + 1e-6), x1 = fp[t + 1] / (nneg + 1e-6);
        double y0 = (tp[t] + 1e-6) / (npos + 1e-6), y1 = (tp[t + 1] + 1e-6) / (npos + 1e-6);
        auc += (x0 - x1) * (y0 + y1) / 2;
    }
    char spec[64];
    snprintf(spec, sizeof spec, "auc:thresholds=%lld", (long long)n);
    json_t *j = tu_reduce(n == 200 ? "auc" : spec, 0, &s, &y, &rng);
    tu_assert_int_array(json_object_get(j, "tp"), tp, n, "tp");
    tu_assert_int_array(json_object_get(j, "fp"), fp, n, "fp");
    ck_assert_int_eq(tu_json_int(j, "positives"), npos);
    ck_assert_int_eq(tu_json_int(j, "negatives"), nneg);
    tu_assert_close(tu_json_num(j, "auc"), auc, 1e-12, "auc");
    json_decref(j);
    free(score), free(thr), free(tp), free(fp), free(s.data), free(y.data);
}
END_TEST

/* A failing add names the tensor, the row and the value, and adds nothing of the step. */
static void add_fails(const char *spec, const tu_vals *v, const tu_vals *label, int code,
                      const char *const *words)
{
    ifd_reducer *r = tu_reducer_make(spec, 4);
    ifd_tensor head;
    ifd_error err = {0};
    ck_assert_int_eq(ifd_tensor_rows(&v->t, 0, 1, &head), IFD_OK);
    ifd_tensor lhead;
    if (label)
        ck_assert_int_eq(ifd_tensor_rows(&label->t, 0, 1, &lhead), IFD_OK);
    RC_OK(ifd_reducer_add(r, &head, label ? &lhead : NULL, &err), err);
    json_t *before = ifd_reducer_value(r);
    int rc = ifd_reducer_add(r, &v->t, label ? &label->t : NULL, &err);
    RASSERT(rc == code, "%s: %s, expected %s", spec, ifd_errname(rc), ifd_errname(code));
    for (int i = 0; words[i]; i++)
        RASSERT(strstr(err.msg, words[i]), "%s: '%s' lacks '%s'", spec, err.msg, words[i]);
    json_t *after = ifd_reducer_value(r);
    RASSERT(json_equal(before, after), "%s: a failed add changed the value", spec);
    json_decref(before), json_decref(after);
    ifd_reducer_destroy(r);
}

START_TEST(out_of_range_rows_are_errors)
{
    int64_t dims[2] = {6, 3};
    tu_vals p, y, s, s3;
    tu_vals_init(&p, IFD_I32, 1, dims);
    tu_vals_init(&y, IFD_I32, 1, dims);
    tu_vals_init(&s, IFD_F32, 1, dims);
    tu_vals_init(&s3, IFD_F32, 2, dims);
    for (int i = 0; i < 6; i++)
        TU_I(&p)[i] = TU_I(&y)[i] = i % 2, TU_F(&s)[i] = 0.25f;
    for (int i = 0; i < 18; i++)
        TU_F(&s3)[i] = 0.5f;
    TU_I(&y)[4] = 7;
    add_fails("confusion", &p, &y, IFD_ERANGE,
              (const char *const[]){"tensor 'label'", "row 4", "label 7", "[0, 4)", NULL});
    add_fails("class_accuracy", &p, &y, IFD_ERANGE,
              (const char *const[]){"'class_accuracy'", "row 4", "label 7", NULL});
    add_fails("top_k:1", &s3, &y, IFD_ERANGE,
              (const char *const[]){"'top_k:1'", "row 4", "label 7", "[0, 3)", NULL});
    add_fails("auc", &s, &y, IFD_ERANGE,
              (const char *const[]){"tensor 'x'", "row 4", "label 7", "0 or 1", NULL});
    TU_I(&y)[4] = 0;
    TU_I(&p)[3] = -2;
    add_fails("precision_recall", &p, &y, IFD_ERANGE,
              (const char *const[]){"predicted class -2", "tensor 'x'", "row 3", NULL});
    TU_F(&s)[5] = 1.5f;
    add_fails("auc", &s, &y, IFD_ERANGE,
              (const char *const[]){"row 5", "score 1.5", "[0, 1]", NULL});
    TU_F(&s)[5] = NAN;
    add_fails("auc", &s, &y, IFD_ERANGE, (const char *const[]){"row 5", "score nan", NULL});
    /* the label's rows must be the step's */
    ifd_tensor short_y;
    ck_assert_int_eq(ifd_tensor_rows(&y.t, 0, 5, &short_y), IFD_OK);
    ifd_reducer *r = tu_reducer_make("confusion", 4);
    ifd_error err;
    ck_assert_int_eq(ifd_reducer_add(r, &p.t, &short_y, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "expected 6 rows") && strstr(err.msg, "got 5"), "%s", err.msg);
    ck_assert_int_eq(ifd_reducer_add(r, &p.t, NULL, &err), IFD_ESHAPE);
    ifd_reducer_destroy(r);
    /* a dtype that changes between steps */
    r = tu_reducer_make("sum", 0);
    RC_OK(ifd_reducer_add(r, &s.t, NULL, &err), err);
    ck_assert_int_eq(ifd_reducer_add(r, &p.t, NULL, &err), IFD_EDTYPE);
    ck_assert_msg(strstr(err.msg, "expected float32, as in the earlier steps, got int32"), "%s",
                  err.msg);
    ifd_reducer_destroy(r);
    free(p.data), free(y.data), free(s.data), free(s3.data);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reducer_classifiers");
    TCase *tc = tu_tcase(s, "classifiers", 60);
    tcase_add_loop_test(tc, classifier_counts_match_loops, 0, 10);
    tcase_add_loop_test(tc, top_k_ranks_with_ties, 0, 10);
    tcase_add_loop_test(tc, auc_matches_the_tf_definition, 0, 9);
    tcase_add_test(tc, out_of_range_rows_are_errors);
    return tu_run_suite(s);
}
