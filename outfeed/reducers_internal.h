/*
 * The built-in host calls' state, shared by their three files (outfeed/reducers.h is the
 * interface): reducers.c parses a spec, creates and checks a reducer; reducer_add.c adds a
 * step's values; reducer_value.c writes the summary's value.
 */
#ifndef IFD_OUTFEED_REDUCERS_INTERNAL_H
#define IFD_OUTFEED_REDUCERS_INTERNAL_H

#include "outfeed/reducers.h"

#include "core/rng.h"

#include <stdint.h>

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

/* A sentence about r: "host_calls: tensor 'T', 'SPEC': " and fmt's. */
int ifd_reducer_error(ifd_error *err, int code, const ifd_reducer *r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "[rows]", "[rows, 3]": a row shape with the batch axis in front. */
const char *ifd_reducer_rows_format(const ifd_shape *row, char *buf, size_t len);
/* The values in a row of shape row. */
int64_t ifd_reducer_row_numel(const ifd_shape *row);

#endif
