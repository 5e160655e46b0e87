/* The benchmarks' batch source: one prebuilt batch handed out for every step (owned by the
 * benchmark, refs 1, never released), so that no producer or allocation is measured. ctx is the
 * batch. */
#ifndef IFD_BENCH_STATIC_SOURCE_H
#define IFD_BENCH_STATIC_SOURCE_H

#include <infeed/infeed.h>

static inline int ifd_bench_static_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    (void)err;
    *out = ctx;
    return IFD_OK;
}

static inline void ifd_bench_static_abort(void *ctx)
{
    (void)ctx;
}

static const ifd_batch_source_ops ifd_bench_static_ops = {.next = ifd_bench_static_next,
                                                          .abort = ifd_bench_static_abort};

#endif
