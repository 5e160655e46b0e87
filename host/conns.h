/*
 * One socket's connections, as libzmq's socket monitor (zmq_socket_monitor) reports them, read
 * by the thread that owns the socket: libzmq reports a connection (ACCEPTED, with its
 * descriptor) before its handshake, so the owner knows it, and what was decided about it, before
 * the connection's first message (whose descriptor zmq_msg_get(ZMQ_SRCFD) gives).
 *
 * - At most max connections are admitted at once. A connection beyond that takes the place of
 *   the oldest idle one, if one is idle for idle_ns (idle: the owner has marked nothing busy on
 *   it, ifd_conns_busy; a producer, a subscription); otherwise it is refused: closed at once, or,
 *   with hold, kept for a moment (at most IFD_CONNS_HELD at once, else closed at once) so that
 *   the owner can answer its first message with a sentence (ifd_conns_refused) before it is
 *   closed. Places freed and refusals are logged, rate-limited.
 * - Descriptor exhaustion: libzmq retries a failed accept (EMFILE) at once, spinning its I/O
 *   thread, and logs nothing. The connections waiting in the listener's backlog are then closed
 *   with the spare descriptor the monitor keeps for that (the libuv and nginx remedy), which
 *   stops the spin; connections already open are kept. Logged, rate-limited.
 * - Handshakes that fail or time out (ZMQ_HANDSHAKE_IVL) are counted and logged, rate-limited.
 *
 * A connection is closed through its descriptor, once checked to still be one that the
 * socket's listener accepted: a TCP connection is reset (what its peer keeps sending is not read
 * any more), another shut down; libzmq then drops it (DISCONNECTED follows).
 * Only the owner's thread calls these functions (create and destroy: before and after it runs).
 */
#ifndef IFD_HOST_CONNS_H
#define IFD_HOST_CONNS_H

#include "host/monitor.h"

#include <stdint.h>

#define IFD_CONNS_HELD 16 /* refused connections held at once for their answer (hold) */

typedef struct ifd_conns ifd_conns;

/* What a socket admits. */
typedef struct ifd_conns_rules {
    int max;          /* connections admitted at once */
    int64_t idle_ns;  /* one over max takes the place of a connection idle this long (< 0: none) */
    const char *idle; /* what idle is, for the log: "without a producer" */
    int hold;         /* a refused connection waits (IFD_CONNS_HOLD_NS) for its answer */
} ifd_conns_rules;

#define IFD_CONNS_HOLD_NS 1000000000LL /* a refused connection waits this long for its answer */

/* Before socket is bound: watch its connections (name is for the log: "ingest", "publish",
 * "control"). */
int ifd_conns_create(ifd_conns **out, ifd_monitor *m, void *zctx, void *socket, const char *name,
                     const ifd_conns_rules *rules, ifd_error *err);
/* The socket to poll for ZMQ_POLLIN (the events). */
void *ifd_conns_pollable(ifd_conns *c);
/* Handles every event waiting, closes held connections whose time is up, logs. Call it at least
 * every 100 ms. */
void ifd_conns_update(ifd_conns *c);
/* What was decided about the connection of descriptor fd (zmq_msg_get(ZMQ_SRCFD) of one of its
 * messages; -1: not known), every event before its message handled first:
 * IFD_CONN_ADMITTED (or not known), IFD_CONN_REFUSED (held: the owner answers it; it is closed a
 * moment later) or IFD_CONN_CLOSING (the owner ignores its messages). */
enum { IFD_CONN_ADMITTED, IFD_CONN_REFUSED, IFD_CONN_CLOSING };
int ifd_conns_verdict(ifd_conns *c, int fd);
/* The owner marks something busy on fd's connection (a producer on it, a subscription): a
 * connection with a mark is never closed to make room. The mark (0: fd is no connection known)
 * is what ifd_conns_unmark takes back, which does nothing once fd is another connection. */
uint64_t ifd_conns_mark(ifd_conns *c, int fd);
#define IFD_CONNS_NOW UINT64_MAX /* ifd_conns_unmark: a mark of the connection now on fd */
void ifd_conns_unmark(ifd_conns *c, int fd, uint64_t mark);
/* The marks on fd's connection. */
int ifd_conns_marks(ifd_conns *c, int fd);
/* The owner's count on fd's connection (names it started, for the ingest), plus delta; 0 for a
 * descriptor that is no connection known. */
int ifd_conns_count(ifd_conns *c, int fd, int delta);
/* Closes fd's connection now (the owner's reason is logged, rate-limited). */
void ifd_conns_close(ifd_conns *c, int fd, const char *why);
/* Closes every idle connection open for at least older_ns; returns how many. */
int ifd_conns_close_idle(ifd_conns *c, int64_t older_ns, const char *why);
/* Stops the monitoring (libzmq waits on an event nobody reads) and closes what it used. Before
 * the socket is closed. NULL: nothing. */
void ifd_conns_destroy(ifd_conns *c);

#endif
