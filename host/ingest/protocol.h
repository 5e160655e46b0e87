/*
 * The ingest protocol's rules (docs/protocol.md), with no socket in them: a HELLO's JSON and
 * schema, a BATCH's header and tensor bytes, sequence numbers and duplicates, and the tensor
 * views of an accepted batch. Everything here works on byte spans and returns a code with the
 * sentence docs/protocol.md promises ("batch 17 from producer 'loader-0': ..."), so the unit
 * tests (tests/host/test_ingest_protocol.c) check every rule without a socket, and a transport
 * (ZeroMQ frames in zmq_transport.c, shared-memory slots in shm_transport.c) only turns what it
 * received into spans.
 *
 * Thread: whoever holds the ingest_proto. The daemon's is written once, by ifd_ingest_start
 * (ingest_proto_attach) before the I/O thread starts, and only read after that (by the I/O
 * thread); the functions keep no state of their own.
 */
#ifndef IFD_HOST_INGEST_PROTOCOL_H
#define IFD_HOST_INGEST_PROTOCOL_H

#include "core/wire.h"
#include <infeed/infeed.h>

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes a transport received (a frame, a pool slot): borrowed. */
typedef struct ingest_span {
    const void *data;
    size_t len;
} ingest_span;

/* What the protocol knows of the run: the program's inputs a batch carries in this mode, the
 * rows a batch must have, the steps a message may carry and the credit. */
typedef struct ingest_proto {
    const ifd_program *program; /* NULL until attached */
    ifd_mode mode;
    ifd_input_mode input_mode;
    int replicas;
    int64_t batch_size; /* the global batch (config) */
    int64_t batch_rows; /* rows every batch must have (ifd_input_batch_rows) */
    int max_steps;      /* steps a BATCH may carry (max_steps_per_message; predict: 1) */
    int credit;         /* per producer */
    int check_finite;
    double max_abs_input;
    /* the program inputs a batch carries in this mode (predict: no labels), in frame order */
    int nin;
    const ifd_input_spec *in[IFD_MAX_INPUTS];
} ingest_proto;

/* The program's inputs for the mode (pr's other fields are the caller's). */
void ingest_proto_attach(ingest_proto *pr, const ifd_program *program);

/* ---- HELLO ---------------------------------------------------------------------------------- */

/* A HELLO's fields; strings and schema borrowed from the JSON root ingest_hello_parse returns. */
typedef struct ingest_hello {
    const char *name; /* NULL: none given */
    int64_t first_seq;
    int replica; /* per-core: the replica it feeds; -1 otherwise */
    int want_shm;
    int eval;       /* "role": "eval" (else "train", the default) */
    json_t *schema; /* NULL or null: the program's */
} ingest_hello;

/* Parses and checks a HELLO's JSON frame (the size, the JSON, the keys through json_unpack_ex
 * with JSON_STRICT, each key's type and range, the replica for the input mode, the schema
 * against the program). IFD_OK with *root (the caller's to json_decref) and h filled, or the
 * code with e's sentence ("HELLO: first_seq: expected an integer >= 0, got -1") and *root NULL. */
int ingest_hello_parse(const ingest_proto *pr, ingest_span json, json_t **root, ingest_hello *h,
                       ifd_error *e);
/* The schema check alone: NULL or null is the program's (IFD_OK). */
int ingest_schema_check(const ingest_proto *pr, json_t *schema, ifd_error *e);
/* The program's inputs as a HELLO's schema (WELCOME's "schema"): a new reference. */
json_t *ingest_schema_json(const ingest_proto *pr);

/* ---- messages ------------------------------------------------------------------------------- */

/* A producer's message: frame 0's header and the frame count for its type. `total` counts the
 * frames after the routing id. IFD_OK with *type set, or IFD_EPROTO with the sentence. */
int ingest_message_check(ingest_span header, int total, int *type, ifd_error *e);

/* ---- BATCH ---------------------------------------------------------------------------------- */

/* The steps a BATCH of `rows` carries, which is what it costs in credit: k when rows is
 * k x batch_rows with 1 < k <= max_steps (train, eval), else 1. */
int ingest_batch_steps(const ingest_proto *pr, int64_t rows);
/* Tensor i's bytes in a message of `rows`. */
size_t ingest_tensor_bytes(const ingest_proto *pr, int i, int64_t rows);
/* The checks of a BATCH that need no producer state, in docs/protocol.md's order: the header's
 * ntensors against the frames (EPROTO) and the schema (ESHAPE), flags (EINVAL), rows (ESHAPE),
 * each frame's bytes (ESHAPE), seq >= 0 and seq + k - 1 representable (EINVAL). frames NULL: a
 * BATCH_SHM (its tensors are in a pool: no ntensors, no frames). IFD_OK, or the code with the
 * sentence (without the "batch N from producer 'x': " its caller adds) in msg. */
int ingest_batch_check(const ingest_proto *pr, const ifd_proto_batch *bh, int k,
                       const ingest_span *frames, int nframes, char *msg, size_t len);

/* What a BATCH's seq means for a producer whose highest accepted seq is last_seq and highest
 * acknowledged acked_seq (docs/protocol.md, "Duplicates"). */
typedef enum {
    INGEST_SEQ_NEW,          /* take it (its first *skip steps were taken before) */
    INGEST_SEQ_DUP_ACKED,    /* all taken and consumed: ACK its last seq, k credits */
    INGEST_SEQ_DUP_INFLIGHT, /* all taken, not all consumed: CREDIT k now */
} ingest_seq_verdict;
ingest_seq_verdict ingest_seq_classify(int64_t last_seq, int64_t acked_seq, int64_t seq, int k,
                                       int *skip);
/* The sequence number WELCOME's next_seq says after last_seq (it stays at INT64_MAX). */
int64_t ingest_next_seq(int64_t last_seq);

/* The tensors of rows [row0, row0 + rows) of a message whose tensor i starts at data[i]. */
int ingest_view_tensors(const ingest_proto *pr, char *const *data, int64_t row0, int64_t rows,
                        ifd_tensor *out);
/* The program's checks of a whole message (rows from its first): ifd_program_check_batch, then
 * with check_finite the values. */
int ingest_batch_check_values(const ingest_proto *pr, const ifd_batch *whole, ifd_error *e);

/* "[64]" for a per-row shape. */
const char *ingest_dims_format(int rank, const int64_t *dims, char *buf, size_t len);

#endif
