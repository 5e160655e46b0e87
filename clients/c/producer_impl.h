/*
 * The producer's state, shared by the files of the C client's producer: producer.c (lifecycle,
 * HELLO, accessors), reply.c (decoding the daemon's replies, receiving) and send.c (BATCH, credit,
 * END, BYE). Not installed.
 */
#ifndef IFD_CLIENT_PRODUCER_IMPL_H
#define IFD_CLIENT_PRODUCER_IMPL_H

#include "infeed/client.h"

#include "clients/c/producer_internal.h"
#include "clients/c/wire.h"

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
};

/* Queues an ERROR reply to be returned once (ifdp_pop_error returns the oldest). */
int ifdp_push_error(ifd_producer *p, int code, const char *msg);
/* Reads one reply if one arrives within timeout_ms (0: only if one is there). IFD_OK when one
 * was handled, IFD_ETIMEDOUT when none came, another code for a socket failure. */
int ifdp_recv_one(ifd_producer *p, long timeout_ms, ifd_error *err);
/* Handles every reply already received, without waiting. */
int ifdp_drain(ifd_producer *p, ifd_error *err);

#endif
