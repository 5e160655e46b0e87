/*
 * The infeed controller thread (the seed's _run_infeed): for each loop signal n, it takes the
 * batches of n steps from the batch source (per input mode: see ifd_input_batches_per_step),
 * checks each against the program, shards them per the input mode and pushes the shards into the
 * replicas' infeed rings. Errors go to the rendezvous.
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

/* The program inputs a batch carries in mode: all of them, or in predict mode those that are not
 * labels. Writes their indices into p->inputs to idx, in spec order; returns how many. */
int ifd_infeed_mode_inputs(const ifd_program *p, ifd_mode mode, int idx[IFD_MAX_INPUTS]);

/* A batch against the program: ifd_program_check_batch (device/batch_check.h). */

/* Checks the values of b's float32 tensors (those of mode's inputs, in order): every element
 * finite and, when max_abs > 0, of magnitude at most max_abs. IFD_ERANGE names the tensor, the row,
 * the element within the row and the value. One pass over the data; other dtypes are not read
 * (labels are the program's check_batch). */
int ifd_infeed_check_values(const ifd_program *p, const ifd_batch *b, ifd_mode mode, double max_abs,
                            ifd_error *err);

/* Predict mode. A new batch of `rows` rows: b's rows, then zeros, with IFD_BATCH_PADDED and
 * valid_rows = b's real rows; it holds a reference on b until it is released, and is returned
 * with one reference, the caller's. */
int ifd_infeed_pad_batch(const ifd_program *p, ifd_mode mode, ifd_batch *b, int64_t rows,
                         ifd_batch **out, ifd_error *err);
/* Predict mode: the batch appended at the end of input, `rows` rows of zeros with IFD_BATCH_STOP
 * (and no valid rows), with one reference, the caller's. */
int ifd_infeed_stop_batch(const ifd_program *p, ifd_mode mode, int64_t rows, ifd_batch **out,
                          ifd_error *err);

/* One step's shards, one per replica, from the step's nbatches batches (which must be
 * ifd_input_batches_per_step(mode, replicas)), without copying:
 * - per-host: bs[0] split in replicas runs of rows / replicas consecutive rows; rows not
 *   divisible by replicas is IFD_ESHAPE naming both numbers;
 * - per-host-v2: bs[r], whole, to replica r;
 * - per-core: bs[r], whole, to replica r; a batch whose b->replica is not r is IFD_EINVAL;
 *   in both, every replica follows replica 0's stopping signal (the seed's per-host v2): when
 *   bs[0] has IFD_BATCH_STOP every replica gets bs[0] (the other batches are left unconsumed),
 *   and IFD_BATCH_STOP on another batch is cleared;
 * - broadcast: bs[0], whole, to every replica (the same batch R times: each enqueue takes its
 *   own reference).
 * Another nbatches is IFD_EINVAL. */
int ifd_shard_step(ifd_input_mode mode, ifd_batch *const *bs, int nbatches, int replicas,
                   ifd_shard *out, ifd_error *err);

#endif
