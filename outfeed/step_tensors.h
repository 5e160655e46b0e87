/*
 * Private to outfeed/: a step's outfeed tensors on the host (the seed's _OutfeedHostCall
 * concatenation). Every replica's outfeed area of one step (ifd_outfeed_rec.outfeed) is
 * concatenated along axis 0 in replica order (broadcast input mode: replica 0's only), then,
 * with several hosts, every host's in rank order, into host buffers sized at start: the memory
 * is bounded by the program's declarations, the replicas, the hosts and the largest shard.
 *
 * The set holds the program's tensors in declaration order, then the runtime's: "loss",
 * "correct", "count" (float32, one value a replica-step) and in train mode "grad_norm",
 * "param_norm", "learning_rate" (float32 [1], one value a step: every mirror and host holds the
 * same bits, so replica 0's is the step's and nothing of them crosses hosts).
 */
#ifndef IFD_OUTFEED_STEP_TENSORS_H
#define IFD_OUTFEED_STEP_TENSORS_H

#include "device/device.h"

#define IFD_OUTFEED_TENSORS_RUNTIME 6
#define IFD_OUTFEED_TENSORS_MAX (IFD_MAX_OUTFEEDS + IFD_OUTFEED_TENSORS_RUNTIME)

typedef struct ifd_outfeed_tensors {
    const ifd_program *program;
    int ntensors;
    const char *names[IFD_OUTFEED_TENSORS_MAX];
    ifd_tensor tensors[IFD_OUTFEED_TENSORS_MAX]; /* the step's, after ifd_outfeed_tensors_step */
    int per_row[IFD_OUTFEED_TENSORS_MAX];        /* 1: a value a row; 0: a value a replica-step */
    int64_t value_bytes[IFD_OUTFEED_TENSORS_MAX];
    unsigned char *bufs[IFD_OUTFEED_TENSORS_MAX];
    int64_t offs[IFD_MAX_OUTFEEDS]; /* the device's layout of a replica's area */
    int64_t max_shard_rows;
    int replicas;
    /* Several hosts: one host's part of a step, packed (its row count and replica-steps, then
     * each exchanged tensor at its largest), sent and received by an all-gather. */
    const struct ifd_hosts *hosts;
    size_t host_bytes;
    unsigned char *send, *recv;
    /* One host: the program's tensors the next step copies (1 each after init; a tensor
     * nobody reads this step keeps its buffer as it was). Several hosts copy all. */
    unsigned char need[IFD_OUTFEED_TENSORS_MAX];
} ifd_outfeed_tensors;

/* Sets up c for program p in mode (train, eval) with replicas replicas of up to max_shard_rows
 * rows each, and hosts (NULL or one: no exchange). IFD_ENOMEM, or IFD_OK. */
int ifd_outfeed_tensors_init(ifd_outfeed_tensors *c, const ifd_program *p, ifd_mode mode,
                             int replicas, int64_t max_shard_rows, const struct ifd_hosts *hosts);
void ifd_outfeed_tensors_fini(ifd_outfeed_tensors *c);

/* One step's records recs[0..n) (n: the replicas whose tensors count, 1 in broadcast mode) into
 * c->tensors, a record of a padding batch (from.padding: eval on several hosts) left out; with
 * several hosts, every host's in rank order (a collective on the OUTFEED channel: every host calls
 * it at every step; stop as in ifd_hosts_ops). */
int ifd_outfeed_tensors_step(ifd_outfeed_tensors *c, const ifd_outfeed_rec *recs, int n,
                             int (*stop)(void *), void *stop_arg, ifd_error *err);

/* Tensor i's dtype and the shape of one of its values (without the batch axis: [] for the
 * runtime's and for a scalar a row). */
void ifd_outfeed_tensors_row(const ifd_outfeed_tensors *c, int i, ifd_dtype *dt, ifd_shape *row);
/* "x, y, loss, ..." : every tensor's name, for sentences. */
const char *ifd_outfeed_tensors_names(const ifd_outfeed_tensors *c, char *buf, size_t len);

/* The index of the tensor named name, or -1. */
int ifd_outfeed_tensors_find(const ifd_outfeed_tensors *c, const char *name);

#endif
