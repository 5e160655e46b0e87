/*
 * The monitor: what the daemon's sockets share about their connections (each socket's own are in
 * host/conns.h, read by the socket's owner), and a thread that watches the heap:
 *
 * - the spare descriptor that is given up to accept (and close) the connections waiting in a
 *   listener's backlog when no descriptor is left (host/conns.c);
 * - once every HEAP_EVERY_NS, glibc's free heap above FREE_TRIM bytes is given back to the OS
 *   (malloc_trim), and heap in use above the bound (docs/protocol.md) is logged, rate-limited,
 *   and flagged (ifd_monitor_heap_over): the ingest then closes the connections that hold
 *   memory without being a producer (libzmq keeps every frame of a message whose last frame has
 *   not come, without limit).
 */
#ifndef IFD_HOST_MONITOR_H
#define IFD_HOST_MONITOR_H

#include <infeed/infeed.h>

#include <stddef.h>

typedef struct ifd_monitor ifd_monitor;

/* heap_bound: the memory bound of docs/protocol.md in bytes (0: not checked). */
int ifd_monitor_create(ifd_monitor **out, int max_connections, size_t heap_bound, ifd_error *err);
int ifd_monitor_start(ifd_monitor *m, ifd_error *err);
/* Stops the thread. The sockets' connection tables (host/conns.h) go first. */
void ifd_monitor_destroy(ifd_monitor *m);
/* Any thread: whether the last heap check found more in use than the bound. */
int ifd_monitor_heap_over(ifd_monitor *m);
/* Any thread: the spare descriptor is closed, so that one accept can take its number; 0 when
 * there was none. ifd_monitor_restore_spare opens it again (it stays closed while none is
 * free, and the thread retries). */
int ifd_monitor_release_spare(ifd_monitor *m);
void ifd_monitor_restore_spare(ifd_monitor *m);

#endif
