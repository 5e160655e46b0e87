/*
 * Private to outfeed/: the built-in host calls a run was configured with (ifd_config.host_calls),
 * each a reducer (outfeed/reducers.h) over one tensor of the step's set (outfeed/step_tensors.h)
 * and, for the classifier metrics, its label tensor.
 */
#ifndef IFD_OUTFEED_REDUCER_SET_H
#define IFD_OUTFEED_REDUCER_SET_H

#include "outfeed/step_tensors.h"

#include <jansson.h>

typedef struct ifd_reducer ifd_reducer;

typedef struct ifd_reducer_set {
    int n;
    ifd_reducer *r[IFD_MAX_HOST_CALLS];
    int tensor[IFD_MAX_HOST_CALLS]; /* indices into the step's set */
    int label[IFD_MAX_HOST_CALLS];  /* -1: none */
} ifd_reducer_set;

/* Creates and checks the reducers of calls[0..n) over the tensors of tens. On an error (a
 * sentence with the key "host_calls") nothing is left to free. */
int ifd_reducer_set_init(ifd_reducer_set *s, const ifd_outfeed_tensors *tens,
                         const ifd_host_call *calls, int n, ifd_error *err);
/* One step's tensors (after ifd_outfeed_tensors_step) into every reducer. */
int ifd_reducer_set_add(ifd_reducer_set *s, const ifd_outfeed_tensors *tens, ifd_error *err);
/* {"<tensor>": {"<key>": value, ...}, ...} over what was added since the last reset, and
 * resets; NULL when there are no host calls. */
json_t *ifd_reducer_set_take(ifd_reducer_set *s);
void ifd_reducer_set_fini(ifd_reducer_set *s);

#endif
