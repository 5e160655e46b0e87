/* What the in-process benchmarks share: a batch source that hands out one batch again and again
 * (no producer measured), and the median of a few runs. */
#ifndef IFD_BENCH_UTIL_H
#define IFD_BENCH_UTIL_H

#include <infeed/infeed.h>

/* A source whose next is b, every time (b stays the caller's: refs 1, never released). */
ifd_batch_source bench_repeat_source(ifd_batch *b);
/* Sorts v[0..n) and returns its middle element. */
double bench_median(double *v, int n);

#endif
