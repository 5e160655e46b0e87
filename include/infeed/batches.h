/*
 * libinfeed: host batches and the batch sources a session takes them from (part of
 * infeed/infeed.h, which includes it).
 */
#ifndef IFD_BATCHES_H
#define IFD_BATCHES_H

#include <infeed/error.h>
#include <infeed/program.h> /* IFD_MAX_INPUTS */
#include <infeed/tensor.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IFD_BATCH_STOP 0x1u /* stopping signal (predict mode): the device loop ends on it */
/* rows [valid_rows, rows) are padding (predict mode; in eval mode a batch of padding only, which
 * the eval during training of several hosts steps through: its rows count nowhere) */
#define IFD_BATCH_PADDED 0x2u
/* Its float32 tensors are in host memory registered with the session's device
 * (ifd_session_register_host_memory): the cuda backend copies them to the device directly,
 * without staging them in its own pinned buffers. */
#define IFD_BATCH_PINNED 0x4u
/* The source checked it with ifd_program_check_batch for the session's program, mode and rows
 * (infeedd's ingest does, before it accepts a batch): the infeed does not check it again. */
#define IFD_BATCH_CHECKED 0x8u

/*
 * A host batch: one tensor per program input, all with `rows` rows. The batch does not own the
 * tensors' bytes; release(batch, release_arg) is called exactly once, from whichever thread
 * drops the last reference, when every replica has consumed its shard (or the run dropped the
 * batch unconsumed at its end). After that the bytes may be reused.
 */
typedef struct ifd_batch ifd_batch;
struct ifd_batch {
    int64_t seq;
    int64_t rows;
    uint32_t flags;
    /* The padding mask, read only with IFD_BATCH_PADDED: rows [0, valid_rows) are real, the rest
     * padding whose predictions are dropped. */
    int64_t valid_rows;
    /* per-core input: the replica the batch is for (the source sets it); unused otherwise. */
    int replica;
    /* The source's own pointer, untouched by the runtime and carried into the copy it makes of a
     * padded batch (so a prediction sink can find the source's batch). */
    void *user;
    int ntensors;
    ifd_tensor tensors[IFD_MAX_INPUTS];
    const char *producer; /* for error sentences; may be NULL */
    void (*release)(ifd_batch *b, void *arg);
    void *release_arg;
    int refs; /* managed by the runtime */
};

/* Initialises the bookkeeping fields; the caller fills seq, rows, tensors, release. */
void ifd_batch_init(ifd_batch *b);

typedef struct ifd_batch_source_ops {
    /* Infeed thread: the next batch. Blocks. IFD_OK, IFD_EEOF at the end of the input,
     * IFD_ESTOPPED after abort, or an error with err filled. */
    int (*next)(void *ctx, ifd_batch **out, ifd_error *err);
    /* Required. Any thread: make a blocked or later next() return IFD_ESTOPPED. Must not
     * block. */
    void (*abort)(void *ctx);
    /* Optional: as next, but IFD_ETIMEDOUT at once when no batch is ready. The infeed uses it to
     * hand the replicas what it has queued before it blocks on the source. */
    int (*try_next)(void *ctx, ifd_batch **out, ifd_error *err);
    /* per-core input: required (the session refuses a per-core source without it). As next, but
     * the next batch of replica's own stream, in the order that stream's batches arrived;
     * b->replica == replica. IFD_EEOF once the input ended and that stream is empty. The other
     * modes never call it. */
    int (*next_for)(void *ctx, int replica, ifd_batch **out, ifd_error *err);
    /* Optional, per-core input: as next_for, but IFD_ETIMEDOUT at once when none is ready. */
    int (*try_next_for)(void *ctx, int replica, ifd_batch **out, ifd_error *err);
} ifd_batch_source_ops;

typedef struct ifd_batch_source {
    const ifd_batch_source_ops *ops;
    void *ctx;
} ifd_batch_source;

/* A bounded queue as a batch source: producers push, closing ends the input. */
typedef struct ifd_batch_queue ifd_batch_queue;
int ifd_batch_queue_create(ifd_batch_queue **out, size_t capacity);
/* per-core input: one FIFO per replica, each bounded by capacity, so a full replica's FIFO never
 * blocks a push for another replica. push routes a batch by b->replica (IFD_EINVAL when it is
 * not in [0, replicas)); the source has next_for and try_next_for, and its next fails with
 * IFD_EINVAL. A queue made with ifd_batch_queue_create is a one-replica queue of this kind for
 * next_for (replica 0). */
int ifd_batch_queue_create_per_replica(ifd_batch_queue **out, size_t capacity, int replicas);
/* Frees the queue, releasing batches still inside. */
void ifd_batch_queue_destroy(ifd_batch_queue *q);
/* Blocks while full. IFD_OK, IFD_ECLOSED after close, IFD_ESTOPPED after the run aborted (the
 * batch is not taken: the caller still owns it). */
int ifd_batch_queue_push(ifd_batch_queue *q, ifd_batch *b);
/* The end of the input: the run ends after the batches already queued. */
void ifd_batch_queue_close(ifd_batch_queue *q);
ifd_batch_source ifd_batch_queue_source(ifd_batch_queue *q);
/* Batches queued, over every replica's FIFO. */
size_t ifd_batch_queue_len(ifd_batch_queue *q);
/* Batches queued for replica (0 for a replica out of range). */
size_t ifd_batch_queue_len_for(ifd_batch_queue *q, int replica);

#ifdef __cplusplus
}
#endif

#endif
