/*
 * The built-in host calls (outfeed/reducers.c) against straightforward double-precision
 * references written here (loops for the statistics and histograms, sorting for quantiles), on
 * random shapes and data added in random step splits; integer counts that do not depend on the
 * split or the row order; reset; the specs, checks and their errors. The classifier metrics are
 * test_reducer_classifiers.c; the exact comparison with numpy is
 * tests/e2e/test_reducers_numpy.py.
 */
#include "outfeed/reducers.h"
#include "tests/util/numbers.h"
#include "tests/util/reducer_data.h"
#include "tests/util/testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

START_TEST(statistics_match_the_reference)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_dtype dt = _i % 2 ? IFD_I32 : IFD_F32;
    tu_vals v;
    tu_vals_random(&v, &rng, dt, 400, 0);
    int64_t n = ifd_tensor_numel(&v.t);
    double sum = 0, mn = INFINITY, mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        sum += tu_vals_at(&v, i);
        mn = fmin(mn, tu_vals_at(&v, i));
        mx = fmax(mx, tu_vals_at(&v, i));
    }
    json_t *mean = tu_reduce("mean", 0, &v, NULL, &rng), *s = tu_reduce("sum", 0, &v, NULL, &rng),
           *lo = tu_reduce("min", 0, &v, NULL, &rng), *hi = tu_reduce("max", 0, &v, NULL, &rng),
           *last = tu_reduce("last", 0, &v, NULL, &rng);
    if (n == 0) {
        ck_assert(json_is_null(mean) && json_is_null(lo) && json_is_null(hi) && json_is_null(last));
        ck_assert(tu_json_num(s, NULL) == 0);
    } else if (dt == IFD_I32) {
        RASSERT(tu_json_int(s, NULL) == (int64_t)sum, "int32 sum %lld, want %.0f",
                (long long)tu_json_int(s, NULL), sum);
        tu_assert_close(tu_json_num(mean, NULL), sum / (double)n, 1e-15, "mean");
        ck_assert(tu_json_int(lo, NULL) == (int64_t)mn && tu_json_int(hi, NULL) == (int64_t)mx);
        ck_assert(tu_json_int(last, NULL) == TU_I(&v)[n - 1]);
    } else {
        tu_assert_close(tu_json_num(s, NULL), sum, 1e-12, "sum");
        tu_assert_close(tu_json_num(mean, NULL), sum / (double)n, 1e-12, "mean");
        ck_assert(tu_json_num(lo, NULL) == mn && tu_json_num(hi, NULL) == mx);
        ck_assert(tu_json_num(last, NULL) == TU_F(&v)[n - 1]);
    }
    json_decref(mean), json_decref(s), json_decref(lo), json_decref(hi), json_decref(last);
    free(v.data);
}
END_TEST

START_TEST(non_finite_values)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t dims[1] = {4};
    tu_vals v;
    tu_vals_init(&v, IFD_F32, 1, dims);
    float x[4] = {1.0f, NAN, 2.0f, -3.0f};
    memcpy(v.data, x, sizeof x);
    const char *null_specs[] = {"mean", "sum", "min", "max"};
    for (int i = 0; i < 4; i++) {
        json_t *j = tu_reduce(null_specs[i], 0, &v, NULL, &rng);
        RASSERT(json_is_null(j), "%s over a NaN: expected null", null_specs[i]);
        json_decref(j);
    }
    TU_F(&v)[1] = INFINITY;
    json_t *j = tu_reduce("min", 0, &v, NULL, &rng);
    ck_assert(tu_json_num(j, NULL) == -3.0);
    json_decref(j);
    j = tu_reduce("max", 0, &v, NULL, &rng);
    ck_assert(json_is_null(j)); /* +inf */
    json_decref(j);
    j = tu_reduce("histogram", 0, &v, NULL, &rng);
    ck_assert_int_eq(tu_json_int(j, "num"), 3);
    ck_assert_int_eq(tu_json_int(j, "nonfinite"), 1);
    ck_assert(tu_json_num(j, "sum") == 0.0 && tu_json_num(j, "max") == 2.0);
    json_decref(j);
    j = tu_reduce("quantiles:q=1", 0, &v, NULL, &rng);
    ck_assert_int_eq(tu_json_int(j, "count"), 3);
    ck_assert(tu_json_num(json_array_get(json_object_get(j, "value"), 0), NULL) == 2.0);
    json_decref(j);
    /* last: a step without rows leaves the last element of the one before */
    ifd_reducer *r = tu_reducer_make("last", 0);
    ifd_tensor none;
    ifd_error err;
    ck_assert_int_eq(ifd_tensor_rows(&v.t, 4, 4, &none), IFD_OK);
    RC_OK(ifd_reducer_add(r, &v.t, NULL, &err), err);
    RC_OK(ifd_reducer_add(r, &none, NULL, &err), err);
    j = ifd_reducer_value(r);
    ck_assert(tu_json_num(j, NULL) == -3.0);
    json_decref(j);
    ifd_reducer_destroy(r);
    free(v.data);
}
END_TEST

/* TensorFlow's default bucket limits, built as histogram.cc builds them. */
static int64_t tf_limits(double *out)
{
    double pos[1000];
    int64_t n = 0;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1)
        pos[n++] = v;
    pos[n++] = DBL_MAX;
    int64_t k = 0;
    for (int64_t i = n - 1; i >= 0; i--)
        out[k++] = -pos[i];
    out[k++] = 0.0;
    for (int64_t i = 0; i < n; i++)
        out[k++] = pos[i];
    return k;
}

START_TEST(histogram_default_buckets_match_the_reference)
{
    ifd_rng rng;
    seed_rng(&rng);
    tu_vals v;
    ifd_dtype dt = _i % 2 ? IFD_I32 : IFD_F32;
    static double limits[2000];
    static int64_t counts[2000];
    int64_t nl = tf_limits(limits);
    if (_i < 8) {
        tu_vals_random(&v, &rng, dt, 300, 1);
    } else { /* every bucket's edges: each finite limit and its neighbours in the dtype */
        int64_t dims[1] = {3 * (nl - 2)};
        tu_vals_init(&v, dt, 1, dims);
        for (int64_t i = 1; i < nl - 1; i++) {
            float f = (float)limits[i];
            int32_t k = (int32_t)fmin(fmax(round(limits[i]), -2e9), 2e9);
            float *fx = TU_F(&v) + 3 * (i - 1);
            int32_t *ix = TU_I(&v) + 3 * (i - 1);
            for (int d = 0; d < 3; d++) {
                float near = d == 0 ? f : nextafterf(f, d == 1 ? -INFINITY : INFINITY);
                if (dt == IFD_F32)
                    fx[d] = near;
                else
                    ix[d] = k + d - 1;
            }
        }
    }
    int64_t n = ifd_tensor_numel(&v.t), num = 0;
    memset(counts, 0, sizeof counts);
    double mn = INFINITY, mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = tu_vals_at(&v, i);
        if (!isfinite(x))
            continue;
        int64_t b = 0;
        while (!(x < limits[b])) /* the first limit above x */
            b++;
        counts[b]++, num++, sum += x, mn = fmin(mn, x), mx = fmax(mx, x);
    }
    json_t *j = tu_reduce("histogram", 0, &v, NULL, &rng);
    /* the runs of empty buckets collapsed into their last limit */
    double want_l[2000];
    int64_t want_c[2000], m = 0;
    for (int64_t i = 0; i < nl; i++) {
        if (counts[i] == 0 && m > 0 && want_c[m - 1] == 0 && i > 0 && counts[i - 1] == 0) {
            want_l[m - 1] = limits[i];
            continue;
        }
        want_l[m] = limits[i];
        want_c[m++] = counts[i];
    }
    tu_assert_int_array(json_object_get(j, "bucket"), want_c, m, "bucket");
    for (int64_t i = 0; i < m; i++)
        ck_assert(tu_json_num(json_array_get(json_object_get(j, "bucket_limit"), (size_t)i),
                              NULL) == want_l[i]);
    ck_assert_int_eq(tu_json_int(j, "num"), num);
    ck_assert_int_eq(tu_json_int(j, "nonfinite"), n - num);
    if (num > 0) {
        ck_assert(tu_json_num(j, "min") == mn && tu_json_num(j, "max") == mx);
        tu_assert_close(tu_json_num(j, "sum"), sum, 1e-12, "sum");
    }
    json_decref(j);
    free(v.data);
}
END_TEST

START_TEST(histogram_fixed_bins_match_the_reference)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_dtype dt = _i % 2 ? IFD_I32 : IFD_F32;
    int64_t bins = rand_between(&rng, 1, 40);
    double lo = (double)rand_between(&rng, -8, 2) / 4, hi = lo + (double)bins / 8;
    if (_i % 3 == 2) /* edges that are not exact in float32 */
        lo -= 0.1, hi += 0.3;
    double *e = tu_xmalloc(sizeof(double) * (size_t)(bins + 1));
    for (int64_t i = 0; i <= bins; i++) {
        volatile double y = (double)i * ((hi - lo) / (double)bins);
        e[i] = i == bins ? hi : y + lo;
        if (dt == IFD_F32)
            e[i] = (float)e[i];
    }
    int64_t dims[1] = {rand_between(&rng, 0, 300) + bins + 1};
    tu_vals v;
    tu_vals_init(&v, dt, 1, dims);
    for (int64_t i = 0; i < dims[0]; i++) {
        double x = i <= bins ? e[i] : tu_urand(&rng, lo - 1, hi + 1); /* every edge, then any */
        if (dt == IFD_F32)
            TU_F(&v)[i] = (float)x;
        else
            TU_I(&v)[i] = (int32_t)floor(tu_urand(&rng, lo - 3, hi + 3));
    }
    int64_t *want = calloc((size_t)bins, sizeof(int64_t)), below = 0, above = 0;
    for (int64_t i = 0; i < dims[0]; i++) {
        double x = tu_vals_at(&v, i);
        if (x < e[0])
            below++;
        else if (x > e[bins])
            above++;
        else
            for (int64_t b = 0; b < bins; b++)
                if (e[b] <= x && (x < e[b + 1] || (b == bins - 1 && x <= e[bins]))) {
                    want[b]++;
                    break;
                }
    }
    char spec[128];
    snprintf(spec, sizeof spec, "histogram:bins=%lld,range=%.17g:%.17g", (long long)bins, lo, hi);
    json_t *j = tu_reduce(spec, 0, &v, NULL, &rng);
    tu_assert_int_array(json_object_get(j, "bucket"), want, bins, "bucket");
    for (int64_t b = 0; b < bins; b++)
        ck_assert(tu_json_num(json_array_get(json_object_get(j, "bucket_limit"), (size_t)b),
                              NULL) == e[b + 1]);
    ck_assert(tu_json_num(json_array_get(json_object_get(j, "range"), 0), NULL) == e[0]);
    ck_assert_int_eq(tu_json_int(j, "below"), below);
    ck_assert_int_eq(tu_json_int(j, "above"), above);
    ck_assert_int_eq(tu_json_int(j, "num"), dims[0]);
    json_decref(j);
    free(want);
    free(e);
    free(v.data);
}
END_TEST

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

START_TEST(quantiles_match_sorting)
{
    ifd_rng rng;
    seed_rng(&rng);
    tu_vals v;
    tu_vals_random(&v, &rng, _i % 2 ? IFD_I32 : IFD_F32, 300, 1);
    int nq = (int)rand_between(&rng, 1, 6);
    double q[8];
    char spec[256] = "quantiles:q=";
    for (int i = 0; i < nq; i++) {
        q[i] = i == 0 ? 1.0 : floor(ifd_rng_uniform(&rng) * 1000) / 1000;
        snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%.17g", i ? "/" : "", q[i]);
    }
    int64_t n = ifd_tensor_numel(&v.t), m = 0;
    double *x = tu_xmalloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++)
        if (isfinite(tu_vals_at(&v, i)))
            x[m++] = tu_vals_at(&v, i);
    qsort(x, (size_t)m, sizeof(double), cmp_d);
    json_t *j = tu_reduce(spec, 0, &v, NULL, &rng);
    ck_assert_int_eq(tu_json_int(j, "count"), m);
    ck_assert(json_is_false(json_object_get(j, "sampled")));
    for (int i = 0; i < nq; i++) {
        json_t *got = json_array_get(json_object_get(j, "value"), (size_t)i);
        ck_assert(tu_json_num(json_array_get(json_object_get(j, "q"), (size_t)i), NULL) == q[i]);
        if (m == 0) {
            ck_assert(json_is_null(got));
            continue;
        }
        double h = (double)(m - 1) * q[i];
        int64_t a = (int64_t)floor(h), b = a + 1 < m ? a + 1 : a;
        double want = x[a] + (x[b] - x[a]) * (h - (double)a);
        /* numpy takes b - a in float32 for float32 values (one float32 rounding of it), and
         * b - (b - a)(1 - t) for t >= 0.5 (a double rounding apart) */
        double tol = 1.2e-7 * fabs(x[b] - x[a]) + 4.5e-16 * fmax(fabs(x[a]), fabs(x[b]));
        RASSERT(fabs(tu_json_num(got, NULL) - want) <= tol, "q %g: got %.17g, want %.17g", q[i],
                tu_json_num(got, NULL), want);
    }
    json_decref(j);
    free(x);
    free(v.data);
}
END_TEST

START_TEST(quantiles_past_max_keep_a_sample)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t dims[1] = {rand_between(&rng, 2000, 6000)};
    tu_vals v;
    tu_vals_init(&v, IFD_F32, 1, dims);
    for (int64_t i = 0; i < dims[0]; i++)
        TU_F(&v)[i] = (float)tu_urand(&rng, 0, 1);
    json_t *a = tu_reduce("quantiles:max=500", 0, &v, NULL, &rng),
           *b = tu_reduce("quantiles:max=500", 0, &v, NULL, &rng); /* other steps, same order */
    ck_assert(json_equal(a, b));
    ck_assert(json_is_true(json_object_get(a, "sampled")));
    ck_assert_int_eq(tu_json_int(a, "count"), dims[0]);
    ck_assert_int_eq(tu_json_int(a, "kept"), 500);
    json_t *vals_ = json_object_get(a, "value");
    for (int i = 0; i < 5; i++) { /* a uniform sample of uniform values: near 0, .25, .5, ... */
        double got = tu_json_num(json_array_get(vals_, (size_t)i), NULL);
        RASSERT(fabs(got - 0.25 * i) < 0.1, "quantile %g of the sample: %g", 0.25 * i, got);
    }
    /* after a reset, fewer values than max: every one kept, exact again */
    ifd_reducer *r = tu_reducer_make("quantiles:max=500,q=0.5", 0);
    tu_reducer_add_chunks(r, &v, NULL, &rng);
    ifd_reducer_reset(r);
    ifd_tensor three;
    ck_assert_int_eq(ifd_tensor_rows(&v.t, 0, 3, &three), IFD_OK);
    ifd_error err;
    RC_OK(ifd_reducer_add(r, &three, NULL, &err), err);
    json_t *c = ifd_reducer_value(r);
    double s[3] = {TU_F(&v)[0], TU_F(&v)[1], TU_F(&v)[2]};
    qsort(s, 3, sizeof(double), cmp_d);
    ck_assert(json_is_false(json_object_get(c, "sampled")));
    ck_assert(tu_json_num(json_array_get(json_object_get(c, "value"), 0), NULL) == s[1]);
    json_decref(a), json_decref(b), json_decref(c);
    ifd_reducer_destroy(r);
    free(v.data);
}
END_TEST

static void drop_sums(json_t *a, json_t *b)
{
    const char *keys[] = {"sum", "sum_squares"};
    for (int i = 0; i < 2 && json_is_object(a); i++) {
        json_t *x = json_object_get(a, keys[i]), *y = json_object_get(b, keys[i]);
        if (x == NULL)
            continue;
        tu_assert_close(tu_json_num(x, NULL), tu_json_num(y, NULL), 1e-6, keys[i]);
        json_object_del(a, keys[i]);
        json_object_del(b, keys[i]);
    }
}

START_TEST(counts_do_not_depend_on_the_split_or_the_order)
{
    const char *specs[] = {"histogram",
                           "histogram:bins=13,range=-1.5:2",
                           "confusion:classes=5",
                           "class_accuracy:classes=5",
                           "precision_recall:classes=5",
                           "top_k:2",
                           "auc",
                           "auc:thresholds=7",
                           "quantiles",
                           "min",
                           "max"};
    ifd_rng rng;
    seed_rng(&rng);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        tu_vals v, l, pv, pl;
        tu_reducer_data(specs[s], &rng, rand_between(&rng, 1, 700), &v, &l);
        tu_vals_permute(&v, l.data ? &l : NULL, &pv, &pl, &rng);
        json_t *a = tu_reduce(specs[s], 0, &v, l.data ? &l : NULL, &rng);
        json_t *b = tu_reduce(specs[s], 0, &pv, l.data ? &pl : NULL, &rng);
        drop_sums(a, b);
        char *da = json_dumps(a, JSON_SORT_KEYS | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17)),
             *db = json_dumps(b, JSON_SORT_KEYS | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
        RASSERT(strcmp(da, db) == 0, "%s: in order %s, permuted and split otherwise %s", specs[s],
                da, db);
        free(da), free(db), json_decref(a), json_decref(b);
        free(v.data), free(pv.data);
        if (l.data)
            free(l.data), free(pl.data);
    }
}
END_TEST

START_TEST(bad_specs_are_named)
{
    static const struct {
        const char *spec;
        const char *words;
    } bad[] = {
        {"median", "unknown host call 'median': expected mean, sum, min, max, last, histogram"},
        {"", "unknown host call ''"},
        {"mean:x=1", "mean takes no parameters, got 'x=1'"},
        {"sum:", "sum takes no parameters"},
        {"auc:", "nothing after ':': auc takes label=NAME and thresholds=N"},
        {"histogram:bins=10", "bins= needs range=LO:HI too"},
        {"histogram:range=0:1", "range= needs bins=N too"},
        {"histogram:bins=0,range=0:1", "bins= expected a whole number from 1 to 65536, got '0'"},
        {"histogram:bins=1e3,range=0:1", "got '1e3'"},
        {"histogram:bins=10,range=1:0", "two finite numbers with LO < HI, got '1:0'"},
        {"histogram:bins=10,range=0:nan", "got '0:nan'"},
        {"histogram:bins=10,range=0", "got '0'"},
        {"histogram:bins=3,range=0:1,bins=3", "bins= given twice"},
        {"histogram:bins=4,range=1:1.0000000000000002", "too narrow for 4 bins"},
        {"quantiles:q=1.5", "q= expected 1 to 64 numbers in [0, 1] separated by '/', got '1.5'"},
        {"quantiles:q=", "got ''"},
        {"quantiles:q=0.5/", "got '0.5/'"},
        {"quantiles:max=0", "max= expected a whole number from 1"},
        {"quantiles:median",
         "expected NAME=VALUE parameters (quantiles takes q=A/B/... and max=N)"},
        {"confusion", "the class count is unknown"},
        {"confusion:classes=2000", "classes= expected a whole number from 1 to 1024, got '2000'"},
        {"confusion:classes=3,,label=y", "expected NAME=VALUE parameters"},
        {"class_accuracy:label=", "label= expected a tensor name"},
        {"top_k", "top_k needs K, as in top_k:5"},
        {"top_k:0", "K expected a whole number from 1"},
        {"top_k:3,4", "expected NAME=VALUE"},
        {"auc:thresholds=1", "thresholds= expected a whole number from 2 to 65536, got '1'"},
        {"auc:curve=PR", "unknown parameter 'curve': auc takes label=NAME and thresholds=N"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ifd_reducer *r = (ifd_reducer *)1;
        ifd_error err = {0};
        int rc = ifd_reducer_create(&r, "conf", bad[i].spec, 0, &err);
        RASSERT(rc == IFD_EINVAL && r == NULL, "'%s': %s", bad[i].spec, ifd_errname(rc));
        char head[128];
        snprintf(head, sizeof head, "host_calls: tensor 'conf', '%s': ", bad[i].spec);
        RASSERT(strncmp(err.msg, head, strlen(head)) == 0 && strstr(err.msg, bad[i].words),
                "'%s': got '%s', expected '%s...%s'", bad[i].spec, err.msg, head, bad[i].words);
        ck_assert_str_eq(err.key, "host_calls");
    }
}
END_TEST

START_TEST(good_specs_key_and_label)
{
    static const struct {
        const char *spec, *key, *needs;
    } good[] = {
        {"mean", "mean", NULL},
        {"last", "last", NULL},
        {"histogram", "histogram", NULL},
        {"histogram:range=-1e3:2.5,bins=7", "histogram", NULL},
        {"quantiles:q=0.1/0.9,max=100", "quantiles", NULL},
        {"confusion", "confusion", "label"},
        {"class_accuracy:label=truth,classes=3", "class_accuracy", "truth"},
        {"precision_recall", "precision_recall", "label"},
        {"top_k:5", "top_5", "label"},
        {"top_k:k=3,label=y", "top_3", "y"},
        {"auc:thresholds=50,label=y", "auc", "y"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ifd_reducer *r = tu_reducer_make(good[i].spec, 10);
        ck_assert_str_eq(ifd_reducer_key(r), good[i].key);
        ck_assert_str_eq(ifd_reducer_spec(r), good[i].spec);
        ck_assert_str_eq(ifd_reducer_tensor(r), "x");
        if (good[i].needs)
            ck_assert_str_eq(ifd_reducer_needs(r), good[i].needs);
        else
            ck_assert_ptr_null(ifd_reducer_needs(r));
        ifd_reducer_destroy(r);
    }
    ifd_reducer_destroy(NULL);
    /* the program's class count, when the spec gives none: bounded as classes= is */
    ifd_reducer *r;
    ifd_error err = {0};
    ck_assert_int_eq(ifd_reducer_create(&r, "x", "confusion", 2000, &err), IFD_EINVAL);
    ck_assert_msg(
        strstr(err.msg, "the program has 2000 classes; this host call keeps at most 1024"), "%s",
        err.msg);
    r = tu_reducer_make("class_accuracy", 2000);
    ifd_reducer_destroy(r);
}
END_TEST

START_TEST(checks_name_what_was_expected_and_what_came)
{
    static const struct {
        const char *spec;
        ifd_dtype dt;
        int rank;
        int64_t dim;
        ifd_dtype ldt;
        int lrank; /* -1: no label tensor; 0: [rows]; 1: [rows, 1]; 2: [rows, 2] */
        int code;
        const char *words;
    } cases[] = {
        {"mean", IFD_U8, 0, 0, 0, -1, IFD_EDTYPE, "expected float32 or int32, got uint8 [rows]"},
        {"histogram", IFD_I64, 1, 4, 0, -1, IFD_EDTYPE, "got int64 [rows, 4]"},
        {"confusion", IFD_F32, 0, 0, IFD_I32, 0, IFD_EDTYPE,
         "expected int32 predicted classes [rows] or [rows, 1], got float32 [rows]"},
        {"confusion", IFD_I32, 1, 10, IFD_I32, 0, IFD_ESHAPE, "got int32 [rows, 10]"},
        {"class_accuracy", IFD_I32, 1, 1, IFD_F32, 0, IFD_EDTYPE,
         "label tensor 'label': expected int32 [rows] or [rows, 1] (a class a row), got float32"},
        {"precision_recall", IFD_I32, 0, 0, IFD_I32, 2, IFD_ESHAPE, "label tensor 'label'"},
        {"confusion", IFD_I32, 0, 0, 0, -1, IFD_EINVAL, "the program declares no such outfeed"},
        {"top_k:5", IFD_F32, 1, 3, IFD_I32, 0, IFD_ESHAPE,
         "expected float32 scores [rows, C] with C >= 5, got float32 [rows, 3]"},
        {"top_k:5", IFD_F32, 0, 0, IFD_I32, 0, IFD_ESHAPE, "got float32 [rows]"},
        {"top_k:1", IFD_I32, 1, 3, IFD_I32, 0, IFD_EDTYPE, "got int32 [rows, 3]"},
        {"auc", IFD_F32, 1, 3, IFD_I32, 0, IFD_ESHAPE, "[rows, 2] (two classes: column 1"},
        {"auc", IFD_I32, 0, 0, IFD_I32, 0, IFD_EDTYPE, "got int32 [rows]"},
        {"histogram:bins=4,range=1:1.00000001", IFD_F32, 0, 0, 0, -1, IFD_EINVAL,
         "the edges rounded to float32 are not increasing"},
        {"histogram:bins=4,range=1:1.00000001", IFD_I32, 0, 0, 0, -1, IFD_OK, ""},
        {"histogram:bins=4,range=0:1e39", IFD_F32, 0, 0, 0, -1, IFD_EINVAL,
         "out of float32's range"},
        {"top_k:3", IFD_F32, 1, 3, IFD_I32, 1, IFD_OK, ""},
        {"auc", IFD_F32, 1, 2, IFD_I32, 0, IFD_OK, ""},
        {"mean", IFD_I32, 2, 5, 0, -1, IFD_OK, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ifd_reducer *r = tu_reducer_make(cases[i].spec, 4);
        ifd_shape row = {.rank = cases[i].rank, .dims = {cases[i].dim, cases[i].dim}};
        ifd_shape lrow = {.rank = cases[i].lrank > 0, .dims = {cases[i].lrank}};
        ifd_error err = {0};
        int rc = ifd_reducer_check(r, cases[i].dt, &row, cases[i].ldt,
                                   cases[i].lrank < 0 ? NULL : &lrow, &err);
        RASSERT(rc == cases[i].code, "case %zu '%s': %s, expected %s", i, cases[i].spec,
                ifd_errname(rc), ifd_errname(cases[i].code));
        if (rc != IFD_OK) {
            char head[128];
            snprintf(head, sizeof head, "host_calls: tensor 'x', '%s': ", cases[i].spec);
            RASSERT(strncmp(err.msg, head, strlen(head)) == 0 && strstr(err.msg, cases[i].words),
                    "case %zu: got '%s', expected '%s...%s'", i, err.msg, head, cases[i].words);
        }
        ifd_reducer_destroy(r);
    }
}
END_TEST

START_TEST(reset_forgets_and_empty_windows)
{
    const char *specs[] = {"mean",
                           "sum",
                           "min",
                           "max",
                           "last",
                           "histogram",
                           "histogram:bins=5,range=-1:1",
                           "quantiles",
                           "confusion",
                           "class_accuracy",
                           "precision_recall",
                           "top_k:2",
                           "auc"};
    ifd_rng rng;
    seed_rng(&rng);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        tu_vals a, la, b, lb;
        tu_reducer_data(specs[s], &rng, rand_between(&rng, 1, 200), &a, &la);
        tu_reducer_data(specs[s], &rng, rand_between(&rng, 1, 200), &b, &lb);
        ifd_reducer *r = tu_reducer_make(specs[s], 5), *fresh = tu_reducer_make(specs[s], 5);
        json_t *empty = ifd_reducer_value(r);
        tu_reducer_add_chunks(r, &a, la.data ? &la : NULL, &rng);
        ifd_reducer_reset(r);
        json_t *reset = ifd_reducer_value(r);
        RASSERT(json_equal(empty, reset), "%s: reset is not empty", specs[s]);
        tu_reducer_add_chunks(r, &b, lb.data ? &lb : NULL, &rng);
        tu_reducer_add_chunks(fresh, &b, lb.data ? &lb : NULL, &rng);
        json_t *x = ifd_reducer_value(r), *y = ifd_reducer_value(fresh);
        RASSERT(json_equal(x, y), "%s: after a reset, the value is not the new data's", specs[s]);
        json_decref(empty), json_decref(reset), json_decref(x), json_decref(y);
        ifd_reducer_destroy(r), ifd_reducer_destroy(fresh);
        free(a.data), free(b.data), free(la.data), free(lb.data);
    }
    /* the values of an empty window */
    ifd_reducer *r = tu_reducer_make("histogram", 0);
    json_t *h = ifd_reducer_value(r);
    ck_assert_int_eq(tu_json_int(h, "num"), 0);
    ck_assert(json_is_null(json_object_get(h, "min")));
    ck_assert_int_eq(json_array_size(json_object_get(h, "bucket")), 1);
    ck_assert(tu_json_num(json_array_get(json_object_get(h, "bucket_limit"), 0), NULL) == DBL_MAX);
    json_decref(h);
    ifd_reducer_destroy(r);
    r = tu_reducer_make("auc", 0);
    h = ifd_reducer_value(r);
    ck_assert(json_is_null(json_object_get(h, "auc")));
    json_decref(h);
    ifd_reducer_destroy(r);
    r = tu_reducer_make("class_accuracy", 3);
    h = ifd_reducer_value(r);
    for (int c = 0; c < 3; c++)
        ck_assert(json_is_null(json_array_get(json_object_get(h, "accuracy"), (size_t)c)));
    json_decref(h);
    ifd_reducer_destroy(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reducers");
    TCase *tc = tu_tcase(s, "reducers", 60);
    tcase_add_loop_test(tc, statistics_match_the_reference, 0, 12);
    tcase_add_test(tc, non_finite_values);
    tcase_add_loop_test(tc, histogram_default_buckets_match_the_reference, 0, 10);
    tcase_add_loop_test(tc, histogram_fixed_bins_match_the_reference, 0, 12);
    tcase_add_loop_test(tc, quantiles_match_sorting, 0, 12);
    tcase_add_test(tc, quantiles_past_max_keep_a_sample);
    tcase_add_loop_test(tc, counts_do_not_depend_on_the_split_or_the_order, 0, 4);
    tcase_add_test(tc, bad_specs_are_named);
    tcase_add_test(tc, good_specs_key_and_label);
    tcase_add_test(tc, checks_name_what_was_expected_and_what_came);
    tcase_add_test(tc, reset_forgets_and_empty_windows);
    return tu_run_suite(s);
}
