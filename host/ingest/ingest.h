/*
 * infeedd's ZeroMQ side: the ingest ROUTER (docs/protocol.md) and the control REP socket, owned by
 * one I/O thread, and the summaries PUB socket, owned by the publisher's thread
 * (host/publisher.h); a monitor thread watches the heap (host/monitor.h). The files of the ingest
 * and what each holds are listed in host/ingest/ingest_internal.h. Other threads
 * reach the I/O thread through an eventfd it polls beside the sockets:
 *
 * - Accepted batches go to a FIFO that is the session's batch source. Their tensors are views of
 *   the received zmq frames; the runtime's release (any thread, when every replica consumed its
 *   shard) closes the frames and marks the batch done, and the I/O thread sends the ACKs in each
 *   producer's order.
 * - Summaries written to the PUB sink (outfeed thread) are queued and published by the publisher
 *   thread without blocking: a slow subscriber loses messages, the daemon never waits.
 * - Signals (main's handler) and control requests end the run through the session.
 *
 * Memory is bounded: a producer has at most `credit` batches accepted and not yet consumed, and
 * at most `max_producers` producers are known at once.
 */
#ifndef IFD_HOST_INGEST_H
#define IFD_HOST_INGEST_H

#include "host/config.h"
#include <infeed/infeed.h>

typedef struct ifd_ingest ifd_ingest;

/* Binds the three endpoints (the error names the endpoint and libzmq's reason). c is borrowed.
 * signals, when not NULL, is the count of SIGINT/SIGTERM the process received (incremented
 * atomically by a signal handler, which also calls ifd_ingest_wake). */
int ifd_ingest_create(ifd_ingest **out, const ifd_daemon_config *c, int *signals, ifd_error *err);
/* The endpoints the sockets are bound to, as JSON: {"listen", "publish", "control"}, each the
 * bound endpoint (host/endpoint.h: a port or path chosen for '*' resolved) or null for a socket
 * that is off. A new reference. Any thread, once ifd_ingest_create returned. */
struct json_t *ifd_ingest_endpoints_json(const ifd_ingest *g);
/* The batch source to give the session. */
ifd_batch_source ifd_ingest_source(ifd_ingest *g);
/* A sink publishing each summary on the PUB socket (owned by g; NULL when --publish is ""). */
ifd_sink *ifd_ingest_pub_sink(ifd_ingest *g);
/* The PUB socket's tensor sink: the outfeed tensors subscribers ask for (NULL when --publish is
 * ""; host/publisher.h). */
const ifd_tensor_sink *ifd_ingest_tensor_sink(ifd_ingest *g);
/* Predict mode: the sink that sends each batch's predictions back to its producer as a PREDICTION
 * (just before the ACK that covers the batch). Add it to the session before the run. */
ifd_prediction_sink ifd_ingest_prediction_sink(ifd_ingest *g);
/* Before ifd_ingest_start, when the run starts from checkpoint c: each producer it names is
 * known, and a HELLO under that name is told to resume at the checkpoint's seq + 1 (WELCOME's
 * next_seq). */
int ifd_ingest_restore(ifd_ingest *g, const ifd_checkpoint *c, ifd_error *err);
/* The checkpoint hook's positions callback (arg: the ingest): for every producer name welcomed in
 * this run or restored, the highest seq handed to the infeed (docs/checkpoint.md). */
int ifd_ingest_positions(void *arg, ifd_checkpoint *c, ifd_error *err);
/* --eval-every: the eval set the eval producers fill (host/eval_set.h), else NULL. Owned by g. */
struct ifd_eval_set *ifd_ingest_eval_set(ifd_ingest *g);
/* Starts the I/O thread serving producers for session s (borrowed; its program gives the
 * schema). */
int ifd_ingest_start(ifd_ingest *g, ifd_session *s, ifd_error *err);
/* Async-signal-safe: wakes the I/O thread. */
void ifd_ingest_wake(ifd_ingest *g);
/* After ifd_session_run returned: no more batches are taken; the I/O thread sends the pending
 * ACKs, a BYE to every producer (status "ok" or "error", the end reason and message) and the
 * queued summaries, then stops. */
void ifd_ingest_finish(ifd_ingest *g, int code, const char *reason, const char *message);
/* Stops the I/O thread (when ifd_ingest_finish has not) and lets go of everything the ingest
 * registered with the session's device (shared-memory pools): call it before the session is
 * destroyed. ifd_ingest_finish and ifd_ingest_destroy call it too. */
void ifd_ingest_release_session(ifd_ingest *g);
/* After the session is destroyed (which releases the batches it held). */
void ifd_ingest_destroy(ifd_ingest *g);

#endif
