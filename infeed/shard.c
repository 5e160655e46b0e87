#include "infeed/infeed_internal.h"

static int shard_per_host(ifd_batch *b, int replicas, ifd_shard *out, ifd_error *err)
{
    if (replicas < 1 || b->rows % replicas != 0)
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

int ifd_shard_batch(ifd_input_mode mode, ifd_batch *b, int replicas, ifd_shard *out, ifd_error *err)
{
    switch (mode) {
    case IFD_INPUT_PER_HOST:
        return shard_per_host(b, replicas, out, err);
    default:
        return ifd_error_set(err, IFD_ENOTSUP, "input mode '%s' is not implemented yet",
                             ifd_input_mode_name(mode));
    }
}
