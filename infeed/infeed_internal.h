/*
 * The infeed controller thread (the seed's _run_infeed): for each loop signal n, it takes n
 * batches from the batch source, checks each against the program, shards it per the input mode
 * and pushes the shards into the replicas' infeed rings. Errors go to the rendezvous.
 */
#ifndef IFD_INFEED_INTERNAL_H
#define IFD_INFEED_INTERNAL_H

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
} ifd_infeed_config;

int ifd_infeed_start(ifd_infeed **out, const ifd_infeed_config *cfg);
/* Session thread: the next loop needs n batches. */
int ifd_infeed_signal(ifd_infeed *f, int64_t n);
/* STOP and join (a thread still in its initial sleep wakes at once and ends). */
void ifd_infeed_stop(ifd_infeed *f);
void ifd_infeed_destroy(ifd_infeed *f);

/* Checks a batch against the program's inputs: tensor count, dtypes, per-row shapes, the same
 * row count everywhere and, when batch_size > 0, rows == batch_size; then the program's own
 * check. The sentence names the tensor, the expected and the received value. */
int ifd_infeed_check_batch(const ifd_program *p, const ifd_batch *b, int64_t batch_size,
                           ifd_error *err);

/* Splits b into one shard per replica. per-host: rows / replicas consecutive rows each, no copy;
 * rows not divisible by replicas is IFD_ESHAPE naming both numbers. Other modes: IFD_ENOTSUP
 * for now. */
int ifd_shard_batch(ifd_input_mode mode, ifd_batch *b, int replicas, ifd_shard *out,
                    ifd_error *err);

#endif
