/*
 * The cpu backend's all-reduce: a deterministic shared-memory sum. Each replica owns a
 * contiguous chunk of the vector and sums that chunk over all replicas in replica order; every
 * replica then copies the whole sum back, so every mirror gets bit-identical values whatever the
 * thread timing.
 */
#ifndef IFD_DEVICE_CPU_ALLREDUCE_H
#define IFD_DEVICE_CPU_ALLREDUCE_H

#include "core/thread.h"

#include <stdint.h>

typedef struct ifd_cpu_allreduce {
    int replicas;
    int64_t n;
    float **bufs; /* bufs[r]: replica r's vector, fixed at init */
    float *sum;
    ifd_mutex mu;
    ifd_cond cv;
    int arrived;
    int sleepers;
    int64_t generation;
    int state; /* IFD_OK, IFD_EEOF (a replica left: its input ended) or IFD_ESTOPPED */
} ifd_cpu_allreduce;

int ifd_cpu_allreduce_init(ifd_cpu_allreduce *ar, int replicas, int64_t n);
void ifd_cpu_allreduce_fini(ifd_cpu_allreduce *ar);
/* Replica r's vector; set before the first run. */
void ifd_cpu_allreduce_bind(ifd_cpu_allreduce *ar, int r, float *buf);
/* Collective: every replica calls it with its own bound buffer. IFD_OK, IFD_EEOF or
 * IFD_ESTOPPED. */
int ifd_cpu_allreduce_run(ifd_cpu_allreduce *ar, int r);
/* A replica whose input ended: peers waiting now or later get IFD_EEOF. */
void ifd_cpu_allreduce_leave(ifd_cpu_allreduce *ar);
/* Any thread: peers waiting now or later get IFD_ESTOPPED. */
void ifd_cpu_allreduce_abort(ifd_cpu_allreduce *ar);
/* Before a new loop: forget a previous leave. Only while no replica is inside. */
void ifd_cpu_allreduce_reset(ifd_cpu_allreduce *ar);

#endif
