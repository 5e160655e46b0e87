/*
 * The built-in host calls (outfeed/reducers.h). Written here rather than taken from a library:
 * each one is a few loops, and their definitions (numpy's quantile and histogram rules,
 * TensorFlow's histogram buckets and tf.metrics.auc) must be followed to the bit, which no C
 * library in the dependency set does. docs/summaries.md ("Host calls") is the contract.
 */
#include "outfeed/reducers.h"

#include "core/rng.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY "host_calls"
#define MAX_BINS 65536
#define MAX_QUANTILES 64
#define MAX_VALUES (INT64_C(1) << 26)
#define MAX_CLASSES (INT64_C(1) << 20)
#define MAX_CONFUSION_CLASSES 1024
#define MAX_THRESHOLDS 65536
#define MAX_LABEL_NAME 63
#define CELL_EMIN (-41) /* 2^-41 < 1e-12, the least positive limit */
#define CELL_EMAX 67    /* 2^68 > the greatest limit below DBL_MAX (< 1e20) */
#define RESERVOIR_SEED UINT64_C(0x686f737463616c6c)

typedef enum {
    K_MEAN,
    K_SUM,
    K_MIN,
    K_MAX,
    K_LAST,
    K_HISTOGRAM,
    K_QUANTILES,
    K_CONFUSION,
    K_CLASS_ACCURACY,
    K_PRECISION_RECALL,
    K_TOP_K,
    K_AUC,
} kind;

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

struct ifd_reducer {
    kind kind;
    char *tensor, *spec;
    char key[32];
    char label[MAX_LABEL_NAME + 1]; /* "": takes no label */
    ifd_dtype dtype;                /* of the values added; IFD_DTYPE_INVALID before the first */

    /* mean, sum, min, max, last; and over the finite values, the histogram's statistics */
    int64_t n;
    double sum, sum_sq; /* float32 tensors */
    int64_t isum;       /* int32 tensors: exact */
    double min, max;
    int nan; /* a NaN was added: min and max are null */
    int has_last;
    double last;
    int64_t nonfinite; /* histogram, quantiles: values left out */

    /* histogram: the default buckets (limits, nlimits of them) or bins fixed bins (edges, bins + 1
     * of them, in double for int32 tensors and rounded to float32 for float32 ones) */
    int fixed;
    double lo, hi;
    int64_t nlimits, bins;
    /* default buckets: npos positive limits below DBL_MAX (p = limits + npos + 2); cell[c]: how
     * many of them are below the low end of magnitude cell c (a binary exponent in [CELL_EMIN,
     * CELL_EMAX] and the mantissa's top 3 bits), so a value's bucket is a step or two from it */
    int64_t npos;
    int32_t *cell;
    int64_t f32_bad; /* the first float32 edge that is not finite or not above the one before; -1 */
    double *limits;
    float *edges_f;
    int64_t *counts, below, above;

    /* quantiles: the values kept (a reservoir sample once more than max_values came) */
    double *q;
    int nq;
    int64_t max_values, nvalues, cap, seen;
    double *values;
    ifd_rng rng;

    /* classifier metrics */
    int64_t classes;
    int64_t *matrix;                       /* confusion: [label][predicted] */
    int64_t *correct, *actual, *predicted; /* class_accuracy, precision_recall */

    /* top_k */
    int64_t k, hits, rows;

    /* auc: pos[m], neg[m]: rows of label 1, 0 whose score is above exactly m thresholds */
    int64_t nthr;
    float *thr;
    int64_t *pos, *neg;
};

/* ---- sentences ---- */

static int spec_error(ifd_error *err, int code, const ifd_reducer *r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int spec_error(ifd_error *err, int code, const ifd_reducer *r, const char *fmt, ...)
{
    char what[IFD_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ifd_error_set_key(err, code, KEY, "tensor '%s', '%s': %s", r->tensor, r->spec, what);
}

/* "[rows]", "[rows, 3]": a row shape with the batch axis in front. */
static const char *rows_format(const ifd_shape *row, char *buf, size_t len)
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

static int64_t row_numel(const ifd_shape *row)
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
        return spec_error(err, IFD_EINVAL, r, "%s given twice", what);
    if (parse_int(value, lo, hi, dst) != 0)
        return spec_error(err, IFD_EINVAL, r,
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
            return spec_error(err, IFD_EINVAL, r, "label= given twice");
        if (*value == '\0' || strlen(value) > MAX_LABEL_NAME)
            return spec_error(err, IFD_EINVAL, r,
                              "label= expected a tensor name of 1 to %d characters, got '%s'",
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
            return spec_error(err, IFD_EINVAL, r, "range= given twice");
        if (parse_double(value, ':', &mid, &r->lo) != 0 ||
            parse_double(mid + 1, '\0', NULL, &r->hi) != 0 || !(r->lo < r->hi))
            return spec_error(err, IFD_EINVAL, r,
                              "range= expected LO:HI, two finite numbers with LO < HI, got '%s'",
                              value);
        r->fixed = 1;
        return IFD_OK;
    }
    if (strcmp(name, "q") == 0 && k == K_QUANTILES) {
        if (r->nq != 0)
            return spec_error(err, IFD_EINVAL, r, "q= given twice");
        const char *s = value;
        for (;;) {
            const char *slash = strchr(s, '/');
            char stop = slash ? '/' : '\0';
            double v;
            if (r->nq == MAX_QUANTILES || parse_double(s, stop, NULL, &v) != 0 || v < 0.0 ||
                v > 1.0)
                return spec_error(err, IFD_EINVAL, r,
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
            return spec_error(err, IFD_EINVAL, r, "unknown parameter '%s': %s takes %s", name,
                              kinds[i].name, kinds[i].params);
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
        return spec_error(err, IFD_EINVAL, r, "%s takes no parameters, got '%s'", name, params);
    if (*params == '\0')
        return spec_error(err, IFD_EINVAL, r, "nothing after ':': %s takes %s", name, takes);
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
            rc = spec_error(err, IFD_EINVAL, r,
                            "expected NAME=VALUE parameters (%s takes %s), got '%s'", name, takes,
                            tok);
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
            return spec_error(err, IFD_EINVAL, r,
                              "bins= needs range=LO:HI too (fixed bins over a range)");
        if (r->fixed && r->bins == 0)
            return spec_error(err, IFD_EINVAL, r,
                              "range= needs bins=N too (fixed bins over a range)");
        if (r->fixed) {
            rc = fixed_edges(r);
            if (rc == IFD_ERANGE)
                return spec_error(err, IFD_EINVAL, r,
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
                return spec_error(err, IFD_EINVAL, r,
                                  "the class count is unknown: the program has no classes "
                                  "setting; give it as %s:classes=K",
                                  r->kind == K_CONFUSION        ? "confusion"
                                  : r->kind == K_CLASS_ACCURACY ? "class_accuracy"
                                                                : "precision_recall");
            if (program_classes > cap)
                return spec_error(err, IFD_EINVAL, r,
                                  "the program has %lld classes; this host call keeps at most "
                                  "%lld (%s)",
                                  (long long)program_classes, (long long)cap,
                                  r->kind == K_CONFUSION ? "a K x K matrix of counts"
                                                         : "three counts a class");
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
            return spec_error(err, IFD_EINVAL, r, "top_k needs K, as in top_k:5");
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
        return spec_error(err, IFD_ENOMEM, r, "out of memory");
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
        rc = spec_error(err, IFD_EINVAL, r,
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
    return spec_error(err, code, r, "%sexpected %s, got %s %s", whose, what, ifd_dtype_name(dt),
                      rows_format(row, shape, sizeof shape));
}

static int check_label(const ifd_reducer *r, ifd_dtype dt, const ifd_shape *row, ifd_error *err)
{
    char whose[MAX_LABEL_NAME + 32];
    snprintf(whose, sizeof whose, "label tensor '%s': ", r->label);
    const char *what = "int32 [rows] or [rows, 1] (a class a row)";
    if (row == NULL)
        return spec_error(err, IFD_EINVAL, r,
                          "%sexpected %s, but the program declares no such "
                          "outfeed tensor",
                          whose, what);
    if (dt != IFD_I32)
        return expected(r, IFD_EDTYPE, whose, what, dt, row, err);
    if (row_numel(row) != 1)
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
        if (row_numel(row) != 1)
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
            return spec_error(err, IFD_EINVAL, r,
                              "range=%.17g:%.17g with %lld bins over float32 values: the edges "
                              "rounded to float32 are %s",
                              r->lo, r->hi, (long long)r->bins,
                              isfinite(r->edges_f[r->f32_bad]) ? "not increasing (two are equal)"
                                                               : "out of float32's range");
        return IFD_OK;
    }
}

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
            return spec_error(err, IFD_ENOMEM, r, "out of memory keeping %lld values",
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
        return spec_error(err, IFD_ESHAPE, r, "expected a tensor with a batch axis, got %s",
                          t == NULL ? "none" : "a scalar");
    ifd_shape row = {.rank = t->shape.rank - 1};
    for (int i = 1; i < t->shape.rank; i++)
        row.dims[i - 1] = t->shape.dims[i];
    int64_t rows = t->shape.dims[0];
    ifd_shape label_row = {0};
    if (r->label[0]) {
        if (label == NULL || label->shape.rank < 1 || label->shape.dims[0] != rows)
            return spec_error(
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
        return spec_error(err, IFD_EDTYPE, r, "expected %s, as in the earlier steps, got %s",
                          ifd_dtype_name(r->dtype), ifd_dtype_name(t->dtype));
    int64_t n = rows * row_numel(&row);
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
