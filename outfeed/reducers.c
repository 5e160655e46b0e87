/*
 * The built-in host calls (outfeed/reducers.h). Written here rather than taken from a library:
 * each one is a few loops, and their definitions (numpy's quantile and histogram rules,
 * TensorFlow's histogram buckets and tf.metrics.auc) must be followed to the bit, which no C
 * library in the dependency set does. docs/summaries.md ("Host calls") is the contract.
 */
#include "outfeed/reducers_internal.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* params: the parameters a kind takes, as the error sentences list them. */
static const struct {
    const char *name;
    kind kind;
    const char *params;
} kinds[] = {
    {"mean", K_MEAN, NULL},
    {"sum", K_SUM, NULL},
    {"min", K_MIN, NULL},
    {"max", K_MAX, NULL},
    {"last", K_LAST, NULL},
    {"histogram", K_HISTOGRAM, "bins=N and range=LO:HI"},
    {"quantiles", K_QUANTILES, "q=A/B/... and max=N"},
    {"confusion", K_CONFUSION, "label=NAME and classes=K"},
    {"class_accuracy", K_CLASS_ACCURACY, "label=NAME and classes=K"},
    {"precision_recall", K_PRECISION_RECALL, "label=NAME and classes=K"},
    {"top_k", K_TOP_K, "K first, then label=NAME"},
    {"auc", K_AUC, "label=NAME and thresholds=N"},
};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

/* ---- sentences ---- */

int ifd_reducer_error(ifd_error *err, int code, const ifd_reducer *r, const char *fmt, ...)
{
    char what[IFD_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ifd_error_set_key(err, code, KEY, "tensor '%s', '%s': %s", r->tensor, r->spec, what);
}

/* "[rows]", "[rows, 3]": a row shape with the batch axis in front. */
const char *ifd_reducer_rows_format(const ifd_shape *row, char *buf, size_t len)
{
    if (row == NULL) {
        snprintf(buf, len, "no tensor");
        return buf;
    }
    size_t at = (size_t)snprintf(buf, len, "[rows");
    for (int i = 0; i < row->rank && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, ", %lld", (long long)row->dims[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
    return buf;
}

int64_t ifd_reducer_row_numel(const ifd_shape *row)
{
    int64_t n = 1;
    for (int i = 0; i < row->rank; i++)
        n *= row->dims[i];
    return n;
}

/* ---- parsing the spec ---- */

static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, char stop, const char **next, double *out)
{
    char *end;
    if (*s == '\0' || *s == ' ')
        return -1;
    double v = strtod(s, &end);
    if (end == s || *end != stop || !isfinite(v))
        return -1;
    *out = v;
    if (next != NULL)
        *next = end;
    return 0;
}

/* An integer parameter (what: "bins=", "K") in [lo, hi] into *dst, which is 0 until given. */
static int int_param(const ifd_reducer *r, const char *what, const char *value, int64_t lo,
                     int64_t hi, const char *unit, int64_t *dst, ifd_error *err)
{
    if (*dst != 0)
        return ifd_reducer_error(err, IFD_EINVAL, r, "%s given twice", what);
    if (parse_int(value, lo, hi, dst) != 0)
        return ifd_reducer_error(err, IFD_EINVAL, r,
                                 "%s expected a whole number from %lld to %lld%s, got '%s'", what,
                                 (long long)lo, (long long)hi, unit, value);
    return IFD_OK;
}

static int set_param(ifd_reducer *r, const char *name, const char *value, int *seen_label,
                     ifd_error *err)
{
    const kind k = r->kind;
    int classes_kind = k == K_CONFUSION || k == K_CLASS_ACCURACY || k == K_PRECISION_RECALL;
    if (strcmp(name, "label") == 0 && (classes_kind || k == K_TOP_K || k == K_AUC)) {
        if (*seen_label)
            return ifd_reducer_error(err, IFD_EINVAL, r, "label= given twice");
        if (*value == '\0' || strlen(value) > MAX_LABEL_NAME)
            return ifd_reducer_error(
                err, IFD_EINVAL, r, "label= expected a tensor name of 1 to %d characters, got '%s'",
                MAX_LABEL_NAME, value);
        snprintf(r->label, sizeof r->label, "%s", value);
        *seen_label = 1;
        return IFD_OK;
    }
    if (strcmp(name, "classes") == 0 && classes_kind)
        return int_param(r, "classes=", value, 1,
                         k == K_CONFUSION ? MAX_CONFUSION_CLASSES : MAX_CLASSES, "", &r->classes,
                         err);
    if (strcmp(name, "bins") == 0 && k == K_HISTOGRAM)
        return int_param(r, "bins=", value, 1, MAX_BINS, "", &r->bins, err);
    if (strcmp(name, "max") == 0 && k == K_QUANTILES)
        return int_param(r, "max=", value, 1, MAX_VALUES, " (values kept)", &r->max_values, err);
    if (strcmp(name, "thresholds") == 0 && k == K_AUC)
        return int_param(r, "thresholds=", value, 2, MAX_THRESHOLDS, "", &r->nthr, err);
    if (strcmp(name, "k") == 0 && k == K_TOP_K)
        return int_param(r, "K", value, 1, MAX_CLASSES, "", &r->k, err);
    if (strcmp(name, "range") == 0 && k == K_HISTOGRAM) {
        const char *mid;
        if (r->fixed)
            return ifd_reducer_error(err, IFD_EINVAL, r, "range= given twice");
        if (parse_double(value, ':', &mid, &r->lo) != 0 ||
            parse_double(mid + 1, '\0', NULL, &r->hi) != 0 || !(r->lo < r->hi))
            return ifd_reducer_error(
                err, IFD_EINVAL, r,
                "range= expected LO:HI, two finite numbers with LO < HI, got '%s'", value);
        r->fixed = 1;
        return IFD_OK;
    }
    if (strcmp(name, "q") == 0 && k == K_QUANTILES) {
        if (r->nq != 0)
            return ifd_reducer_error(err, IFD_EINVAL, r, "q= given twice");
        const char *s = value;
        for (;;) {
            const char *slash = strchr(s, '/');
            char stop = slash ? '/' : '\0';
            double v;
            if (r->nq == MAX_QUANTILES || parse_double(s, stop, NULL, &v) != 0 || v < 0.0 ||
                v > 1.0)
                return ifd_reducer_error(
                    err, IFD_EINVAL, r,
                    "q= expected 1 to %d numbers in [0, 1] separated by '/', got "
                    "'%s'",
                    MAX_QUANTILES, value);
            r->q[r->nq++] = v;
            if (slash == NULL)
                return IFD_OK;
            s = slash + 1;
        }
    }
    for (int i = 0; i < NKINDS; i++)
        if (kinds[i].kind == k)
            return ifd_reducer_error(err, IFD_EINVAL, r, "unknown parameter '%s': %s takes %s",
                                     name, kinds[i].name, kinds[i].params);
    return IFD_EINTERNAL;
}

/* params: the text after ':' (modified in place). */
static int parse_params(ifd_reducer *r, const char *name, char *params, ifd_error *err)
{
    int seen_label = 0;
    const char *takes = NULL;
    for (int i = 0; i < NKINDS; i++)
        if (kinds[i].kind == r->kind)
            takes = kinds[i].params;
    if (takes == NULL)
        return ifd_reducer_error(err, IFD_EINVAL, r, "%s takes no parameters, got '%s'", name,
                                 params);
    if (*params == '\0')
        return ifd_reducer_error(err, IFD_EINVAL, r, "nothing after ':': %s takes %s", name, takes);
    int first = 1;
    for (char *tok = params;; first = 0) {
        char *comma = strchr(tok, ',');
        if (comma != NULL)
            *comma = '\0';
        char *eq = strchr(tok, '=');
        int rc;
        if (eq == NULL && first && r->kind == K_TOP_K) {
            rc = set_param(r, "k", tok, &seen_label, err);
        } else if (eq == NULL || eq == tok) {
            rc = ifd_reducer_error(err, IFD_EINVAL, r,
                                   "expected NAME=VALUE parameters (%s takes %s), got '%s'", name,
                                   takes, tok);
        } else {
            *eq = '\0';
            rc = set_param(r, tok, eq + 1, &seen_label, err);
        }
        if (rc != IFD_OK)
            return rc;
        if (comma == NULL)
            return IFD_OK;
        tok = comma + 1;
    }
}

/* ---- create, destroy ---- */

/* TensorFlow's default histogram bucket limits (tensorflow/core/lib/histogram/histogram.cc):
 * 1e-12 growing by 1.1 while below 1e20, then DBL_MAX; their negatives mirrored; and 0. */
static int default_limits(ifd_reducer *r)
{
    int64_t pos = 0;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1)
        pos++;
    r->nlimits = 2 * (pos + 1) + 1;
    r->limits = malloc(sizeof(double) * (size_t)r->nlimits);
    if (r->limits == NULL)
        return IFD_ENOMEM;
    double *p = r->limits + pos + 2; /* the positive limits, after -DBL_MAX..-1e-12 and 0 */
    int64_t i = 0;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1)
        p[i++] = v;
    p[pos] = DBL_MAX;
    for (i = 0; i <= pos; i++)
        r->limits[i] = -p[pos - i];
    r->limits[pos + 1] = 0.0;
    r->npos = pos;
    r->cell = malloc(sizeof(int32_t) * 8 * (CELL_EMAX - CELL_EMIN + 1));
    if (r->cell == NULL)
        return IFD_ENOMEM;
    int64_t c = 0;
    for (int e = CELL_EMIN; e <= CELL_EMAX; e++)
        for (int m = 0; m < 8; m++) {
            double low = ldexp(1.0 + m / 8.0, e);
            while (c < pos && p[c] < low)
                c++;
            r->cell[(e - CELL_EMIN) * 8 + m] = (int32_t)c;
        }
    return IFD_OK;
}

/* numpy.histogram's edges for bins over [lo, hi]: np.linspace in double (i * step + lo, the last
 * one hi), then rounded to the tensor's dtype: float32 for float32 values, double for int32. */
static int fixed_edges(ifd_reducer *r)
{
    r->limits = malloc(sizeof(double) * (size_t)(r->bins + 1));
    r->edges_f = malloc(sizeof(float) * (size_t)(r->bins + 1));
    if (r->limits == NULL || r->edges_f == NULL)
        return IFD_ENOMEM;
    double step = (r->hi - r->lo) / (double)r->bins;
    for (int64_t i = 0; i < r->bins; i++) {
        volatile double y = (double)i * step; /* two roundings, as numpy: no fused multiply-add */
        r->limits[i] = y + r->lo;
    }
    r->limits[r->bins] = r->hi;
    r->f32_bad = -1;
    for (int64_t i = 0; i <= r->bins; i++) {
        r->edges_f[i] = (float)r->limits[i];
        if (i > 0 && !(r->limits[i] > r->limits[i - 1]))
            return IFD_ERANGE;
        if (r->f32_bad < 0 &&
            (!isfinite(r->edges_f[i]) || (i > 0 && !(r->edges_f[i] > r->edges_f[i - 1]))))
            r->f32_bad = i;
    }
    return IFD_OK;
}

/* tf.metrics.auc's thresholds: -1e-7, i / (N - 1) for i in 1..N-2, 1 + 1e-7, as float32. */
static int auc_thresholds(ifd_reducer *r)
{
    r->thr = malloc(sizeof(float) * (size_t)r->nthr);
    r->pos = calloc((size_t)r->nthr + 1, sizeof(int64_t));
    r->neg = calloc((size_t)r->nthr + 1, sizeof(int64_t));
    if (r->thr == NULL || r->pos == NULL || r->neg == NULL)
        return IFD_ENOMEM;
    r->thr[0] = (float)(0.0 - 1e-7);
    for (int64_t i = 1; i < r->nthr - 1; i++)
        r->thr[i] = (float)((double)i / (double)(r->nthr - 1));
    r->thr[r->nthr - 1] = (float)(1.0 + 1e-7);
    return IFD_OK;
}

static int allocate(ifd_reducer *r, int64_t program_classes, ifd_error *err)
{
    int rc = IFD_OK;
    switch (r->kind) {
    case K_HISTOGRAM:
        if (!r->fixed && r->bins != 0)
            return ifd_reducer_error(err, IFD_EINVAL, r,
                                     "bins= needs range=LO:HI too (fixed bins over a range)");
        if (r->fixed && r->bins == 0)
            return ifd_reducer_error(err, IFD_EINVAL, r,
                                     "range= needs bins=N too (fixed bins over a range)");
        if (r->fixed) {
            rc = fixed_edges(r);
            if (rc == IFD_ERANGE)
                return ifd_reducer_error(err, IFD_EINVAL, r,
                                         "range=%.17g:%.17g is too narrow for %lld bins (two edges "
                                         "are equal)",
                                         r->lo, r->hi, (long long)r->bins);
        } else {
            rc = default_limits(r);
        }
        if (rc == IFD_OK) {
            int64_t n = r->fixed ? r->bins : r->nlimits;
            r->counts = calloc((size_t)n, sizeof(int64_t));
            rc = r->counts ? IFD_OK : IFD_ENOMEM;
        }
        break;
    case K_QUANTILES:
        if (r->nq == 0) {
            const double dflt[] = {0.0, 0.25, 0.5, 0.75, 1.0};
            memcpy(r->q, dflt, sizeof dflt);
            r->nq = 5;
        }
        if (r->max_values == 0)
            r->max_values = IFD_REDUCER_MAX_VALUES;
        break;
    case K_CONFUSION:
    case K_CLASS_ACCURACY:
    case K_PRECISION_RECALL: {
        int64_t cap = r->kind == K_CONFUSION ? MAX_CONFUSION_CLASSES : MAX_CLASSES;
        if (r->classes == 0) {
            if (program_classes <= 0)
                return ifd_reducer_error(err, IFD_EINVAL, r,
                                         "the class count is unknown: the program has no classes "
                                         "setting; give it as %s:classes=K",
                                         r->kind == K_CONFUSION        ? "confusion"
                                         : r->kind == K_CLASS_ACCURACY ? "class_accuracy"
                                                                       : "precision_recall");
            if (program_classes > cap)
                return ifd_reducer_error(
                    err, IFD_EINVAL, r,
                    "the program has %lld classes; this host call keeps at most "
                    "%lld (%s)",
                    (long long)program_classes, (long long)cap,
                    r->kind == K_CONFUSION ? "a K x K matrix of counts" : "three counts a class");
            r->classes = program_classes;
        }
        size_t k = (size_t)r->classes;
        if (r->kind == K_CONFUSION) {
            r->matrix = calloc(k * k, sizeof(int64_t));
            rc = r->matrix ? IFD_OK : IFD_ENOMEM;
        } else {
            r->correct = calloc(k, sizeof(int64_t));
            r->actual = calloc(k, sizeof(int64_t));
            r->predicted = calloc(k, sizeof(int64_t));
            rc = r->correct && r->actual && r->predicted ? IFD_OK : IFD_ENOMEM;
        }
        break;
    }
    case K_TOP_K:
        if (r->k == 0)
            return ifd_reducer_error(err, IFD_EINVAL, r, "top_k needs K, as in top_k:5");
        break;
    case K_AUC:
        if (r->nthr == 0)
            r->nthr = 200;
        rc = auc_thresholds(r);
        break;
    default:
        break;
    }
    if (rc == IFD_ENOMEM)
        return ifd_reducer_error(err, IFD_ENOMEM, r, "out of memory");
    return rc;
}

int ifd_reducer_create(ifd_reducer **out, const char *tensor, const char *spec, int64_t classes,
                       ifd_error *err)
{
    *out = NULL;
    ifd_reducer *r = calloc(1, sizeof *r);
    char *copy = NULL;
    int rc = IFD_ENOMEM;
    if (r == NULL)
        goto fail_alloc;
    r->tensor = strdup(tensor ? tensor : "");
    r->spec = strdup(spec ? spec : "");
    r->q = malloc(sizeof(double) * MAX_QUANTILES);
    copy = strdup(spec ? spec : "");
    if (r->tensor == NULL || r->spec == NULL || r->q == NULL || copy == NULL)
        goto fail_alloc;

    char *params = strchr(copy, ':');
    if (params != NULL)
        *params++ = '\0';
    int found = 0;
    for (int i = 0; i < NKINDS && !found; i++)
        if (strcmp(copy, kinds[i].name) == 0) {
            r->kind = kinds[i].kind;
            found = 1;
        }
    if (!found) {
        rc = ifd_reducer_error(err, IFD_EINVAL, r,
                               "unknown host call '%s': expected mean, sum, min, max, last, "
                               "histogram, quantiles, confusion, class_accuracy, precision_recall, "
                               "top_k or auc",
                               copy);
        goto fail;
    }
    snprintf(r->key, sizeof r->key, "%s", copy);
    if (r->kind >= K_CONFUSION)
        snprintf(r->label, sizeof r->label, "%s", IFD_REDUCER_LABEL);
    if (params != NULL) {
        rc = parse_params(r, copy, params, err);
        if (rc != IFD_OK)
            goto fail;
    }
    rc = allocate(r, classes, err);
    if (rc != IFD_OK)
        goto fail;
    if (r->kind == K_TOP_K)
        snprintf(r->key, sizeof r->key, "top_%lld", (long long)r->k);
    ifd_reducer_reset(r);
    free(copy);
    *out = r;
    return IFD_OK;

fail_alloc:
    rc = ifd_error_set(err, IFD_ENOMEM, "host call '%s' on tensor '%s': out of memory",
                       spec ? spec : "", tensor ? tensor : "");
fail:
    free(copy);
    ifd_reducer_destroy(r);
    return rc;
}

void ifd_reducer_destroy(ifd_reducer *r)
{
    if (r == NULL)
        return;
    free(r->tensor);
    free(r->spec);
    free(r->limits);
    free(r->cell);
    free(r->edges_f);
    free(r->counts);
    free(r->q);
    free(r->values);
    free(r->matrix);
    free(r->correct);
    free(r->actual);
    free(r->predicted);
    free(r->thr);
    free(r->pos);
    free(r->neg);
    free(r);
}

void ifd_reducer_reset(ifd_reducer *r)
{
    r->n = 0;
    r->sum = r->sum_sq = 0.0;
    r->isum = 0;
    r->min = INFINITY;
    r->max = -INFINITY;
    r->nan = r->has_last = 0;
    r->last = 0.0;
    r->nonfinite = r->below = r->above = 0;
    if (r->counts != NULL)
        memset(r->counts, 0, sizeof(int64_t) * (size_t)(r->fixed ? r->bins : r->nlimits));
    r->nvalues = r->seen = 0;
    ifd_rng_seed(&r->rng, RESERVOIR_SEED);
    size_t k = (size_t)r->classes;
    if (r->matrix != NULL)
        memset(r->matrix, 0, sizeof(int64_t) * k * k);
    if (r->correct != NULL) {
        memset(r->correct, 0, sizeof(int64_t) * k);
        memset(r->actual, 0, sizeof(int64_t) * k);
        memset(r->predicted, 0, sizeof(int64_t) * k);
    }
    r->hits = r->rows = 0;
    if (r->pos != NULL) {
        memset(r->pos, 0, sizeof(int64_t) * (size_t)(r->nthr + 1));
        memset(r->neg, 0, sizeof(int64_t) * (size_t)(r->nthr + 1));
    }
}

const char *ifd_reducer_needs(const ifd_reducer *r)
{
    return r->label[0] ? r->label : NULL;
}

const char *ifd_reducer_key(const ifd_reducer *r)
{
    return r->key;
}

const char *ifd_reducer_tensor(const ifd_reducer *r)
{
    return r->tensor;
}

const char *ifd_reducer_spec(const ifd_reducer *r)
{
    return r->spec;
}

/* ---- check ---- */

static int expected(const ifd_reducer *r, int code, const char *whose, const char *what,
                    ifd_dtype dt, const ifd_shape *row, ifd_error *err)
{
    char shape[160];
    return ifd_reducer_error(err, code, r, "%sexpected %s, got %s %s", whose, what,
                             ifd_dtype_name(dt), ifd_reducer_rows_format(row, shape, sizeof shape));
}

static int check_label(const ifd_reducer *r, ifd_dtype dt, const ifd_shape *row, ifd_error *err)
{
    char whose[MAX_LABEL_NAME + 32];
    snprintf(whose, sizeof whose, "label tensor '%s': ", r->label);
    const char *what = "int32 [rows] or [rows, 1] (a class a row)";
    if (row == NULL)
        return ifd_reducer_error(err, IFD_EINVAL, r,
                                 "%sexpected %s, but the program declares no such "
                                 "outfeed tensor",
                                 whose, what);
    if (dt != IFD_I32)
        return expected(r, IFD_EDTYPE, whose, what, dt, row, err);
    if (ifd_reducer_row_numel(row) != 1)
        return expected(r, IFD_ESHAPE, whose, what, dt, row, err);
    return IFD_OK;
}

int ifd_reducer_check(const ifd_reducer *r, ifd_dtype dt, const ifd_shape *row, ifd_dtype label_dt,
                      const ifd_shape *label_row, ifd_error *err)
{
    char what[160];
    switch (r->kind) {
    case K_CONFUSION:
    case K_CLASS_ACCURACY:
    case K_PRECISION_RECALL: {
        const char *w = "int32 predicted classes [rows] or [rows, 1]";
        if (dt != IFD_I32)
            return expected(r, IFD_EDTYPE, "", w, dt, row, err);
        if (ifd_reducer_row_numel(row) != 1)
            return expected(r, IFD_ESHAPE, "", w, dt, row, err);
        return check_label(r, label_dt, label_row, err);
    }
    case K_TOP_K:
        snprintf(what, sizeof what, "float32 scores [rows, C] with C >= %lld", (long long)r->k);
        if (dt != IFD_F32)
            return expected(r, IFD_EDTYPE, "", what, dt, row, err);
        if (row->rank != 1 || row->dims[0] < r->k)
            return expected(r, IFD_ESHAPE, "", what, dt, row, err);
        return check_label(r, label_dt, label_row, err);
    case K_AUC: {
        const char *w = "float32 scores in [0, 1], [rows] or [rows, 1], or [rows, 2] (two "
                        "classes: column 1 is the score of class 1)";
        if (dt != IFD_F32)
            return expected(r, IFD_EDTYPE, "", w, dt, row, err);
        if (row->rank > 1 || (row->rank == 1 && row->dims[0] != 1 && row->dims[0] != 2))
            return expected(r, IFD_ESHAPE, "", w, dt, row, err);
        return check_label(r, label_dt, label_row, err);
    }
    default:
        if (dt != IFD_F32 && dt != IFD_I32)
            return expected(r, IFD_EDTYPE, "", "float32 or int32", dt, row, err);
        if (r->kind == K_HISTOGRAM && r->fixed && dt == IFD_F32 && r->f32_bad >= 0)
            return ifd_reducer_error(
                err, IFD_EINVAL, r,
                "range=%.17g:%.17g with %lld bins over float32 values: the edges "
                "rounded to float32 are %s",
                r->lo, r->hi, (long long)r->bins,
                isfinite(r->edges_f[r->f32_bad]) ? "not increasing (two are equal)"
                                                 : "out of float32's range");
        return IFD_OK;
    }
}
