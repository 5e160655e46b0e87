/*
 * The ingest's ZeroMQ transport (zmq_transport.c): what the I/O loop and the fuzz harness need
 * of it that names libzmq's types. I/O thread only.
 */
#ifndef IFD_HOST_INGEST_ZMQ_TRANSPORT_H
#define IFD_HOST_INGEST_ZMQ_TRANSPORT_H

#include "host/ingest/ingest_internal.h"

#include <zmq.h>

#define MAX_PARTS (IFD_MAX_INPUTS + 2) /* routing id, header, tensors */
#define RECV_BURST 256                 /* messages handled before polling the others again */

/* The message handler (HELLO, BATCH, BATCH_SHM, END; parts[0] is the routing id; the fuzz
 * harness calls it), and one message read (parts beyond MAX_PARTS read and dropped but
 * counted: 0, or -1 with errno, EAGAIN when none waits). */
void ingest_handle_message(ifd_ingest *g, zmq_msg_t *parts, int nparts, int total);
int ingest_recv_message(ifd_ingest *g, zmq_msg_t *parts, int *nparts, int *total);

/* Socket options, each set in turn: IFD_OK, or IFD_EIO with a sentence naming the socket (what),
 * the option, its value and libzmq's reason ("ingest: zmq_setsockopt(ZMQ_SNDHWM, -1): Invalid
 * argument"). wide: an int64_t option (ZMQ_MAXMSGSIZE), else an int. */
typedef struct sockopt {
    int option;
    const char *name;
    int64_t value;
    int wide;
} sockopt;
#define OPT(o, v)                                                                                  \
    {                                                                                              \
        o, #o, (int64_t)(v), 0                                                                     \
    }
#define OPT64(o, v)                                                                                \
    {                                                                                              \
        o, #o, (int64_t)(v), 1                                                                     \
    }
int ingest_socket_options(void *sock, const char *what, const sockopt *opts, int n, ifd_error *err);

#endif
