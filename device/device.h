/*
 * The device backend vtable. A backend runs R replicas, each with a mirror of the parameters, a
 * bounded infeed ring of shards and a bounded outfeed ring of step records, and runs device
 * loops of n steps on every replica. The core allocates the backend's private block (priv_size)
 * and calls through the inline wrappers below (nng's protocol ops, curl's TLS backends).
 *
 * Threads and blocking, per operation:
 * - open, close, run_loop, read_state: the session's thread only, never concurrently, and
 *   read_state only between loops (no run_loop in progress).
 * - infeed_enqueue, infeed_flush, infeed_end: the infeed controller thread only.
 * - outfeed_dequeue: the outfeed controller thread only.
 * - global_step, stats, abort: any thread, never block.
 *
 * - infeed_enqueue blocks while the replica's ring is full (back-pressure to the infeed thread),
 *   and takes a reference on shard->batch that the backend drops once the replica's step no
 *   longer reads the shard (cpu: after the step; cuda: after the host-to-device copy); in
 *   predict mode the reference goes on with the step's outfeed record instead, and the outfeed
 *   thread drops it after routing the predictions.
 * - infeed_flush: the infeed thread will not enqueue again soon (its loop's shards are all in, or
 *   it is about to wait for the batch source): hand what is queued to the replicas now. A backend
 *   may hold shards back until then to wake its replicas in bursts.
 * - run_loop(n) returns once every replica has finished n steps (cuda: enqueued them and waited
 *   for the last, never for each); within the loop the host never waits on a replica's step.
 *   IFD_EEOF when the infeed ended (infeed_end) before n steps: *steps_done says how many were
 *   completed on every replica.
 * - outfeed_dequeue blocks until replica's next step record is ready. IFD_EEOF once the infeed
 *   ended and every completed step was dequeued.
 * - abort makes every blocked and later call return IFD_ESTOPPED; it is how the error
 *   rendezvous stops a run within a bounded time.
 * - A replica thread that fails reports through cfg.on_error before its run_loop returns, so
 *   the rendezvous can stop the other threads at once, and aborts the device itself (an error
 *   ends the run), so peers waiting for it in the all-reduce never hang.
 */
#ifndef IFD_DEVICE_DEVICE_H
#define IFD_DEVICE_DEVICE_H

#include "core/batch.h"
#include "device/step.h"
#include <infeed/infeed.h>

typedef struct ifd_device ifd_device;

/* A replica's part of a host batch: rows [row0, row0 + rows) of every tensor. */
typedef struct ifd_shard {
    ifd_batch *batch;
    int64_t row0;
    int64_t rows;
    /* Train, eval: IFD_SHARD_OUTFEEDS when someone takes this step's program outfeed tensors
     * (a host call, a tensor sink that wants them now): the step gets ifd_step_args.outfeeds
     * and its record the area; without it the step gets NULL and writes none (no op, no copy)
     * and the record carries no area. IFD_SHARD_TO_SINKS too when a tensor sink takes them
     * (the record's to_sinks). The infeed decides once a step, so every replica's shard of a
     * step says the same. */
    int outfeeds;
} ifd_shard;

enum { IFD_SHARD_OUTFEEDS = 1, IFD_SHARD_TO_SINKS = 2 };

/* Which batch a shard came from, kept with the step's record so that a skipped step can name the
 * batch whose loss was not finite (the batch itself is released before that). */
typedef struct ifd_batch_tag {
    char producer[48]; /* "" when the source names none */
    int64_t seq;
    int padding; /* every row of the batch is padding (IFD_BATCH_PADDED, valid_rows 0) */
} ifd_batch_tag;

void ifd_batch_tag_set(ifd_batch_tag *t, const ifd_batch *b);

/* One step's outfeed from one replica, copied to the host, with the host-side timing of the
 * step (monotonic ns, ifd_clock_ns), so that rates are computed from when steps ran rather than
 * from when the outfeed thread got to them. */
typedef struct ifd_outfeed_rec {
    int64_t step; /* the global step after this step (eval, predict: the global step) */
    ifd_step_out out;
    ifd_batch_tag from; /* train: the shard's batch */
    /* predict mode: the shard's batch, with a reference the outfeed thread drops after it has
     * delivered the predictions; rows [row0, row0 + rows) of it; and the step's predictions,
     * [rows, predict_cols] floats in host memory owned by the backend (valid until the next
     * outfeed_dequeue of this replica). NULL, 0, NULL in the other modes. */
    ifd_batch *batch;
    int64_t row0, rows;
    const float *pred;
    /* train, eval: the step's outfeed area in host memory owned by the backend (valid until the
     * next outfeed_dequeue of this replica): the program's outfeed tensors at the offsets of
     * ifd_program_outfeed_layout(program, max_shard_rows), per-row ones holding rows rows (rows
     * is the shard's in every mode). NULL when the program declares none, when nobody takes them
     * (the shard's outfeeds 0), and in predict mode. */
    const void *outfeed;
    int to_sinks;    /* the shard's IFD_SHARD_TO_SINKS: the tensor sinks take this step's tensors */
    int64_t end_ns;  /* when the step finished */
    int64_t step_ns; /* since the replica's previous step ended (or its loop began) */
    int64_t infeed_wait_ns;  /* of step_ns, waiting for the shard */
    int64_t outfeed_wait_ns; /* of step_ns, waiting for a free outfeed slot */
} ifd_outfeed_rec;

/* Per-replica counters (cumulative) and the state of its rings (now). */
typedef struct ifd_device_stats {
    int64_t steps;
    int64_t loop_ns;         /* time inside device loops */
    int64_t infeed_wait_ns;  /* of which waiting for a shard */
    int64_t outfeed_wait_ns; /* of which waiting for a free outfeed slot */
    /* The replica thread's own clock of its loops (both backends, counted as each loop ends):
     * loop_run_ns from taking each loop's command to finishing it (cuda: its last step done on
     * the GPU), and of that loop_first_ns until the loop's first step returned (waking up,
     * waiting for the loop's first shard). What is not in loop_first_ns is the loop's steady
     * steps: the session's loop-length tuner reads both. */
    int64_t loop_run_ns, loop_first_ns;
    int in_loop; /* the replica has a loop to run and has not finished it */
    /* Shards staged for the replica and not yet taken by a step (0: a step waits for input),
     * and the ring's size. */
    int64_t infeed_len, infeed_cap;
    /* Step records the outfeed thread has not taken yet (outfeed_cap: the next step waits for
     * the outfeed thread), and the ring's size. */
    int64_t outfeed_len, outfeed_cap;
} ifd_device_stats;

typedef struct ifd_device_config {
    int replicas;
    const ifd_program *program;
    /* train: ifd_step_train; eval: ifd_step_eval (no all-reduce, the global step stays); predict:
     * ifd_step_predict, and a shard whose batch has IFD_BATCH_STOP ends the loop as the end of
     * input does (the stopping signal), without a step. */
    ifd_mode mode;
    int64_t max_shard_rows;
    ifd_optimizer optimizer;
    float loss_scale;
    uint64_t seed;
    int64_t initial_step;
    /* The state every replica starts from (a checkpoint), host memory, read during open only:
     * init_params (nparam_floats) replaces the seed's initialisation; init_slots
     * (ifd_optimizer_slots(optimizer.kind) x nparam_floats floats: slot0, then slot1) and
     * init_opt_step replace zeroed slots and an optimizer count of 0. NULL: as before. */
    const float *init_params;
    const float *init_slots;
    int64_t init_opt_step;
    int infeed_depth;
    int outfeed_depth;
    /* Several hosts: in train mode the all-reduce spans every host's replicas; in eval mode a
     * step's (empty) collective tells every host that one's input ended; predict mode runs per
     * host. NULL: one. */
    const struct ifd_hosts *hosts;
    /* cpu: ifd_config.blas_kernel (device/cpu/blas.h). */
    const char *blas_kernel;
    /* cpu: ifd_config.replica_threads (0: auto; ifd_cpu_replica_threads). */
    int replica_threads;
    /* cuda: ifd_config.cuda_graphs: 1 captures each step in a CUDA Graph, 0 does not. */
    int cuda_graphs;
    void (*on_error)(void *arg, const char *source, const ifd_error *err);
    void *on_error_arg;
} ifd_device_config;

typedef struct ifd_device_backend {
    const char *name;
    size_t priv_size;
    int (*open)(ifd_device *dev, ifd_error *err);
    void (*close)(ifd_device *dev);
    int (*infeed_enqueue)(ifd_device *dev, int replica, const ifd_shard *shard);
    void (*infeed_flush)(ifd_device *dev);
    void (*infeed_end)(ifd_device *dev);
    int (*outfeed_dequeue)(ifd_device *dev, int replica, ifd_outfeed_rec *rec);
    int (*run_loop)(ifd_device *dev, int64_t n, int64_t *steps_done, ifd_error *err);
    /* Copies replica's state to host memory: params (nparam_floats), slots
     * (ifd_optimizer_slots(kind) x nparam_floats, slot0 then slot1) and the optimizer's update
     * count; a NULL destination is skipped. */
    int (*read_state)(ifd_device *dev, int replica, float *params, float *slots, int64_t *opt_step,
                      ifd_error *err);
    int64_t (*global_step)(ifd_device *dev);
    void (*stats)(ifd_device *dev, int replica, ifd_device_stats *out);
    void (*abort)(ifd_device *dev);
    /* Optional (NULL: IFD_ENOTSUP), any thread: host memory that batches will live in, registered
     * so that they can be copied to the device directly (IFD_BATCH_PINNED), and unregistered. */
    int (*host_register)(ifd_device *dev, void *p, size_t len, ifd_error *err);
    void (*host_unregister)(ifd_device *dev, void *p);
} ifd_device_backend;

struct ifd_device {
    const ifd_device_backend *be;
    ifd_device_config cfg;
    void *priv;
};

extern const ifd_device_backend ifd_device_backend_cpu;
extern const ifd_device_backend ifd_device_backend_cuda; /* built with IFD_HAVE_CUDA */

/* Finds the backend by name and opens it. The error names the backend and the known ones. */
int ifd_device_create(ifd_device **out, const char *backend, const ifd_device_config *cfg,
                      ifd_error *err);
void ifd_device_destroy(ifd_device *dev);

static inline int ifd_device_infeed_enqueue(ifd_device *d, int r, const ifd_shard *s)
{
    return d->be->infeed_enqueue(d, r, s);
}
static inline void ifd_device_infeed_flush(ifd_device *d)
{
    d->be->infeed_flush(d);
}
static inline void ifd_device_infeed_end(ifd_device *d)
{
    d->be->infeed_end(d);
}
static inline int ifd_device_outfeed_dequeue(ifd_device *d, int r, ifd_outfeed_rec *rec)
{
    return d->be->outfeed_dequeue(d, r, rec);
}
static inline int ifd_device_run_loop(ifd_device *d, int64_t n, int64_t *done, ifd_error *err)
{
    return d->be->run_loop(d, n, done, err);
}
static inline int ifd_device_read_state(ifd_device *d, int r, float *params, float *slots,
                                        int64_t *opt_step, ifd_error *err)
{
    return d->be->read_state(d, r, params, slots, opt_step, err);
}
static inline int ifd_device_read_params(ifd_device *d, int r, float *out, ifd_error *err)
{
    return d->be->read_state(d, r, out, NULL, NULL, err);
}
static inline int64_t ifd_device_global_step(ifd_device *d)
{
    return d->be->global_step(d);
}
static inline void ifd_device_stats_get(ifd_device *d, int r, ifd_device_stats *out)
{
    d->be->stats(d, r, out);
}
static inline int ifd_device_host_register(ifd_device *d, void *p, size_t len, ifd_error *err)
{
    if (d->be->host_register == NULL)
        return ifd_error_set(err, IFD_ENOTSUP, "the %s backend copies batches itself", d->be->name);
    return d->be->host_register(d, p, len, err);
}
static inline void ifd_device_host_unregister(ifd_device *d, void *p)
{
    if (d->be->host_unregister)
        d->be->host_unregister(d, p);
}
static inline void ifd_device_abort(ifd_device *d)
{
    d->be->abort(d);
}
static inline int ifd_device_replicas(const ifd_device *d)
{
    return d->cfg.replicas;
}

#endif
