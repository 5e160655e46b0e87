/*
 * Several hosts training one model: the runtime's view of the other hosts (docs/multihost.md).
 *
 * libinfeed never starts or joins a job itself: the program that embeds it (infeedd, with MPI in
 * host/mpi_hosts.c) fills an ifd_hosts and hands it over in ifd_config.hosts. NULL there, or a
 * size of 1, is one host: no collective is ever called.
 *
 * Every collective is called by every host, in the same order on each channel. Channels are
 * independent of each other (MPI: one communicator each), so the threads that own them never
 * have to agree on an order between them:
 *
 *   IFD_HOSTS_STEP     the replicas' all-reduce: one call per train step, from one replica thread
 *   IFD_HOSTS_LOOP     the session's thread: one call per device loop (its length, stop requests),
 *                      and before the first: the checkpoint hook's positions, the cuda backend's
 *                      ncclUniqueId (broadcast) at open
 *   IFD_HOSTS_OUTFEED  the outfeed thread, then the session's thread at the end: summaries
 *   IFD_HOSTS_STOP     train and eval: the session's stop relay thread, one small all-reduce
 *                      every few tens of milliseconds while the run goes, so that a stop asked
 *                      on one host reaches the others even while their loops wait for input.
 *                      Not latency-critical: an implementation may poll it slowly (MPI: 1 ms)
 *   IFD_HOSTS_EVAL_OUTFEED, IFD_HOSTS_EVAL_STOP
 *                      infeedd's evaluation during training (host/eval_hook.c): its eval
 *                      sessions, run on the train session's thread between loops, use these
 *                      for their OUTFEED and STOP traffic (and the train session's STEP and LOOP
 *                      channels, idle then), since the train session's outfeed thread may still
 *                      be summing its last loop and its stop relay goes on through the run
 *
 * A collective waits for every host. stop(stop_arg) (optional, called while it waits, must not
 * block) returning non-zero gives up the wait with IFD_ESTOPPED: the collective is then left
 * unfinished, and the hosts cannot go on together; the embedding program ends the job (abort).
 */
#ifndef IFD_HOSTS_H
#define IFD_HOSTS_H

#include <infeed/error.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    IFD_HOSTS_STEP = 0,
    IFD_HOSTS_LOOP,
    IFD_HOSTS_OUTFEED,
    IFD_HOSTS_STOP,
    IFD_HOSTS_EVAL_OUTFEED,
    IFD_HOSTS_EVAL_STOP,
    IFD_HOSTS_NCHANNELS
};

typedef enum { IFD_HOSTS_MIN = 0, IFD_HOSTS_MAX, IFD_HOSTS_SUM } ifd_hosts_op;

typedef int (*ifd_hosts_stop_fn)(void *arg);

typedef struct ifd_hosts_ops {
    /* recv (size x bytes) = every host's send (bytes), in rank order. */
    int (*allgather)(void *ctx, int channel, const void *send, void *recv, size_t bytes,
                     ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err);
    /* vals[i] = op over the hosts of vals[i], for i < n, in place. */
    int (*allreduce_i64)(void *ctx, int channel, int64_t *vals, int n, ifd_hosts_op op,
                         ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err);
    /* buf (bytes) = root's buf on every host (root: 0 to size - 1). Optional for the cpu
     * backend; the cuda backend sends rank 0's ncclUniqueId with it. */
    int (*broadcast)(void *ctx, int channel, void *buf, size_t bytes, int root,
                     ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err);
} ifd_hosts_ops;

typedef struct ifd_hosts {
    const ifd_hosts_ops *ops;
    void *ctx;
    int rank; /* this host, 0 to size - 1 */
    int size; /* hosts in the job */
} ifd_hosts;

/* Whether h spans more than one host. */
static inline int ifd_hosts_many(const ifd_hosts *h)
{
    return h != NULL && h->size > 1;
}

#ifdef __cplusplus
}
#endif

#endif
