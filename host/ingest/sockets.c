/*
 * The ingest's sockets: the ROUTER producers connect to and the control REP, with their options
 * (docs/protocol.md, "Memory and connection bounds"), their CURVE keys, their connection tables
 * and their endpoints. Called once, by ifd_ingest_create, before the I/O thread starts.
 */
#include "host/ingest/ingest_internal.h"
#include "host/limits.h"
#include "host/security.h"

#include <string.h>
#include <zmq.h>

/* Heartbeats: a ping every HEARTBEAT_IVL_MS; a connection silent (no traffic, no pong) for the
 * timeout is closed: 10 s, or half of producer_timeout when that is shorter (at least 1 s), so
 * that a stopped producer is found gone well within its timeout. */
#define HEARTBEAT_IVL_MS 1000
static int heartbeat_timeout_ms(const ifd_daemon_config *c)
{
    double ms = 10000;
    if (c->producer_timeout > 0 && c->producer_timeout * 500 < ms)
        ms = c->producer_timeout * 500;
    return ms < 1000 ? 1000 : (int)ms;
}

/* One socket option; the error names it and libzmq's reason. */
typedef struct sockopt {
    int option;
    const char *name;
    int64_t value;
    int wide; /* an int64_t option (ZMQ_MAXMSGSIZE), else an int */
} sockopt;

static int set_options(void *sock, const char *what, const sockopt *opts, int n, ifd_error *err)
{
    for (int i = 0; i < n; i++) {
        int narrow = (int)opts[i].value;
        int rc = opts[i].wide
                     ? zmq_setsockopt(sock, opts[i].option, &opts[i].value, sizeof opts[i].value)
                     : zmq_setsockopt(sock, opts[i].option, &narrow, sizeof narrow);
        if (rc != 0)
            return ifd_error_set(err, IFD_EIO, "%s: zmq_setsockopt(%s, %lld): %s", what,
                                 opts[i].name, (long long)opts[i].value, zmq_strerror(zmq_errno()));
    }
    return IFD_OK;
}

#define OPT(o, v)                                                                                  \
    {                                                                                              \
        o, #o, (int64_t)(v), 0                                                                     \
    }
#define OPT64(o, v)                                                                                \
    {                                                                                              \
        o, #o, (int64_t)(v), 1                                                                     \
    }

static int open_router(ifd_ingest *g, int conns, ifd_error *err)
{
    const ifd_daemon_config *c = g->cfg;
    g->sock.router = zmq_socket(g->sock.zctx, ZMQ_ROUTER);
    if (g->sock.router == NULL)
        return ifd_error_set(err, IFD_EIO, "ingest: zmq_socket(ROUTER): %s",
                             zmq_strerror(zmq_errno()));
    /* Liveness: a send to a closed connection fails (EHOSTUNREACH) instead of vanishing, and
     * ZMTP heartbeats close a connection whose peer stopped answering (a SIGSTOPped or
     * unplugged producer), so its producer is found gone (host/ingest/producers.c). */
    const sockopt opts[] = {
        OPT64(ZMQ_MAXMSGSIZE, g->sock.max_frame),
        OPT(ZMQ_LINGER, 1000),
        OPT(ZMQ_ROUTER_MANDATORY, 1),
        OPT(ZMQ_HEARTBEAT_IVL, HEARTBEAT_IVL_MS),
        OPT(ZMQ_HEARTBEAT_TIMEOUT, heartbeat_timeout_ms(c)),
        OPT(ZMQ_RCVHWM, IFD_ROUTER_RCVHWM),
        OPT(ZMQ_SNDHWM, ifd_router_sndhwm(g->pr.credit)),
        OPT(ZMQ_HANDSHAKE_IVL, IFD_HANDSHAKE_IVL_MS),
    };
    /* A connection over the limit takes the place of one without a producer for as long as a
     * handshake may take; else it is told why in an ERROR (host/conns.h). */
    ifd_conns_rules in_rules = {.max = conns,
                                .idle_ns = IFD_HANDSHAKE_IVL_MS * 1000000LL,
                                .idle = "no producer on it",
                                .hold = 1};
    int rc;
    if ((rc = set_options(g->sock.router, "ingest", opts, (int)(sizeof opts / sizeof opts[0]),
                          err)) != IFD_OK ||
        (rc = ifd_security_apply(c->security, g->sock.router, IFD_SOCK_INGEST, err)) != IFD_OK ||
        (rc = ifd_conns_create(&g->sock.conns, g->sock.monitor, g->sock.zctx, g->sock.router,
                               "ingest", &in_rules, err)) != IFD_OK)
        return rc;
    return ifd_endpoint_bind(g->sock.router, "listen", c->listen, 0, g->sock.bound_listen,
                             sizeof g->sock.bound_listen, err);
}

static int open_control(ifd_ingest *g, int conns, ifd_error *err)
{
    const ifd_daemon_config *c = g->cfg;
    g->sock.rep = zmq_socket(g->sock.zctx, ZMQ_REP);
    if (g->sock.rep == NULL)
        return ifd_error_set(err, IFD_EIO, "control: zmq_socket(REP): %s",
                             zmq_strerror(zmq_errno()));
    const sockopt opts[] = {
        OPT(ZMQ_LINGER, 0),
        OPT64(ZMQ_MAXMSGSIZE, IFD_CONTROL_MAXMSGSIZE), /* a request is one small JSON object */
        OPT(ZMQ_RCVHWM, IFD_CONTROL_HWM),
        OPT(ZMQ_SNDHWM, IFD_CONTROL_HWM),
        OPT(ZMQ_HANDSHAKE_IVL, IFD_HANDSHAKE_IVL_MS),
    };
    /* control always answers: a new connection takes the place of the oldest */
    ifd_conns_rules ctl_rules = {.max = conns, .idle_ns = 0, .idle = "the oldest"};
    int rc;
    if ((rc = set_options(g->sock.rep, "control", opts, (int)(sizeof opts / sizeof opts[0]),
                          err)) != IFD_OK ||
        (rc = ifd_security_apply(c->security, g->sock.rep, IFD_SOCK_CONTROL, err)) != IFD_OK ||
        (rc = ifd_conns_create(&g->sock.ctl_conns, g->sock.monitor, g->sock.zctx, g->sock.rep,
                               "control", &ctl_rules, err)) != IFD_OK)
        return rc;
    return ifd_endpoint_bind(g->sock.rep, "control", c->control, c->control == c->default_control,
                             g->sock.bound_control, sizeof g->sock.bound_control, err);
}

int ingest_sockets_open(ifd_ingest *g, ifd_error *err)
{
    const ifd_daemon_config *c = g->cfg;
    int conns = ifd_daemon_max_connections(c);
    int rc = open_router(g, conns, err);
    if (rc == IFD_OK && c->publish && c->publish[0])
        rc = ifd_publisher_create(&g->sock.pub, g->sock.zctx, c->publish, c->security,
                                  g->sock.monitor, conns, err);
    if (rc == IFD_OK && c->control && c->control[0])
        rc = open_control(g, conns, err);
    return rc;
}
