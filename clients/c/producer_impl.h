/*
 * The producer's state, shared by the files of the C client's producer: producer.c (lifecycle,
 * HELLO, accessors), reply.c (decoding the daemon's replies, receiving) and send.c (BATCH, credit,
 * END, BYE). Not installed.
 */
#ifndef IFD_CLIENT_PRODUCER_IMPL_H
#define IFD_CLIENT_PRODUCER_IMPL_H

#include <infeed/client.h>

#include "clients/c/producer_internal.h"
#include "clients/c/shm.h"
#include "clients/c/connection.h"

#include <stdint.h>

#define IFDP_NAME_MAX 63
#define IFDP_MAX_FRAMES 8
/* Daemon messages are small; a larger frame means a wrong peer. */
#define IFDP_MAX_REPLY (1 << 20)

struct ifd_producer {
    void *ctx;
    void *sock;
    ifdw_watch watch; /* the connect timeout, until the first handshake */
    char name[IFDP_NAME_MAX + 1];
    int has_name;
    char endpoint[256];

    /* The last WELCOME. */
    int welcomed;
    char *welcome_json;
    int64_t batch_size;
    int64_t max_steps; /* WELCOME's max_steps_per_message */
    int64_t window;
    int replicas;
    int replica; /* sent in HELLO when >= 0 (per-core input) */
    int eval;    /* HELLO "role": "eval" (ifd_producer_set_role) */
    char mode[32];
    int ntensors;

    /* Flow control since the WELCOME. */
    int64_t next_seq;
    int64_t available;
    int64_t in_flight;
    int64_t sent;
    int64_t acked;
    int64_t rejected;
    int64_t acked_seq;
    int64_t drained_ns; /* when a send last read the replies waiting (ifdw_now_ns) */
    int end_sent;

    /* predict mode: called for each PREDICTION */
    ifd_prediction_fn pred_fn;
    void *pred_arg;
    int64_t predictions;

    /* The BYE, once it came. */
    char *bye_json;
    int bye_ok;
    char bye_text[IFD_ERROR_MSG_MAX];

    /* ERROR replies not returned yet: a FIFO. */
    ifd_error *errs;
    int errs_head, errs_len, errs_cap;

    /* While hello waits: its answer. */
    int hello_waiting;
    int hello_answered;
    ifd_error hello_err;

    /* Shared memory (send_shm.c). */
    int shm_mode;                            /* IFD_SHM_AUTO, _ON, _OFF */
    char scheme[16];                         /* the endpoint's transport: "tcp", "ipc", ... */
    size_t row_bytes[IFD_MAX_INPUTS];        /* of the last HELLO's schema */
    ifdp_shm_desc shm_desc;                  /* the last WELCOME's "shm" */
    char shm_refused_msg[IFD_ERROR_MSG_MAX]; /* the last WELCOME's "shm_refused" */
    char shm_why[IFD_ERROR_MSG_MAX];         /* why no pool is in use, after a HELLO that asked */
    ifdp_pool pool;                          /* base NULL: none mapped */

    /* ifd_producer_buffer until its commit: slots reserved in the pool, or scratch memory. */
    int pending;
    int64_t pending_steps;
    int pending_slot;
    void *scratch[IFD_MAX_INPUTS];
    size_t scratch_cap[IFD_MAX_INPUTS];
};

/* Queues an ERROR reply to be returned once (ifdp_pop_error returns the oldest). */
int ifdp_push_error(ifd_producer *p, int code, const char *msg);
/* Reads one reply if one arrives within timeout_ms (0: only if one is there). IFD_OK when one
 * was handled, IFD_ETIMEDOUT when none came, another code for a socket failure. */
int ifdp_recv_one(ifd_producer *p, long timeout_ms, ifd_error *err);
/* Handles every reply already received, without waiting. */
int ifdp_drain(ifd_producer *p, ifd_error *err);

/* send.c, for send_shm.c. The credit a message of `rows` rows costs (its steps). */
int64_t ifdp_batch_steps(const ifd_producer *p, int64_t rows);
/* How often a send that has credit reads the replies waiting (ACKs, ERROR, BYE) before it sends:
 * each read that finds none costs a poll of libzmq's mailbox, which at 4 KiB batches was the
 * largest part of the producer's CPU beyond a bare ZeroMQ sender (bench_ingest's prod_us). A send
 * without credit, and every wait and end, read them at once. */
#define IFDP_DRAIN_EVERY_NS 1000000
/* Waits until a message of `steps` credits may go and, with need_slots > 0, until need_slots
 * free slots in a row are in the pool (*slot: the first). Returns queued ERRORs, BYE and END. Reads
 * the replies waiting first unless it has credit and read them less than IFDP_DRAIN_EVERY_NS ago.
 */
int ifdp_wait_send(ifd_producer *p, int64_t steps, int need_slots, int *slot, int timeout_ms,
                   ifd_error *err);
/* Sends a header frame (more: tensor frames follow), waiting for the socket to take it. */
int ifdp_send_header(ifd_producer *p, const unsigned char *h, int more, int timeout_ms,
                     ifd_error *err);
/* Counts a message of `rows` rows as sent; the replies wait for the next call (which drains
 * them first). */
int ifdp_after_send(ifd_producer *p, int64_t rows, ifd_error *err);

/* send_shm.c. Sends frames as BATCH_SHM when a pool is mapped and they fit it (1 when it did,
 * with *rc its result), else 0 and nothing done: the caller sends BATCH. */
int ifdp_shm_send(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n, int timeout_ms,
                  int *rc, ifd_error *err);
/* Unmaps the pool and drops a pending buffer (HELLO, destroy). */
void ifdp_shm_drop(ifd_producer *p);
/* After a WELCOME to a HELLO that asked for a pool: maps it. */
int ifdp_shm_attach(ifd_producer *p, ifd_error *err);
/* Whether HELLO asks for a pool: on, or auto with a local endpoint. */
int ifdp_shm_wanted(const ifd_producer *p);

#endif
