/*
 * The built-in host calls (outfeed/reducers.h): a step's values added to a reducer's state.
 */
#include "outfeed/reducers_internal.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- add ---- */

static void add_stats(ifd_reducer *r, const ifd_tensor *t, int64_t n)
{
    if (t->dtype == IFD_F32) {
        const float *x = t->data;
        for (int64_t i = 0; i < n; i++) {
            double v = x[i];
            r->sum += v;
            if (isnan(v)) {
                r->nan = 1;
                continue;
            }
            if (v < r->min)
                r->min = v;
            if (v > r->max)
                r->max = v;
        }
        if (n > 0)
            r->last = x[n - 1];
    } else {
        const int32_t *x = t->data;
        for (int64_t i = 0; i < n; i++) {
            r->isum += x[i];
            if (x[i] < r->min)
                r->min = x[i];
            if (x[i] > r->max)
                r->max = x[i];
        }
        if (n > 0)
            r->last = x[n - 1];
    }
    r->n += n;
    r->has_last |= n > 0;
}

static inline double value_at(const ifd_tensor *t, int64_t i)
{
    return t->dtype == IFD_F32 ? (double)((const float *)t->data)[i]
                               : (double)((const int32_t *)t->data)[i];
}

/* How many positive default limits are below a > 0 (or at most a, with le): from a's cell, a
 * cell spans a ratio of at most 1.125 and the limits grow by 1.1, so two steps at most. (No limit
 * is a float32 or an int32, so with these values below and at most agree; le keeps the rule.) */
static int64_t limits_below(const ifd_reducer *r, double a, int le)
{
    const double *p = r->limits + r->npos + 2;
    if (a < 0x1p-41)
        return 0;
    if (a >= 0x1p68)
        return r->npos;
    uint64_t bits;
    memcpy(&bits, &a, sizeof bits);
    int e = (int)((bits >> 52) & 0x7ff) - 1023, m = (int)((bits >> 49) & 7);
    int64_t c = r->cell[(e - CELL_EMIN) * 8 + m];
    while (c < r->npos && (p[c] < a || (le && p[c] == a)))
        c++;
    return c;
}

/* The bucket of TensorFlow's Histogram::Add for a finite v: the first limit above v
 * (std::upper_bound), found from the limits' symmetry: -p[npos..0], 0, p[0..npos]. */
static int64_t default_bucket(const ifd_reducer *r, double v)
{
    if (v < 0)
        return r->npos + 1 - limits_below(r, -v, 0);
    return r->npos + 2 + limits_below(r, v, 1);
}

/* numpy's bin for v: e[i] <= v < e[i + 1], the last bin closed; -1 below e[0], bins above
 * e[bins]. A guess from the bin width (in range, so the cast cannot overflow), then moved to the
 * bin whose edges hold v. */
#define FIXED_BIN(e, v, bins, lo, hi, out)                                                         \
    do {                                                                                           \
        if ((v) < (e)[0] || (v) > (e)[bins]) {                                                     \
            (out) = (v) < (e)[0] ? -1 : (bins);                                                    \
            break;                                                                                 \
        }                                                                                          \
        double g_ = ((double)(v) - (lo)) / ((hi) - (lo)) * (double)(bins);                         \
        int64_t b_ = g_ < 0 ? 0 : g_ > (double)((bins)-1) ? (bins)-1 : (int64_t)g_;                \
        while (b_ > 0 && (v) < (e)[b_])                                                            \
            b_--;                                                                                  \
        while (b_ < (bins)-1 && (v) >= (e)[b_ + 1])                                                \
            b_++;                                                                                  \
        (out) = b_;                                                                                \
    } while (0)

static void add_histogram(ifd_reducer *r, const ifd_tensor *t, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double v = value_at(t, i);
        if (!isfinite(v)) {
            r->nonfinite++;
            continue;
        }
        r->n++;
        r->sum += v;
        r->sum_sq += v * v;
        if (v < r->min)
            r->min = v;
        if (v > r->max)
            r->max = v;
        int64_t b;
        if (!r->fixed) {
            b = default_bucket(r, v);
        } else {
            if (t->dtype == IFD_F32)
                FIXED_BIN(r->edges_f, ((const float *)t->data)[i], r->bins, r->lo, r->hi, b);
            else
                FIXED_BIN(r->limits, v, r->bins, r->lo, r->hi, b);
            if (b < 0 || b == r->bins) {
                *(b < 0 ? &r->below : &r->above) += 1;
                continue;
            }
        }
        r->counts[b]++;
    }
}

static int add_quantiles(ifd_reducer *r, const ifd_tensor *t, int64_t n, ifd_error *err)
{
    int64_t want = r->nvalues + n < r->max_values ? r->nvalues + n : r->max_values;
    if (want > r->cap) {
        int64_t cap = r->cap ? r->cap : 1024;
        while (cap < want)
            cap *= 2;
        if (cap > r->max_values)
            cap = r->max_values;
        double *v = realloc(r->values, sizeof(double) * (size_t)cap);
        if (v == NULL)
            return ifd_reducer_error(err, IFD_ENOMEM, r, "out of memory keeping %lld values",
                                     (long long)cap);
        r->values = v;
        r->cap = cap;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = value_at(t, i);
        if (!isfinite(v)) {
            r->nonfinite++;
            continue;
        }
        r->seen++;
        if (r->nvalues < r->max_values) {
            r->values[r->nvalues++] = v;
        } else {
            /* Algorithm R: the seen-th value replaces a kept one with probability max / seen */
            uint64_t j = ifd_rng_below(&r->rng, (uint64_t)r->seen);
            if (j < (uint64_t)r->max_values)
                r->values[j] = v;
        }
    }
    return IFD_OK;
}

/* Every class of rows [0, rows) of x (int32, one a row) in [0, K); else IFD_ERANGE. */
static int check_classes(const ifd_reducer *r, const char *name, const char *what, const int32_t *x,
                         int64_t rows, int64_t k, ifd_error *err)
{
    for (int64_t i = 0; i < rows; i++)
        if (x[i] < 0 || x[i] >= k)
            return ifd_error_set(err, IFD_ERANGE,
                                 "host call '%s' on tensor '%s': row %lld of the step has %s %d "
                                 "in tensor '%s', expected a class in [0, %lld)",
                                 r->spec, r->tensor, (long long)i, what, x[i], name, (long long)k);
    return IFD_OK;
}

static int add_classes(ifd_reducer *r, const ifd_tensor *t, const ifd_tensor *label, int64_t rows,
                       ifd_error *err)
{
    const int32_t *pred = t->data, *y = label->data;
    int rc = check_classes(r, r->label, "label", y, rows, r->classes, err);
    if (rc == IFD_OK)
        rc = check_classes(r, r->tensor, "predicted class", pred, rows, r->classes, err);
    if (rc != IFD_OK)
        return rc;
    for (int64_t i = 0; i < rows; i++) {
        if (r->matrix != NULL) {
            r->matrix[(int64_t)y[i] * r->classes + pred[i]]++;
        } else {
            r->actual[y[i]]++;
            r->predicted[pred[i]]++;
            r->correct[y[i]] += pred[i] == y[i];
        }
    }
    return IFD_OK;
}

static int add_top_k(ifd_reducer *r, const ifd_tensor *t, const ifd_tensor *label, int64_t rows,
                     ifd_error *err)
{
    const float *s = t->data;
    const int32_t *y = label->data;
    int64_t c = t->shape.dims[1];
    int rc = check_classes(r, r->label, "label", y, rows, c, err);
    if (rc != IFD_OK)
        return rc;
    for (int64_t i = 0; i < rows; i++) {
        const float *row = s + i * c;
        float mine = row[y[i]];
        if (isnan(mine))
            continue; /* a miss */
        int64_t rank = 0;
        for (int64_t j = 0; j < c && rank < r->k; j++)
            rank += row[j] > mine; /* NaN is never greater */
        r->hits += rank < r->k;
    }
    r->rows += rows;
    return IFD_OK;
}

static int add_auc(ifd_reducer *r, const ifd_tensor *t, const ifd_tensor *label, int64_t rows,
                   ifd_error *err)
{
    const float *s = t->data;
    const int32_t *y = label->data;
    int64_t stride = t->shape.rank == 2 ? t->shape.dims[1] : 1, col = stride == 2 ? 1 : 0;
    for (int64_t i = 0; i < rows; i++) {
        float v = s[i * stride + col];
        if (y[i] != 0 && y[i] != 1)
            return ifd_error_set(err, IFD_ERANGE,
                                 "host call '%s' on tensor '%s': row %lld of the step has label "
                                 "%d in tensor '%s', expected 0 or 1 (two classes)",
                                 r->spec, r->tensor, (long long)i, y[i], r->label);
        if (!(v >= 0.0f && v <= 1.0f))
            return ifd_error_set(err, IFD_ERANGE,
                                 "host call '%s' on tensor '%s': row %lld of the step has score "
                                 "%.9g, expected a probability in [0, 1]",
                                 r->spec, r->tensor, (long long)i, (double)v);
    }
    for (int64_t i = 0; i < rows; i++) {
        float v = s[i * stride + col];
        /* m: the thresholds strictly below v, where the row is predicted positive */
        int64_t lo = 0, hi = r->nthr;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (r->thr[mid] < v)
                lo = mid + 1;
            else
                hi = mid;
        }
        (y[i] ? r->pos : r->neg)[lo]++;
    }
    return IFD_OK;
}

int ifd_reducer_add(ifd_reducer *r, const ifd_tensor *t, const ifd_tensor *label, ifd_error *err)
{
    if (t == NULL || t->shape.rank < 1)
        return ifd_reducer_error(err, IFD_ESHAPE, r, "expected a tensor with a batch axis, got %s",
                                 t == NULL ? "none" : "a scalar");
    ifd_shape row = {.rank = t->shape.rank - 1};
    for (int i = 1; i < t->shape.rank; i++)
        row.dims[i - 1] = t->shape.dims[i];
    int64_t rows = t->shape.dims[0];
    ifd_shape label_row = {0};
    if (r->label[0]) {
        if (label == NULL || label->shape.rank < 1 || label->shape.dims[0] != rows)
            return ifd_reducer_error(
                err, IFD_ESHAPE, r,
                "label tensor '%s': expected %lld rows, as the step's '%s', got %lld", r->label,
                (long long)rows, r->tensor,
                label == NULL || label->shape.rank < 1 ? 0LL : (long long)label->shape.dims[0]);
        label_row.rank = label->shape.rank - 1;
        for (int i = 1; i < label->shape.rank; i++)
            label_row.dims[i - 1] = label->shape.dims[i];
    }
    int rc = ifd_reducer_check(r, t->dtype, &row, label ? label->dtype : IFD_DTYPE_INVALID,
                               label ? &label_row : NULL, err);
    if (rc != IFD_OK)
        return rc;
    if (r->dtype != IFD_DTYPE_INVALID && t->dtype != r->dtype)
        return ifd_reducer_error(err, IFD_EDTYPE, r, "expected %s, as in the earlier steps, got %s",
                                 ifd_dtype_name(r->dtype), ifd_dtype_name(t->dtype));
    int64_t n = rows * ifd_reducer_row_numel(&row);
    switch (r->kind) {
    case K_HISTOGRAM:
        add_histogram(r, t, n);
        break;
    case K_QUANTILES:
        rc = add_quantiles(r, t, n, err);
        break;
    case K_CONFUSION:
    case K_CLASS_ACCURACY:
    case K_PRECISION_RECALL:
        rc = add_classes(r, t, label, rows, err);
        break;
    case K_TOP_K:
        rc = add_top_k(r, t, label, rows, err);
        break;
    case K_AUC:
        rc = add_auc(r, t, label, rows, err);
        break;
    default:
        add_stats(r, t, n);
        break;
    }
    if (rc == IFD_OK)
        r->dtype = t->dtype;
    return rc;
}
