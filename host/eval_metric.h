/*
 * The metrics of --keep-best and --early-stopping (host/eval_hook.h): their names, which way is
 * better, and "METRIC:PATIENCE". Apart so that the config's validation pass can use them.
 */
#ifndef IFD_HOST_EVAL_METRIC_H
#define IFD_HOST_EVAL_METRIC_H

#include <stddef.h>
#include <stdint.h>

/* A metric name: 1 to 63 letters, digits or '_'. */
int ifd_eval_metric_valid(const char *name);
/* Whether smaller is better: "loss" and names ending in "_loss"; others (accuracy, ...) are
 * maximized. */
int ifd_eval_metric_minimized(const char *name);
/* "METRIC:PATIENCE" (PATIENCE >= 1): 0 with metric (len bytes) and *patience, else -1. */
int ifd_eval_parse_early_stopping(const char *s, char *metric, size_t len, int64_t *patience);

#endif
