/*
 * The ingest's protocol side (host/ingest/: hello, producers, batch_accept, batch_fifo,
 * protocol) without a socket: an ifd_ingest made by hand, and the replies, the connection table
 * and the wake-up that the socket side would provide, recorded instead of sent. For
 * tests/host/test_ingest_producers.c; link it with those files, not with replies.c, conns.c,
 * zmq_transport.c or io_loop.c.
 */
#ifndef IFD_TESTS_FAKE_INGEST_H
#define IFD_TESTS_FAKE_INGEST_H

#include "host/ingest/ingest_internal.h"

#define FAKE_REPLIES_MAX 4096

/* One reply the ingest sent: its type (IFD_MSG_*), the connection, and per type: ERROR's code,
 * seq (NO_SEQ: null), credit and sentence; ACK's seq and count; CREDIT's count; the JSON of
 * WELCOME and BYE. */
typedef struct fake_reply {
    int type;
    uint8_t rid[RID_MAX];
    size_t rid_len;
    int code;
    int64_t seq;
    int64_t credit;
    char text[IFD_ERROR_MSG_MAX];
    json_t *json;
} fake_reply;

typedef struct fake_ingest {
    ifd_ingest *g;
    ifd_daemon_config cfg;
    ifd_program program;
    fake_reply replies[FAKE_REPLIES_MAX];
    int nreplies;
    int frames_freed; /* BATCH messages whose frames fake_batch made were freed */
    int wakes;        /* ifd_ingest_wake calls */
} fake_ingest;

/* The replies' log and the connections' answers, for the whole process (one ingest at a time). */
extern fake_ingest *fake_current;
/* Marks connection rid gone (a liveness probe to it then fails, as libzmq's would) or back.
 * The fake never parks a HELLO: it is answered at once. */
void fake_set_gone(const char *rid, int gone);

/* An ingest for cfg (its run's program, mode, input mode, batch, credit, max_producers...) as
 * ifd_ingest_create would size it, with no socket; fake_ingest_free frees it. */
void fake_ingest_init(fake_ingest *f, const ifd_daemon_config *cfg);
void fake_ingest_free(fake_ingest *f);

/* A message from connection rid (a string), as the transport hands it over. */
void fake_hello(fake_ingest *f, const char *rid, const char *json);
void fake_batch(fake_ingest *f, const char *rid, const ifd_proto_batch *bh, ingest_span *frames,
                int nframes);
void fake_end(fake_ingest *f, const char *rid);

/* The last reply to rid (NULL: none). */
const fake_reply *fake_last(fake_ingest *f, const char *rid);
/* Every batch in the FIFO taken (lane -1: the single FIFO) and released, then (consume) the
 * ACKs sent; returns how many. */
int fake_release(fake_ingest *f, int lane);
int fake_consume(fake_ingest *f, int lane);

#endif
