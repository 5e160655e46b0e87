/*
 * Private to outfeed/: the host calls of plugins (include/infeed/host_call.h) a run runs. At the
 * start every registered class is bound to the run's outfeed tensors by name (a class whose
 * tensors the program does not outfeed refuses the run, naming them); every step hands each its
 * tensors; every summary (train: a window; eval: the whole eval) asks each for its JSON object,
 * which lands under "host_calls" and the class's name.
 */
#ifndef IFD_OUTFEED_PLUGIN_CALLS_H
#define IFD_OUTFEED_PLUGIN_CALLS_H

#include "outfeed/step_tensors.h"
#include <infeed/host_call.h>

#include <jansson.h>

#define IFD_PLUGIN_CALLS_MAX 16
#define IFD_PLUGIN_CALL_JSON_MAX (64 * 1024) /* the most text a summary of one call takes */

typedef struct ifd_plugin_call {
    const ifd_host_call_class *cls;
    void *state;
    int idx[IFD_HOST_CALL_MAX_TENSORS]; /* into the run's outfeed tensors */
} ifd_plugin_call;

typedef struct ifd_plugin_calls {
    int n;
    ifd_plugin_call calls[IFD_PLUGIN_CALLS_MAX];
    char *text; /* IFD_PLUGIN_CALL_JSON_MAX bytes */
} ifd_plugin_calls;

/* Binds and initializes every registered class for the run whose tensors c holds. */
int ifd_plugin_calls_init(ifd_plugin_calls *pc, const ifd_outfeed_tensors *c,
                          const ifd_host_call_info *info, ifd_error *err);
/* One step's tensors (c->tensors, after ifd_outfeed_tensors_step) to every call. */
int ifd_plugin_calls_step(ifd_plugin_calls *pc, const ifd_outfeed_tensors *c, int64_t step,
                          ifd_error *err);
/* Each call's values since the last summary into host_calls (a JSON object) under its name. */
int ifd_plugin_calls_summary(ifd_plugin_calls *pc, json_t *host_calls, ifd_error *err);
void ifd_plugin_calls_fini(ifd_plugin_calls *pc);

#endif
