/*
 * The connection monitor: one thread reading libzmq's socket monitor events (zmq_socket_monitor)
 * of the daemon's three sockets, so that floods of connections are bounded and logged:
 *
 * - Each socket has at most max_connections connections at once: beyond it a newly accepted
 *   connection is shut down (libzmq then drops it), and the refusals are logged, rate-limited.
 * - Descriptor exhaustion: libzmq retries a failed accept (EMFILE) at once, spinning its I/O
 *   thread, and logs nothing. The monitor logs it (rate-limited) and closes the connections
 *   waiting in the listener's backlog with a spare descriptor it keeps for that (the libuv and
 *   nginx remedy), which stops the spin; connections already open are kept.
 * - Handshakes that fail or time out (ZMQ_HANDSHAKE_IVL) are counted and logged, rate-limited.
 * - The heap: once a second, glibc's free heap above FREE_TRIM bytes is given back to the OS
 *   (malloc_trim), and heap in use above the bound (docs/protocol.md) is logged.
 *
 * Only the monitor thread uses its PAIR sockets. The watched sockets stay their owners'.
 */
#ifndef IFD_HOST_MONITOR_H
#define IFD_HOST_MONITOR_H

#include "infeed/infeed.h"

#include <stddef.h>

typedef struct ifd_monitor ifd_monitor;

/* heap_bound: the memory bound of docs/protocol.md in bytes (0: not checked). */
int ifd_monitor_create(ifd_monitor **out, void *zctx, int max_connections, size_t heap_bound,
                       ifd_error *err);
/* Before socket is bound: watch its connections; name is for the log ("ingest", "publish",
 * "control"). Called by the socket's owner, before the monitor starts. */
int ifd_monitor_watch(ifd_monitor *m, void *socket, const char *name, ifd_error *err);
int ifd_monitor_start(ifd_monitor *m, ifd_error *err);
/* Stops the thread and closes its sockets. The watched sockets must have stopped being monitored
 * first (ifd_monitor_unwatch): libzmq blocks on a monitor event nobody reads. */
void ifd_monitor_destroy(ifd_monitor *m);
/* By the watched socket's owner (or once it has none): no more events from it. */
void ifd_monitor_unwatch(void *socket);

#endif
