/*
 * The summaries publisher: the PUB socket (--publish) and the thread that owns it. Summaries
 * written to its sink (the outfeed thread) wait in a bounded outbox (OUTBOX_MAX, the oldest
 * dropped) and are sent without blocking: a slow subscriber loses messages. Nothing a subscriber
 * does (a huge or endless subscription, a stalled connection) reaches the ingest's I/O thread,
 * so it never delays a producer's ACKs. The socket is an XPUB, so that the thread reads every
 * subscription with its connection: a connection that makes more than IFD_PUB_SUBS_MAX is
 * closed.
 */
#ifndef IFD_HOST_PUBLISHER_H
#define IFD_HOST_PUBLISHER_H

#include "host/limits.h"
#include "host/monitor.h"
#include "host/security.h"
#include <infeed/infeed.h>

typedef struct ifd_publisher ifd_publisher;

/* Tensor messages queued between loop ends wake the publisher thread once this many bytes (a
 * sixteenth of the outbox's bound) or messages (a quarter of a subscriber's queue, which a burst
 * must not fill) wait, else at the loop's end: one wake-up of the thread, of libzmq's I/O thread
 * and of a subscriber for a loop's messages instead of one each. */
#define IFD_PUB_TENSOR_WAKE_BYTES (IFD_PUB_TENSOR_OUTBOX_BYTES / 16)
#define IFD_PUB_TENSOR_WAKE_MESSAGES (IFD_PUB_SNDHWM / 4)

/* Binds endpoint (the error names it and libzmq's reason). Its connections are bounded
 * (host/conns.h): at most max_connections, and at most IFD_PUB_SUBS_MAX subscriptions each.
 * mode: the run's (the tensor messages say it); tensor_rate: bytes a second of tensor messages
 * (<= 0: IFD_PUB_TENSOR_RATE). */
int ifd_publisher_create(ifd_publisher **out, void *zctx, const char *endpoint, ifd_security *sec,
                         ifd_monitor *mon, int max_connections, ifd_mode mode, int64_t tensor_rate,
                         ifd_error *err);
/* The data bytes of the ring of tensor messages in shared memory (host/tensor_ring.h; default
 * IFD_TENSOR_RING_BYTES; 0: none, a "tensor-shm:NAME" subscriber gets data messages), made
 * when a subscriber first asks for a tensor there. Before ifd_publisher_start. */
void ifd_publisher_set_tensor_shm(ifd_publisher *p, int64_t bytes);
/* The endpoint it is bound to (host/endpoint.h: a port chosen for '*' resolved). */
const char *ifd_publisher_endpoint(const ifd_publisher *p);
/* Its sink (owned by p). */
ifd_sink *ifd_publisher_sink(ifd_publisher *p);
/*
 * Its tensor sink (owned by p; ifd_session_add_tensor_sink): a subscription to "tensor:NAME"
 * (IFD_PUB_TENSOR_PREFIX) asks for the outfeed tensor NAME, whose steps are then gathered and
 * published as messages of three frames: the topic, a JSON header ({"event": "tensor", "mode",
 * "name", "dtype", "row_shape", "global_steps", "rows"}) and the steps' data one after another
 * (C order, little-endian). A message holds consecutive steps of one tensor and goes out at the
 * end of each device loop (the sink's flush), before any summary, when it reaches
 * IFD_PUB_TENSOR_MESSAGE_BYTES or IFD_PUB_TENSOR_STEPS_MAX steps, and when the publisher stops.
 * A message that goes before the loop's end waits in the outbox for the loop's end too (one
 * wake-up of the publisher thread a loop), unless IFD_PUB_TENSOR_WAKE_BYTES or
 * IFD_PUB_TENSOR_WAKE_MESSAGES wait there.
 * A subscription to "tensor-shm:NAME" (IFD_PUB_TENSOR_SHM_PREFIX, a subscriber on the daemon's
 * host) asks for the same messages with the data in the ring (host/tensor_ring.h): the data is
 * written there once for all such subscribers, and the message on the topic "tensor-shm:NAME"
 * is a notice of two frames, the topic and the header with "shm": {"path", "size", "token",
 * "seq", "bytes"}. Without a ring (off, or it could not be made), or for a message over a
 * quarter of it, the "tensor-shm:" message is a data message as above.
 * Nothing is copied for a tensor nobody asked for. Messages beyond the byte rate, or beyond
 * IFD_PUB_TENSOR_OUTBOX_BYTES waiting in the outbox, are dropped whole, never waited for.
 */
const ifd_tensor_sink *ifd_publisher_tensor_sink(ifd_publisher *p);
/* Whether some subscriber asks for tensor name now. */
int ifd_publisher_tensor_wanted(ifd_publisher *p, const char *name);

typedef struct ifd_publisher_tensors {
    int subscribed;                 /* tensor names asked for now */
    int64_t sent, dropped, limited; /* messages: published; dropped behind; over rate or bytes */
    int64_t sent_steps, dropped_steps, limited_steps; /* the steps those messages held */
    int64_t outbox_bytes, largest;                    /* waiting now; the largest message so far */
    int64_t pending_bytes;                            /* data of the steps being gathered now */
    int64_t rate;                                     /* bytes a second */
    int64_t wakes; /* the publisher thread woken for queued messages (summaries included) */
    /* the data frames' buffers (host/tensor_pool.h): taken, of those the pool's kept ones, and
     * out now (gathering, in the outbox or in libzmq); kept for the next messages now */
    int64_t buffers, buffers_reused, buffers_out, buffers_kept;
    /* "tensor-shm:" messages sent: notices of data in the ring, and data messages (no ring, or
     * too large for it); the ring's file bytes (0: not made) */
    int64_t shm_notices, shm_data, shm_ring_bytes;
} ifd_publisher_tensors;
void ifd_publisher_tensor_stats(ifd_publisher *p, ifd_publisher_tensors *st);

int ifd_publisher_start(ifd_publisher *p, ifd_error *err);
/* Publishes what the outbox holds, then joins the thread. */
void ifd_publisher_stop(ifd_publisher *p);
/* Stops it, stops its socket's monitoring and closes the socket (before zmq_ctx_term). */
void ifd_publisher_destroy(ifd_publisher *p);

#endif
