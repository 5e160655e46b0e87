/*
 * The built-in host calls (outfeed/reducers.h): a reducer's state as the summary's value, the
 * definitions of docs/summaries.md ("Host calls") followed to the bit.
 */
#include "outfeed/reducers_internal.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* ---- value ---- */

/* JSON has no NaN or infinity: such a result is null. */
static json_t *num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* An int32 tensor's value as an integer, a float32 one's as a number. */
static json_t *typed(const ifd_reducer *r, double v)
{
    return r->dtype == IFD_I32 ? json_integer((json_int_t)v) : num(v);
}

/* Sets o[k] = v (stolen); marks *bad when v is NULL or the set fails. */
static void put(json_t *o, const char *k, json_t *v, int *bad)
{
    if (v == NULL || json_object_set_new(o, k, v) != 0)
        *bad = 1;
}

static void push(json_t *a, json_t *v, int *bad)
{
    if (v == NULL || json_array_append_new(a, v) != 0)
        *bad = 1;
}

static json_t *int_array(const int64_t *x, int64_t n, int *bad)
{
    json_t *a = json_array();
    for (int64_t i = 0; a != NULL && i < n; i++)
        push(a, json_integer((json_int_t)x[i]), bad);
    return a;
}

/* n / d, null when d is 0. */
static json_t *ratio(int64_t n, int64_t d)
{
    return d > 0 ? json_real((double)n / (double)d) : json_null();
}

static json_t *histogram_value(const ifd_reducer *r, int *bad)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    put(o, "min", r->n ? json_real(r->min) : json_null(), bad);
    put(o, "max", r->n ? json_real(r->max) : json_null(), bad);
    put(o, "num", json_integer(r->n), bad);
    put(o, "sum", num(r->sum), bad);
    put(o, "sum_squares", num(r->sum_sq), bad);
    put(o, "nonfinite", json_integer(r->nonfinite), bad);
    json_t *limits = json_array(), *counts = json_array();
    if (r->fixed) {
        int f32 = r->dtype != IFD_I32;
        for (int64_t i = 0; limits && counts && i < r->bins; i++) {
            push(limits, json_real(f32 ? (double)r->edges_f[i + 1] : r->limits[i + 1]), bad);
            push(counts, json_integer(r->counts[i]), bad);
        }
        json_t *range = json_array();
        if (range != NULL) {
            push(range, json_real(f32 ? (double)r->edges_f[0] : r->limits[0]), bad);
            push(range, json_real(f32 ? (double)r->edges_f[r->bins] : r->limits[r->bins]), bad);
        }
        put(o, "range", range, bad);
        put(o, "below", json_integer(r->below), bad);
        put(o, "above", json_integer(r->above), bad);
    } else {
        /* TensorFlow's Histogram::EncodeToProto: a run of empty buckets becomes one, with the
         * run's last limit; no bucket at all becomes DBL_MAX, 0 */
        for (int64_t i = 0; limits && counts && i < r->nlimits;) {
            double end = r->limits[i];
            int64_t count = r->counts[i++];
            if (count == 0)
                while (i < r->nlimits && r->counts[i] == 0)
                    end = r->limits[i++];
            push(limits, json_real(end), bad);
            push(counts, json_integer(count), bad);
        }
    }
    put(o, "bucket_limit", limits, bad);
    put(o, "bucket", counts, bad);
    return o;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy.quantile's default method ('linear', q an array of float64): h = (n - 1) q, the sorted
 * values a = x[floor h], b = x[floor h + 1] (both x[n - 1] when h >= n - 1), t = h - floor h;
 * d = b - a in the values' dtype (float32 for float32 values), then a + d t, or b - d (1 - t)
 * when t >= 0.5, in double. */
static double quantile(const double *x, int64_t n, double q, int f32)
{
    double h = (double)(n - 1) * q, prev = floor(h);
    int64_t i = (int64_t)prev, j = i + 1;
    if (h >= (double)(n - 1))
        i = j = n - 1, prev = -1.0;
    double t = h - prev, a = x[i], b = x[j];
    double d = f32 ? (double)((float)b - (float)a) : b - a;
    return t >= 0.5 ? b - d * (1.0 - t) : a + d * t;
}

static json_t *quantiles_value(const ifd_reducer *r, int *bad)
{
    double *sorted = NULL;
    if (r->nvalues > 0) {
        sorted = malloc(sizeof(double) * (size_t)r->nvalues);
        if (sorted == NULL)
            return NULL;
        memcpy(sorted, r->values, sizeof(double) * (size_t)r->nvalues);
        qsort(sorted, (size_t)r->nvalues, sizeof(double), cmp_double);
    }
    json_t *o = json_object(), *qs = json_array(), *vs = json_array();
    for (int i = 0; qs && vs && i < r->nq; i++) {
        push(qs, json_real(r->q[i]), bad);
        double v = r->nvalues ? quantile(sorted, r->nvalues, r->q[i], r->dtype != IFD_I32) : 0;
        push(vs, r->nvalues ? json_real(v) : json_null(), bad);
    }
    free(sorted);
    if (o == NULL) {
        json_decref(qs);
        json_decref(vs);
        return NULL;
    }
    put(o, "q", qs, bad);
    put(o, "value", vs, bad);
    put(o, "count", json_integer(r->seen), bad);
    put(o, "kept", json_integer(r->nvalues), bad);
    put(o, "sampled", json_boolean(r->seen > r->nvalues), bad);
    put(o, "nonfinite", json_integer(r->nonfinite), bad);
    return o;
}

static json_t *classes_value(const ifd_reducer *r, int *bad)
{
    int64_t k = r->classes;
    if (r->kind == K_CONFUSION) {
        json_t *m = json_array();
        for (int64_t i = 0; m && i < k; i++)
            push(m, int_array(r->matrix + i * k, k, bad), bad);
        return m;
    }
    json_t *o = json_object(), *a = json_array(), *b = json_array();
    for (int64_t c = 0; a && b && c < k; c++) {
        if (r->kind == K_CLASS_ACCURACY) {
            push(a, ratio(r->correct[c], r->actual[c]), bad);
        } else {
            push(a, ratio(r->correct[c], r->predicted[c]), bad);
            push(b, ratio(r->correct[c], r->actual[c]), bad);
        }
    }
    if (o == NULL) {
        json_decref(a);
        json_decref(b);
        return NULL;
    }
    if (r->kind == K_CLASS_ACCURACY) {
        put(o, "accuracy", a, bad);
        json_decref(b);
    } else {
        put(o, "precision", a, bad);
        put(o, "recall", b, bad);
        put(o, "predicted", int_array(r->predicted, k, bad), bad);
    }
    put(o, "correct", int_array(r->correct, k, bad), bad);
    put(o, "count", int_array(r->actual, k, bad), bad);
    return o;
}

/* tf.metrics.auc (curve ROC, summation trapezoidal) from the counts at each threshold, in
 * double: recall (tp + 1e-6) / (tp + fn + 1e-6), false positive rate fp / (fp + tn + 1e-6), and
 * the sum over i of (x[i] - x[i+1]) (y[i] + y[i+1]) / 2 in threshold order. */
static json_t *auc_value(const ifd_reducer *r, int *bad)
{
    int64_t n = r->nthr, npos = 0, nneg = 0;
    int64_t *tp = malloc(sizeof(int64_t) * (size_t)n), *fp = malloc(sizeof(int64_t) * (size_t)n);
    json_t *o = json_object();
    if (tp == NULL || fp == NULL || o == NULL) {
        free(tp);
        free(fp);
        json_decref(o);
        return NULL;
    }
    for (int64_t m = 0; m <= n; m++) {
        npos += r->pos[m];
        nneg += r->neg[m];
    }
    /* tp[j]: positives above threshold j, those above more than j thresholds */
    int64_t above_pos = 0, above_neg = 0;
    for (int64_t j = n - 1; j >= 0; j--) {
        above_pos += r->pos[j + 1];
        above_neg += r->neg[j + 1];
        tp[j] = above_pos;
        fp[j] = above_neg;
    }
    const double eps = 1.0e-6;
    double auc = 0.0;
    for (int64_t j = 0; j + 1 < n; j++) {
        double x0 = (double)fp[j] / ((double)nneg + eps);
        double x1 = (double)fp[j + 1] / ((double)nneg + eps);
        double y0 = ((double)tp[j] + eps) / ((double)npos + eps);
        double y1 = ((double)tp[j + 1] + eps) / ((double)npos + eps);
        auc += (x0 - x1) * ((y0 + y1) / 2.0);
    }
    put(o, "auc", npos + nneg > 0 ? num(auc) : json_null(), bad);
    put(o, "thresholds", json_integer(n), bad);
    put(o, "positives", json_integer(npos), bad);
    put(o, "negatives", json_integer(nneg), bad);
    put(o, "tp", int_array(tp, n, bad), bad);
    put(o, "fp", int_array(fp, n, bad), bad);
    free(tp);
    free(fp);
    return o;
}

json_t *ifd_reducer_value(const ifd_reducer *r)
{
    int bad = 0;
    json_t *v;
    switch (r->kind) {
    case K_MEAN:
        if (r->n == 0)
            v = json_null();
        else
            v = num(r->dtype == IFD_I32 ? (double)r->isum / (double)r->n : r->sum / (double)r->n);
        break;
    case K_SUM:
        v = r->dtype == IFD_I32 ? json_integer(r->isum) : num(r->sum);
        break;
    case K_MIN:
        v = r->n == 0 || r->nan ? json_null() : typed(r, r->min);
        break;
    case K_MAX:
        v = r->n == 0 || r->nan ? json_null() : typed(r, r->max);
        break;
    case K_LAST:
        v = r->has_last ? typed(r, r->last) : json_null();
        break;
    case K_HISTOGRAM:
        v = histogram_value(r, &bad);
        break;
    case K_QUANTILES:
        v = quantiles_value(r, &bad);
        break;
    case K_TOP_K:
        v = json_object();
        if (v != NULL) {
            put(v, "accuracy", ratio(r->hits, r->rows), &bad);
            put(v, "hits", json_integer(r->hits), &bad);
            put(v, "count", json_integer(r->rows), &bad);
        }
        break;
    case K_AUC:
        v = auc_value(r, &bad);
        break;
    default:
        v = classes_value(r, &bad);
        break;
    }
    if (bad) {
        json_decref(v);
        return NULL;
    }
    return v;
}
