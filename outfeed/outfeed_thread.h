/*
 * outfeed/'s interface for the session (loop/): the outfeed controller thread (the seed's
 * _run_outfeed and _OutfeedHostCall).
 *
 * Every step each replica outfeeds a small record (loss, correct, count) and the program's
 * outfeed tensors. The controller dequeues one record per replica per step, concatenates them
 * along axis 0 in replica order (then, with several hosts, in rank order: outfeed/step_tensors.h),
 * runs the host calls on them, and every summary_every steps emits a summary to the sinks.
 */
#ifndef IFD_OUTFEED_CONTROLLER_H
#define IFD_OUTFEED_CONTROLLER_H

#include "core/rendezvous.h"
#include "device/device.h"
#include "outfeed/summary.h"

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
    /* Train, eval: every step's outfeed tensors (outfeed/step_tensors.h) go to these too. */
    const ifd_tensor_sink *tensor_sinks;
    int ntensor_sinks;
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
