/*
 * Private to infeed/: how the infeed thread turns a step's batches into the replicas' shards
 * (intake/shard.c) and pads predict mode's batches (intake/pad.c).
 */
#ifndef IFD_INFEED_SHARD_H
#define IFD_INFEED_SHARD_H

#include "device/device.h"

/* Predict mode. A new batch of `rows` rows: b's rows, then zeros, with IFD_BATCH_PADDED and
 * valid_rows = b's real rows; it holds a reference on b until it is released, and is returned
 * with one reference, the caller's. */
int ifd_infeed_pad_batch(const ifd_program *p, ifd_mode mode, ifd_batch *b, int64_t rows,
                         ifd_batch **out, ifd_error *err);
/* Predict mode: the batch appended at the end of input, `rows` rows of zeros with IFD_BATCH_STOP
 * (and no valid rows), with one reference, the caller's. */
int ifd_infeed_stop_batch(const ifd_program *p, ifd_mode mode, int64_t rows, ifd_batch **out,
                          ifd_error *err);

/* Eval mode, several hosts (host/eval_hook.c): a batch of `rows` rows of zeros that are all
 * padding (IFD_BATCH_PADDED, valid_rows 0, IFD_BATCH_CHECKED), with no reference (as a batch
 * source hands one out), freed when its last reference goes. Its steps count no row: the
 * outfeed leaves a shard of it out of the metrics and tensors (ifd_batch_tag.padding). */
int ifd_infeed_padding_batch(const ifd_program *p, ifd_mode mode, int64_t rows, ifd_batch **out,
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
