/*
 * Evaluation during training (--eval-every, docs/design.md "Evaluation during training"): a hook
 * on the train session that, at the first loop end at or past each multiple of `every` global
 * steps, runs an eval session (mode eval, the same program, settings, backend, replicas and
 * batch size) from the train session's current parameters over the eval set, synchronously on
 * the session's thread, and writes its eval summary ("during_train": true, the train run's
 * global step) to the train run's sinks; then --keep-best and --early-stopping look at it.
 * The train session's device is not touched: the eval session opens its own.
 */
#ifndef IFD_HOST_EVAL_HOOK_H
#define IFD_HOST_EVAL_HOOK_H

#include "host/eval_metric.h"
#include "host/eval_set.h"
#include <infeed/checkpoint.h>
#include <infeed/infeed.h>

#include <stddef.h>
#include <stdint.h>

/* A sink that forwards to inner (borrowed) under a mutex: the train session's outfeed thread and
 * the eval hook (the session's thread) write to the same files and sockets. */
int ifd_sink_shared_create(ifd_sink **out, ifd_sink *inner);

typedef struct ifd_eval_hook_options {
    ifd_config run;                 /* the train run's config (its strings borrowed) */
    ifd_eval_set *set;              /* borrowed */
    int64_t every;                  /* >= 1 */
    ifd_sink *sinks[IFD_MAX_SINKS]; /* where eval summaries go (borrowed) */
    int nsinks;
    const char *checkpoint_dir; /* keep_best: the best goes into checkpoint_dir/best */
    const char *keep_best;      /* a metric, or NULL */
    const char *early_stopping; /* "METRIC:PATIENCE", or NULL */
    /* optional: adds the producers' positions to the best checkpoint (as the checkpoint hook;
     * several hosts: every host's, gathered, ifd_checkpoint_add_positions) */
    int (*positions)(void *arg, ifd_checkpoint *c, ifd_error *err);
    void *positions_arg;
    /* several hosts (run.hosts): whether this host writes the best checkpoint (infeedd's
     * checkpoint_writer: rank 0 for a shared folder, every host with {rank}) */
    int write;
} ifd_eval_hook_options;

/* o is copied (its strings too). */
int ifd_hook_eval_every(ifd_hook *out, const ifd_eval_hook_options *o, ifd_error *err);

#endif
