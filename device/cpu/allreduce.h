/*
 * The cpu backend's all-reduce: a deterministic shared-memory sum. Every element is summed over
 * the replicas in replica order, so every mirror gets bit-identical values whatever the thread
 * timing, and a run is repeatable.
 *
 * Two schedules, with the same result bits:
 * - small vectors (replicas * n <= IFD_ALLREDUCE_SMALL): each replica copies its vector into a
 *   staging slot, one barrier, then each replica sums all the slots itself. Slots alternate
 *   between two sets call by call, so a slot is rewritten only after every peer has passed the
 *   next barrier, that is, after it finished reading: one barrier per call.
 * - large vectors: each replica owns a contiguous chunk and sums it over the replicas into a
 *   shared vector; a second barrier; every replica copies the whole sum back.
 */
#ifndef IFD_DEVICE_CPU_ALLREDUCE_H
#define IFD_DEVICE_CPU_ALLREDUCE_H

#include "core/thread.h"

#include <stdint.h>

#define IFD_ALLREDUCE_SMALL (1 << 18)

typedef struct ifd_cpu_allreduce {
    int replicas;
    int64_t n;
    int small;
    float **bufs;  /* bufs[r]: replica r's vector, fixed at bind */
    float *stage;  /* small: [2][replicas][n] */
    int64_t *call; /* small: calls made by each replica (picks the staging set) */
    float *sum;    /* large: [n] */
    ifd_mutex mu;
    ifd_cond cv;
    int arrived;        /* atomic */
    int sleepers;       /* atomic; changed under mu */
    int64_t generation; /* atomic */
    int state; /* atomic: IFD_OK, IFD_EEOF (a replica left: its input ended) or IFD_ESTOPPED */
} ifd_cpu_allreduce;

int ifd_cpu_allreduce_init(ifd_cpu_allreduce *ar, int replicas, int64_t n);
void ifd_cpu_allreduce_fini(ifd_cpu_allreduce *ar);
/* Replica r's vector; set before the first run. */
void ifd_cpu_allreduce_bind(ifd_cpu_allreduce *ar, int r, float *buf);
/* Collective, in place: every replica calls it with its own bound vector. IFD_OK, IFD_EEOF or
 * IFD_ESTOPPED. */
int ifd_cpu_allreduce_run(ifd_cpu_allreduce *ar, int r);
/* A replica whose input ended: peers waiting now or later get IFD_EEOF. Final, like abort: the
 * input does not resume. */
void ifd_cpu_allreduce_leave(ifd_cpu_allreduce *ar);
/* Any thread: peers waiting now or later get IFD_ESTOPPED. */
void ifd_cpu_allreduce_abort(ifd_cpu_allreduce *ar);

#endif
