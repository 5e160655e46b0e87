/*
 * Private to outfeed/: the built-in host calls (outfeed/reducers.c), chosen per outfeed tensor in
 * the config (`host_calls`, docs/config.md). A reducer takes one step's concatenated tensor (and
 * for the classifier metrics a label tensor) at a time and reports one JSON value over what it
 * took since its last reset: a summary window in train mode, the whole run in eval mode.
 * docs/summaries.md ("Host calls") defines every value.
 *
 * Host memory only, no threads: the outfeed thread owns its reducers. Integer counts (histogram
 * buckets, confusion counts, AUC's per-threshold counts, top-k hits) do not depend on how the
 * rows were split into steps or in what order they came; float sums are summed in double in the
 * order given. The one order-dependent value is a quantile past its `max` values (a reservoir
 * sample, the same for the same sequence of values).
 */
#ifndef IFD_OUTFEED_REDUCERS_H
#define IFD_OUTFEED_REDUCERS_H

#include <infeed/error.h>
#include <infeed/tensor.h>

#include <jansson.h>
#include <stdint.h>

typedef struct ifd_reducer ifd_reducer;

/* The label tensor's name when the spec names none. */
#define IFD_REDUCER_LABEL "label"
/* quantiles: values kept when the spec says no max= (8 MiB of doubles). */
#define IFD_REDUCER_MAX_VALUES (INT64_C(1) << 20)

/*
 * spec: "mean", "sum", "min", "max", "last", "histogram[:bins=N,range=LO:HI]",
 * "quantiles[:q=A/B/...,max=N]", "confusion[:label=NAME,classes=K]",
 * "class_accuracy[:label=NAME,classes=K]", "precision_recall[:label=NAME,classes=K]",
 * "top_k:K[,label=NAME]", "auc[:label=NAME,thresholds=N]". classes: the program's class count
 * (confusion, class_accuracy, precision_recall take it unless the spec says classes=), 0 if none.
 * An unknown spec or a bad parameter: IFD_EINVAL and a sentence (key "host_calls") naming the
 * tensor, the spec, what was expected and what arrived.
 */
int ifd_reducer_create(ifd_reducer **out, const char *tensor, const char *spec, int64_t classes,
                       ifd_error *err);
/* The label tensor's name this reducer also takes, or NULL. */
const char *ifd_reducer_needs(const ifd_reducer *r);
/* Its key in the summary: the spec's name ("mean", "histogram"), "top_K" for top_k:K. */
const char *ifd_reducer_key(const ifd_reducer *r);
/* The tensor's name and the spec, as given to create. */
const char *ifd_reducer_tensor(const ifd_reducer *r);
const char *ifd_reducer_spec(const ifd_reducer *r);

/*
 * At start: checks the tensor's (and the label's) dtype and per-row shape (the shape without the
 * batch axis; a value per step has the row shape []). label_dt and label_row are ignored (may be
 * 0 and NULL) when the reducer needs no label. IFD_EDTYPE or IFD_ESHAPE with a sentence (key
 * "host_calls") naming the tensor, the spec, what was expected and what arrived.
 */
int ifd_reducer_check(const ifd_reducer *r, ifd_dtype dt, const ifd_shape *row, ifd_dtype label_dt,
                      const ifd_shape *label_row, ifd_error *err);
/*
 * One step's concatenated tensor (shape.dims[0] = rows of the step; host memory) and its label
 * (NULL when none is needed; as many rows as t). A label or a predicted class out of [0, K), an
 * AUC score outside [0, 1] or an AUC label other than 0 or 1: IFD_ERANGE naming the tensor, the
 * row of the step and the value. On any error nothing of the step was added.
 */
int ifd_reducer_add(ifd_reducer *r, const ifd_tensor *t, const ifd_tensor *label, ifd_error *err);
/* The value over what was added since the last reset (a new reference); NULL when out of
 * memory. */
json_t *ifd_reducer_value(const ifd_reducer *r);
void ifd_reducer_reset(ifd_reducer *r);
/* NULL: a no-op. */
void ifd_reducer_destroy(ifd_reducer *r);

#endif
