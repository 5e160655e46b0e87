/*
 * Private to outfeed/: the host calls the outfeed thread runs on each step's records
 * (outfeed/hostcall.c): the built-in metrics and predict mode's predictions.
 */
#ifndef IFD_OUTFEED_HOSTCALL_H
#define IFD_OUTFEED_HOSTCALL_H

#include "outfeed/outfeed_thread.h"

/* ---- the built-in metrics ---- */

enum { IFD_OUT_LOSS = 0, IFD_OUT_CORRECT, IFD_OUT_COUNT, IFD_OUT_NTENSORS };

/* Concatenates R records along axis 0 into three float32 [R] tensors over buf (3 * R floats). */
void ifd_outfeed_concat(const ifd_outfeed_rec *recs, int replicas, float *buf,
                        ifd_tensor out[IFD_OUT_NTENSORS]);

/* Running sums over a summary window. */
typedef struct ifd_metrics {
    int64_t steps;
    double loss_sum; /* sum over steps of the step loss (sum over replicas) */
    /* sum over steps and replicas of loss * count: eval's loss is this over count, one division
     * at the end, not an average of averages (eval steps run with scale 1, so a record's loss is
     * its shard's mean) */
    double loss_weighted;
    double correct;
    double count;
    /* Steps skipped for non-finite gradients or losses (counted in steps, left out of loss,
     * correct and count) and their rows. */
    int64_t skipped;
    double skipped_rows;
} ifd_metrics;

/* The metrics host call: adds one step's concatenated tensors. */
int ifd_metrics_host_call(ifd_metrics *m, const ifd_tensor t[IFD_OUT_NTENSORS], ifd_error *err);

/* ---- host call: predictions (predict mode) ---- */

/* ---- predictions (predict mode) ---- */

typedef struct ifd_prediction_call {
    const ifd_program *program;
    int64_t max_rows; /* the most rows a batch has */
    float *values;    /* [max_rows, predict_cols] */
    int32_t *classes; /* [max_rows] */
    ifd_prediction_sink sinks[IFD_MAX_PREDICTION_SINKS];
    int nsinks;
} ifd_prediction_call;

int ifd_prediction_call_init(ifd_prediction_call *c, const ifd_program *p, int64_t max_rows);
void ifd_prediction_call_fini(ifd_prediction_call *c);

/*
 * One predict step's records, one per replica in replica order, each holding a reference on its
 * shard's batch. Consecutive records of one batch are that batch's shards (per-host: row ranges
 * in order; broadcast: the same rows, replica 0's copy is used); the rows of each batch are
 * concatenated, cut to its valid rows (the padding mask), the classifier's argmax added, and the
 * predictions handed to every sink. Every reference is dropped, even on error. *examples gets
 * the rows delivered.
 */
int ifd_prediction_host_call(ifd_prediction_call *c, ifd_outfeed_rec *recs, int replicas,
                             int64_t *examples, ifd_error *err);

#endif
