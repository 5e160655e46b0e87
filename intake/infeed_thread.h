/*
 * infeed/'s interface for the session (loop/): the infeed controller thread (the seed's
 * _run_infeed): for each loop signal n, it takes the batches of n steps from the batch source (per
 * input mode: see ifd_input_batches_per_step), checks each against the program, shards them per the
 * input mode and pushes the shards into the replicas' infeed rings. Errors go to the rendezvous.
 */
#ifndef IFD_INFEED_CONTROLLER_H
#define IFD_INFEED_CONTROLLER_H

#include "core/rendezvous.h"
#include "device/device.h"

typedef struct ifd_infeed ifd_infeed;

typedef struct ifd_infeed_config {
    ifd_device *dev;
    const ifd_program *program;
    ifd_batch_source src;
    ifd_input_mode input_mode;
    ifd_mode mode;
    int64_t batch_size;
    ifd_rendezvous *rv;
    /* Slept once before the first batch; ifd_infeed_stop ends the sleep early. */
    double initial_sleep_secs;
    /* Asked once a step (train, eval), on the infeed thread: who takes the step's program
     * outfeed tensors, IFD_SHARD_* bits (ifd_shard.outfeeds). NULL: nobody. */
    int (*outfeeds_wanted)(void *arg);
    void *outfeeds_arg;
} ifd_infeed_config;

int ifd_infeed_start(ifd_infeed **out, const ifd_infeed_config *cfg);
/* Session thread: the next loop runs n steps. */
int ifd_infeed_signal(ifd_infeed *f, int64_t n);
/* Any thread: batches taken from the source and released unconsumed, because the input ended in
 * the middle of a step that takes several (per-host-v2, per-core). */
int64_t ifd_infeed_dropped(ifd_infeed *f);
/* Any thread: ifd_session_infeed_waiting. */
int ifd_infeed_waiting(ifd_infeed *f, int *replica, int64_t *since_ns);
/* STOP and join (a thread still in its initial sleep wakes at once and ends). */
void ifd_infeed_stop(ifd_infeed *f);
void ifd_infeed_destroy(ifd_infeed *f);

#endif
