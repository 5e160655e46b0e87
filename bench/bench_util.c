#include "bench/bench_util.h"

static int repeat_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    (void)err;
    *out = ctx;
    return IFD_OK;
}

static void repeat_abort(void *ctx)
{
    (void)ctx;
}

static const ifd_batch_source_ops repeat_ops = {.next = repeat_next, .abort = repeat_abort};

ifd_batch_source bench_repeat_source(ifd_batch *b)
{
    return (ifd_batch_source){&repeat_ops, b};
}

double bench_median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}
