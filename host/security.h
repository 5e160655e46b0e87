/*
 * infeedd's CURVE security (docs/protocol.md, "Security"): the daemon's key pair, the producer
 * keys allowed on the ingest socket (--authorized-keys, each optionally bound to the producer
 * names it may use) and the admin keys (--admin-keys) allowed on the control socket, and a ZAP
 * handler (ZeroMQ RFC 27, inproc://zeromq.zap.01) that decides every CURVE handshake:
 *
 *   ingest  (ROUTER): authorized keys
 *   control (REP):    admin keys
 *   publish (PUB):    admin keys and authorized keys
 *
 * A refused peer gets no connection (ZAP status 400): no message of it reaches the daemon and it
 * receives nothing. Each refusal is logged at info level with the key's fingerprint (its first 8
 * Z85 characters) and the socket, at most a line a second per socket.
 *
 * Lifecycle, failing closed: create (loads the keys; main, before anything else, so that a bad
 * key file is a config error) -> start (the ZAP handler, in the daemon's zmq context, before any
 * socket is bound) -> apply (each socket, before its bind) -> stop (after every CURVE socket is
 * closed, before zmq_ctx_term) -> destroy. libzmq accepts CURVE peers without asking when no ZAP
 * handler is bound, so apply also sets ZMQ_ZAP_ENFORCE_DOMAIN where libzmq has it, and the
 * handler outlives the sockets.
 */
#ifndef IFD_HOST_SECURITY_H
#define IFD_HOST_SECURITY_H

#include "core/keyfile.h"
#include "host/config.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ifd_security ifd_security;

typedef enum { IFD_SOCK_INGEST, IFD_SOCK_PUBLISH, IFD_SOCK_CONTROL, IFD_SOCK_ROLES } ifd_sock_role;

/* "ingest", "publish", "control" */
const char *ifd_sock_role_name(ifd_sock_role role);

/* Loads the keys named by c (curve_secret_key, authorized_keys, admin_keys). *out is NULL (and
 * the return IFD_OK) when CURVE is off (no curve_secret_key). IFD_ENOTSUP when libzmq has no
 * CURVE; IFD_EINVAL for a key file that cannot be read or parsed (the sentence names the file,
 * the line and what was expected). */
int ifd_security_create(ifd_security **out, const ifd_daemon_config *c, ifd_error *err);

/* Starts the ZAP handler thread on its own REP socket, bound in zctx. s NULL: a no-op. */
int ifd_security_start(ifd_security *s, void *zctx, ifd_error *err);

/* Before zsock is bound: makes it a CURVE server with the daemon's secret key, in the ZAP domain
 * of role. s NULL: a no-op. */
int ifd_security_apply(ifd_security *s, void *zsock, ifd_sock_role role, ifd_error *err);

/* Whether the producer whose CURVE key is user_id (the Z85 public key, which the ZAP handler
 * makes the connection's User-Id: zmq_msg_gets(msg, "User-Id")) may say HELLO as name. A key
 * listed with names may use only those; a key listed without names may use any name that no
 * other key is bound to. name NULL asks whether the key may use a name the daemon makes up (only
 * a key without names may). Returns 1 when allowed; 0, with a sentence in why (when not NULL),
 * when not. s NULL: always 1. */
int ifd_security_name_allowed(const ifd_security *s, const char *user_id, const char *name,
                              char *why, size_t len);

/* The names the producer key user_id is bound to in authorized_keys (0: any free name, or not
 * a key of the list). */
int ifd_security_key_names(const ifd_security *s, const char *user_id);

/* Stops and joins the ZAP handler (logging the refusals not yet logged). Call it after every
 * socket that uses CURVE is closed, before zmq_ctx_term. NULL or never started: a no-op. */
void ifd_security_stop(ifd_security *s);

/* Stops the handler if it runs, then frees. NULL: a no-op. */
void ifd_security_destroy(ifd_security *s);

/* The daemon's public key (Z85), for the startup log line. */
const char *ifd_security_public_key(const ifd_security *s);
/* Keys loaded from authorized_keys and admin_keys. */
int ifd_security_authorized_count(const ifd_security *s);
int ifd_security_admin_count(const ifd_security *s);
/* Handshakes the ZAP handler refused on a socket so far. */
uint64_t ifd_security_refused(const ifd_security *s, ifd_sock_role role);

/* Parses an authorized-keys (allow_names 1) or admin-keys (0) file's text into s's list; exposed
 * for the unit tests. source names the file in errors. */
int ifd_security_parse_keys(ifd_security *s, const char *text, const char *source, int allow_names,
                            ifd_error *err);
/* An empty security object (no keys) for the unit tests of parse_keys and name_allowed. */
int ifd_security_create_empty(ifd_security **out, ifd_error *err);

#endif
