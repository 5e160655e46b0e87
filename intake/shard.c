/* One step's shards per input mode (the seed's per-host, per-host v2, per-core and broadcast
 * enqueue_ops_fn). Shards are row views into the batches: nothing is copied. */
#include "intake/shard.h"

static int shard_per_host(ifd_batch *b, int replicas, ifd_shard *out, ifd_error *err)
{
    if (b->rows % replicas != 0)
        return ifd_error_set(err, IFD_ESHAPE,
                             "per-host input: a batch of %lld rows cannot be split evenly over "
                             "%d replicas",
                             (long long)b->rows, replicas);
    int64_t per = b->rows / replicas;
    for (int r = 0; r < replicas; r++) {
        out[r].batch = b;
        out[r].row0 = per * r;
        out[r].rows = per;
    }
    return IFD_OK;
}

static void shard_broadcast(ifd_batch *b, int replicas, ifd_shard *out)
{
    for (int r = 0; r < replicas; r++) {
        out[r].batch = b;
        out[r].row0 = 0;
        out[r].rows = b->rows;
    }
}

/* per-host-v2 and per-core: batch r, whole, to replica r; replica 0's stopping signal for all
 * (a replica that stopped alone would leave the others' steps waiting for it). */
static int shard_one_each(ifd_input_mode mode, ifd_batch *const *bs, int replicas, ifd_shard *out,
                          ifd_error *err)
{
    if (bs[0]->flags & IFD_BATCH_STOP) {
        shard_broadcast(bs[0], replicas, out);
        return IFD_OK;
    }
    for (int r = 1; r < replicas; r++)
        bs[r]->flags &= ~IFD_BATCH_STOP;
    for (int r = 0; r < replicas; r++) {
        if (mode == IFD_INPUT_PER_CORE && bs[r]->replica != r)
            return ifd_error_set(err, IFD_EINVAL,
                                 "per-core input: batch %lld came for replica %d but says replica "
                                 "%d",
                                 (long long)bs[r]->seq, r, bs[r]->replica);
        out[r].batch = bs[r];
        out[r].row0 = 0;
        out[r].rows = bs[r]->rows;
    }
    return IFD_OK;
}

int ifd_shard_step(ifd_input_mode mode, ifd_batch *const *bs, int nbatches, int replicas,
                   ifd_shard *out, ifd_error *err)
{
    int want = ifd_input_batches_per_step(mode, replicas);
    if (replicas < 1 || want < 1)
        return ifd_error_set(err, IFD_EINVAL, "input mode %d with %d replicas", (int)mode,
                             replicas);
    if (nbatches != want)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s input: a step takes %d batches with %d replicas, got %d",
                             ifd_input_mode_name(mode), want, replicas, nbatches);
    switch (mode) {
    case IFD_INPUT_PER_HOST:
        return shard_per_host(bs[0], replicas, out, err);
    case IFD_INPUT_PER_HOST_V2:
    case IFD_INPUT_PER_CORE:
        return shard_one_each(mode, bs, replicas, out, err);
    case IFD_INPUT_BROADCAST:
        shard_broadcast(bs[0], replicas, out);
        return IFD_OK;
    }
    return ifd_error_set(err, IFD_EINVAL, "input mode %d is unknown", (int)mode);
}
