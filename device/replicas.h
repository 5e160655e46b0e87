/*
 * The replica threads every backend runs, whatever its device: one host thread per replica waits
 * for the next loop command, runs n steps, handles the end of input and errors, and hands its
 * result back to run_loop. A backend keeps only what is its own (memory, the step, the rings, the
 * all-reduce) and plugs it in through ifd_replica_ops.
 *
 * Threads: init, start, stop, fini and run_loop are called from the session's thread only (the
 * backend's open, close and run_loop); the callbacks run on the replica's own thread;
 * ifd_replicas_fail, ifd_replicas_abort, ifd_replicas_aborted, ifd_replicas_publish_step,
 * ifd_replicas_global_step and ifd_replicas_stats from any thread.
 *
 * Waiting for a loop command: a backend whose loops follow each other within microseconds (cpu)
 * sets spin_ns so that the replica polls before it sleeps on the condition variable (see
 * IFD_SPIN_NS in core/thread.h); one whose replica threads must not burn a core (cuda) sets 0.
 */
#ifndef IFD_DEVICE_REPLICAS_H
#define IFD_DEVICE_REPLICAS_H

#include "core/thread.h"
#include "device/device.h"

typedef struct ifd_replicas ifd_replicas;

/* A replica's shared part. It must be the first member of the backend's replica struct: the
 * callbacks get this pointer and cast it back. */
typedef struct ifd_replica {
    int index;
    char name[24]; /* "replica <index>": the source named to on_error */
    ifd_replicas *set;
    ifd_thread thread;
    /* The current loop's error: the step writes it, the replica thread reports it. */
    ifd_error err;
    /* Cumulative counters (ifd_device_stats): one writer each (ifd_replica_stats_add; the loop
     * clock: the replica thread); any reader. */
    ifd_device_stats stats;
    int in_loop; /* atomic: between taking a loop command and reporting its result */
    /* The result of the last loop, guarded by set->mu. */
    int64_t done_steps;
    int status;
} ifd_replica;

/*
 * What a backend does at each point of a replica thread's life. Every callback runs on the
 * replica's thread. A loop is: loop_begin, step for i = 0, 1, ... while it returns IFD_OK and
 * i < n, loop_end, then input_ended or the error report.
 */
typedef struct ifd_replica_ops {
    /* Once when the thread starts, before its first loop (cuda: cudaSetDevice). A failure is
     * every loop's result, reported as a replica error. NULL: nothing to do. */
    int (*thread_init)(ifd_replica *rep, ifd_error *err);
    /* The loop began at start_ns (ifd_clock_ns), before its first step. NULL: nothing to do. */
    void (*loop_begin)(ifd_replica *rep, int64_t start_ns);
    /* Step i of the loop (from 0). IFD_OK; IFD_EEOF: the step did not complete because the
     * input ended (this replica's, or a peer's at this step); IFD_ESTOPPED (the device was
     * aborted); or an error with rep->err filled. */
    int (*step)(ifd_replica *rep, int64_t i);
    /* After the last step tried: rc is its result (IFD_OK after n steps), done the steps done.
     * Returns the loop's result, rc or a new error (filling rep->err). */
    int (*loop_end)(ifd_replica *rep, int rc, int64_t done);
    /* The loop ended with IFD_EEOF: peers and the outfeed thread must learn that this replica
     * will step no more (leave the all-reduce, close the outfeed ring). */
    void (*input_ended)(ifd_replica *rep);
} ifd_replica_ops;

struct ifd_replicas {
    ifd_device *dev;
    const ifd_replica_ops *ops;
    unsigned char *reps; /* the backend's replica array */
    size_t rep_size;
    int n;
    int64_t spin_ns;
    ifd_mutex mu;
    ifd_cond cmd_cv;
    ifd_cond done_cv;
    int64_t generation; /* atomic reads, written under mu: the loop command */
    int64_t loop_n;
    int ndone; /* replicas done with the current loop */
    int quit;
    int aborted;   /* atomic */
    int64_t gstep; /* atomic: the global step as replica 0 last published it */
};

/*
 * Sets up the machinery for dev's cfg.replicas replicas; reps is the backend's zeroed array of
 * replica structs, rep_size bytes each, each beginning with an ifd_replica (filled here: index,
 * name, set). A replica thread waiting for the next loop command spins up to spin_ns
 * (ifd_spin_until) before it sleeps; 0 sleeps at once. Allocates nothing; fini undoes it.
 */
void ifd_replicas_init(ifd_replicas *set, ifd_device *dev, void *reps, size_t rep_size,
                       const ifd_replica_ops *ops, int64_t spin_ns);
/* Stops the started threads (ifd_replicas_stop) and releases the locks. */
void ifd_replicas_fini(ifd_replicas *set);

static inline ifd_replica *ifd_replicas_at(ifd_replicas *set, int r)
{
    return (ifd_replica *)(set->reps + (size_t)r * set->rep_size);
}

/* Starts replica r's thread, named thread_name. IFD_OK or IFD_ENOMEM (the caller says which). */
int ifd_replicas_start(ifd_replicas *set, int r, const char *thread_name);
/* Tells every started thread to quit and joins it; idempotent. Threads quit between loops. */
void ifd_replicas_stop(ifd_replicas *set);

/*
 * Vtable entries (device.h) for a backend whose private block (dev->priv) begins with its
 * ifd_replicas.
 *
 * run_loop wakes every replica for n steps and waits until all are done. Returns the most telling
 * result, in this rank: a real error (err is its replica's), IFD_ESTOPPED, IFD_EEOF ("the input
 * ended after d of n steps"), IFD_OK. *steps_done is the fewest steps any replica completed.
 * IFD_ESTOPPED at once after an abort.
 */
int ifd_replicas_run_loop(ifd_device *dev, int64_t n, int64_t *steps_done, ifd_error *err);
/* The last step published (ifd_replicas_publish_step); never blocks. */
int64_t ifd_replicas_global_step(ifd_device *dev);
/* Replica r's counters (ifd_replica_stats_add) and in_loop; the ring fields are 0 (a backend's
 * stats fills them after calling this). Never blocks. */
void ifd_replicas_stats(ifd_device *dev, int r, ifd_device_stats *out);

/*
 * A real error from any thread of the backend (a replica, the infeed, the outfeed), named by
 * source: makes err's code rc (with rc's text if err holds another code), reports it through
 * cfg.on_error and aborts the device (dev->be->abort): an error ends the run, and peers may be
 * waiting for the failed thread in the all-reduce whether or not anyone listens to on_error.
 */
void ifd_replicas_fail(ifd_replicas *set, const char *source, ifd_error *err, int rc);

/* Marks the set aborted: run_loop returns IFD_ESTOPPED from now on. The backend's abort calls it
 * and then wakes its own rings. */
static inline void ifd_replicas_abort(ifd_replicas *set)
{
    __atomic_store_n(&set->aborted, 1, __ATOMIC_RELEASE);
}

static inline int ifd_replicas_aborted(ifd_replicas *set)
{
    return __atomic_load_n(&set->aborted, __ATOMIC_ACQUIRE);
}

/* The global step moves forward only: step is published if it is past the current one. */
void ifd_replicas_publish_step(ifd_replicas *set, int64_t step);

/*
 * A replica's float memory, one block in either backend's memory: params, grads, slot0, slot1 (np
 * floats each, np = the program's nparam_floats) and the workspace for max_shard_rows rows.
 * mem_floats is the block's size (one more float, so that it is never empty); carve points st's
 * vectors into mem (pointer arithmetic only: mem may be device memory). st's step counters are
 * the backend's.
 */
int64_t ifd_replica_mem_floats(const ifd_device_config *cfg);
void ifd_replica_mem_carve(ifd_replica_state *st, float *mem, int64_t np);
/* The parameters every replica starts from (host memory): cfg->init_params when set, else the
 * program's initialisation from cfg->seed, written into scratch (nparam_floats floats). */
const float *ifd_replica_initial_params(const ifd_device_config *cfg, float *scratch);
/* Floats of optimizer slots a replica's state has: ifd_optimizer_slots(kind) x nparam_floats,
 * contiguous from st->slot0 (slot1 follows slot0 in the block). */
int64_t ifd_replica_slot_floats(const ifd_device_config *cfg);

/* Prefixes rep->err with the step that failed: "step G" with the global step it was to make
 * (train: global_step + 1), or "eval step k" / "predict step k" with its number in this run
 * (run_step + 1), since those modes leave the global step where it is. */
void ifd_replica_step_error(ifd_replica *rep, ifd_mode mode, int64_t global_step, int64_t run_step);

/* Adds to a replica's counters; only one thread per replica may call it (cpu: the replica's,
 * cuda: the outfeed thread), so a plain load and store suffices. */
static inline void ifd_replica_stats_add(ifd_replica *rep, int64_t steps, int64_t loop_ns,
                                         int64_t infeed_wait_ns, int64_t outfeed_wait_ns)
{
    int64_t *f[4] = {&rep->stats.steps, &rep->stats.loop_ns, &rep->stats.infeed_wait_ns,
                     &rep->stats.outfeed_wait_ns};
    int64_t v[4] = {steps, loop_ns, infeed_wait_ns, outfeed_wait_ns};
    for (int i = 0; i < 4; i++)
        __atomic_store_n(f[i], __atomic_load_n(f[i], __ATOMIC_RELAXED) + v[i], __ATOMIC_RELAXED);
}

#endif
