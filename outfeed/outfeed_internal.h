/*
 * The outfeed side: host calls, summaries and the outfeed controller thread (the seed's
 * _run_outfeed and _OutfeedHostCall).
 *
 * Every step each replica outfeeds a small record (loss, correct, count). The controller
 * dequeues one record per replica per step, concatenates them along axis 0 in replica order
 * (tensors of shape [R]), runs the host call on them, and every summary_every steps emits a
 * summary to the sinks.
 */
#ifndef IFD_OUTFEED_INTERNAL_H
#define IFD_OUTFEED_INTERNAL_H

#include "core/rendezvous.h"
#include "device/device.h"

#include <jansson.h>

/* ---- summaries ---- */

#define IFD_MAX_SINKS 8

typedef struct ifd_summary_writer {
    ifd_sink *sinks[IFD_MAX_SINKS];
    int nsinks;
    int hosts; /* > 1: every summary gets "host": host (this host's rank) */
    int host;
} ifd_summary_writer;

int ifd_summary_writer_add(ifd_summary_writer *w, ifd_sink *sink);
/* Dumps obj (compact, one line) to every sink, then releases obj (steals the reference). The
 * first failing sink's error is returned; the other sinks still get the summary. */
int ifd_summary_emit(ifd_summary_writer *w, json_t *obj, ifd_error *err);
int ifd_summary_flush(ifd_summary_writer *w, ifd_error *err);

/* ---- host call: the built-in metrics ---- */

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

#define IFD_MAX_PREDICTION_SINKS 8

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

/* ---- the controller ---- */

typedef struct ifd_outfeed ifd_outfeed;

typedef struct ifd_outfeed_config {
    ifd_device *dev;
    const ifd_program *program;
    ifd_mode mode;
    int64_t summary_every;
    ifd_summary_writer *writer;
    ifd_rendezvous *rv;
    ifd_input_mode input_mode;             /* broadcast: host calls take replica 0's record */
    int64_t max_batch_rows;                /* predict: the most rows a batch has */
    const ifd_prediction_sink *pred_sinks; /* predict */
    int npred_sinks;
    /* Several hosts (train, eval; NULL: one): each summary's metrics are summed over the hosts
     * (an all-gather on the OUTFEED channel, summed in rank order), so every host's summary
     * describes the global step. Hosts emit at the same global steps, and the last window is
     * reduced by every host's ifd_outfeed_flush, empty or not. */
    const struct ifd_hosts *hosts;
    /* Train, eval: this many skipped steps in a row end the run with IFD_ENUMERIC (0: never). */
    int64_t max_skipped_steps;
} ifd_outfeed_config;

int ifd_outfeed_start(ifd_outfeed **out, const ifd_outfeed_config *cfg);
int ifd_outfeed_signal(ifd_outfeed *o, int64_t n);
void ifd_outfeed_stop(ifd_outfeed *o);
/* After stop: emits the summary of the steps since the last one, if any. */
int ifd_outfeed_flush(ifd_outfeed *o, ifd_error *err);
/* Steps this run skipped (after stop). */
int64_t ifd_outfeed_skipped(const ifd_outfeed *o);
void ifd_outfeed_destroy(ifd_outfeed *o);

#endif
