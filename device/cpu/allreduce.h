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
 *
 * Several hosts (ifd_cpu_allreduce_set_hosts, docs/multihost.md): every replica copies its
 * vector into this host's send block; a barrier; replica 0 all-gathers every host's block (each
 * host's replicas' vectors, one after the other, and a flag) over the hosts' STEP channel; a
 * barrier; each replica sums its chunk over all H x R vectors in global replica order (host 0's
 * replicas, then host 1's, ...); a barrier; each copies the sum back. The order is the one a
 * single host with H x R replicas uses, so the result is bit-identical to it and on every host,
 * whatever the split; the cost is R x n floats a host sends per step instead of n.
 *
 * The flag stops the hosts at the same step: a host whose input ended sends flag 0 (from
 * leave, once) in place of its step, and every host then ends that step with IFD_EEOF.
 */
#ifndef IFD_DEVICE_CPU_ALLREDUCE_H
#define IFD_DEVICE_CPU_ALLREDUCE_H

#include "core/thread.h"
#include <infeed/hosts.h>

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
    /* several hosts */
    const ifd_hosts *hosts; /* NULL: one host */
    float *send;            /* [replicas * n + 1]: this host's vectors and its flag */
    float *gathered;        /* [hosts][replicas * n + 1] */
    float *total;           /* [n] */
    int hosts_done;         /* atomic: this host made its last STEP collective */
    int ended_host;         /* the lowest host whose input ended, -1 while none */
    ifd_error host_err;     /* replica 0's failed collective */
    int64_t host_calls;     /* replica 0's STEP collectives, and the time spent in them (ns) */
    int64_t host_ns;
} ifd_cpu_allreduce;

int ifd_cpu_allreduce_init(ifd_cpu_allreduce *ar, int replicas, int64_t n);
void ifd_cpu_allreduce_fini(ifd_cpu_allreduce *ar);
/* Several hosts: hosts (borrowed) takes part in every run; after init, before the first run.
 * IFD_ENOMEM. */
int ifd_cpu_allreduce_set_hosts(ifd_cpu_allreduce *ar, const ifd_hosts *hosts);
/* Replica r's vector; set before the first run. */
void ifd_cpu_allreduce_bind(ifd_cpu_allreduce *ar, int r, float *buf);
/* Collective, in place: every replica calls it with its own bound vector. IFD_OK, IFD_EEOF or
 * IFD_ESTOPPED; with several hosts, replica 0 may also get the hosts' error (ar->host_err), the
 * others then IFD_ESTOPPED. */
int ifd_cpu_allreduce_run(ifd_cpu_allreduce *ar, int r);
/* A replica whose input ended: peers waiting now or later get IFD_EEOF. Final, like abort: the
 * input does not resume. With several hosts the first call also tells the other hosts, in the
 * STEP collective they are in or about to enter (it blocks until they do, or an abort). */
void ifd_cpu_allreduce_leave(ifd_cpu_allreduce *ar);
/* Any thread: peers waiting now or later get IFD_ESTOPPED. */
void ifd_cpu_allreduce_abort(ifd_cpu_allreduce *ar);

#endif
