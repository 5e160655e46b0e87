/*
 * Internal helpers of the C client: the monotonic clock for deadlines and libzmq error
 * sentences. The wire format itself is core/wire.h, shared with the daemon.
 */
#ifndef IFD_CLIENT_WIRE_H
#define IFD_CLIENT_WIRE_H

#include "core/wire.h"
#include <infeed/client.h>
#include <infeed/error.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Monotonic nanoseconds. */
int64_t ifdw_now_ns(void);
/* A deadline timeout_ms from now; -1 (none) for a negative timeout. */
int64_t ifdw_deadline(int timeout_ms);
/* Milliseconds left to a deadline for zmq_poll: -1 for none, else >= 0 (rounded up). */
long ifdw_left_ms(int64_t deadline);

/* The error enum for a protocol code name ("ESHAPE"); -1 when it is none. */
int ifdw_code_parse(const char *name);
/* Sets err from errno after a failed libzmq call and returns the code (IFD_ENOMEM, IFD_ECLOSED
 * for a terminated context, IFD_EIO otherwise). */
int ifdw_zmq_error(ifd_error *err, const char *what);
/* Makes sock a CURVE client with opts' keys before it connects (opts NULL or empty: nothing).
 * who names the client in errors ("producer"). */
int ifdw_curve_apply(void *sock, const ifd_client_options *opts, const char *who, ifd_error *err);

/* The connect timeout (ifd_client_options.connect_timeout_ms): a monitor of the socket's
 * handshakes until the first one succeeds. Start it before zmq_connect. */
typedef struct ifdw_watch {
    void *mon;      /* the monitor's PAIR socket; NULL: not watching (connected, or no bound) */
    void *sock;     /* the watched socket */
    int timeout_ms; /* the bound */
    int64_t deadline;
    int refused;      /* a handshake failed: 1 CURVE refused the key, 2 another failure */
    int curve;        /* this client is a CURVE client */
    int doubt;        /* it connected to itself: only a daemon's message ends the watch */
    const char *who;  /* "producer" */
    const char *flag; /* the daemon's flag of the endpoint: "--listen" */
    const char *keys; /* how this client is given CURVE keys: "set server_key_file and ..." */
} ifdw_watch;
int ifdw_watch_start(ifdw_watch *w, void *ctx, void *sock, const ifd_client_options *opts,
                     const char *who, const char *flag, ifd_error *err);
/* Watches again, to the same deadline, after the socket reconnected because its handshake was
 * with itself (see reply.c): from then on a handshake does not count, a daemon's message does
 * (ifdw_watch_confirm), since the next handshake may be with itself again. */
int ifdw_watch_rearm(ifdw_watch *w, void *ctx, void *sock, ifd_error *err);
void ifdw_watch_confirm(ifdw_watch *w);
/* Why the watched socket has not connected, the end of a sentence ("no daemon answered at EP
 * within T s" + this): ": it refused this client's CURVE key"; ": the handshake failed ..."
 * (for a client without CURVE: the daemon may require it, w->keys says how); or, when nothing
 * answered at all, "; is infeedd running with FLAG EP?", which for a CURVE client adds that the
 * daemon may refuse its key (a refusal is not always reported to the client). */
void ifdw_watch_why(const ifdw_watch *w, const char *endpoint, char *buf, size_t len);
/* "10 s", "0.25 s": a timeout in milliseconds as the sentences say it. */
const char *ifdw_seconds(int ms, char *buf, size_t len);
/* Takes the monitor's events; 1 once the daemon answered (or when not watching). */
int ifdw_watch_poll(ifdw_watch *w);
/* While not connected: IFD_ETIMEDOUT with the sentence once the bound has passed, else IFD_OK
 * and *wait_ms capped so that the caller polls again soon. */
int ifdw_watch_check(ifdw_watch *w, const char *endpoint, long *wait_ms, ifd_error *err);
void ifdw_watch_stop(ifdw_watch *w);

#endif
