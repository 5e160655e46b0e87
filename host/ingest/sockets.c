/*
 * The ingest's sockets: the ROUTER producers connect to and the control REP, with their options
 * (docs/protocol.md, "Memory and connection bounds"), their CURVE keys, their connection tables,
 * their endpoints, and the I/O thread's wait on them (zmq_wait.h). Called once, by
 * ifd_ingest_create, before the I/O thread starts.
 */
#include "host/ingest/zmq_transport.h"
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

int ingest_socket_options(void *sock, const char *what, const sockopt *opts, int n, ifd_error *err)
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

/* One socket: made, its options set, its CURVE keys applied, its connections tracked, bound. */
typedef struct socket_spec {
    int type;
    const char *what; /* "ingest", "control": the error's and the connection table's name */
    const sockopt *opts;
    int nopts;
    ifd_sock_role role;
    const ifd_conns_rules *rules;
    const char *key, *endpoint; /* the config key the endpoint came from, and the endpoint */
    int private_dir;            /* an ipc endpoint's folder is made private (host/endpoint.h) */
    char *bound;
    size_t bound_len;
} socket_spec;

static int open_socket(ifd_ingest *g, const socket_spec *s, void **sock, ifd_conns **conns,
                       ifd_error *err)
{
    *sock = zmq_socket(g->sock.zctx, s->type);
    if (*sock == NULL)
        return ifd_error_set(err, IFD_EIO, "%s: zmq_socket: %s", s->what,
                             zmq_strerror(zmq_errno()));
    int rc;
    if ((rc = ingest_socket_options(*sock, s->what, s->opts, s->nopts, err)) != IFD_OK ||
        (rc = ifd_security_apply(g->cfg->security, *sock, s->role, err)) != IFD_OK ||
        (rc = ifd_conns_create(conns, g->sock.monitor, g->sock.zctx, *sock, s->what, s->rules,
                               err)) != IFD_OK)
        return rc;
    return ifd_endpoint_bind(*sock, s->key, s->endpoint, s->private_dir, s->bound, s->bound_len,
                             err);
}

static int open_router(ifd_ingest *g, int conns, ifd_error *err)
{
    const ifd_daemon_config *c = g->cfg;
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
    ifd_conns_rules rules = {.max = conns,
                             .idle_ns = IFD_HANDSHAKE_IVL_MS * 1000000LL,
                             .idle = "no producer on it",
                             .hold = 1};
    socket_spec s = {ZMQ_ROUTER,
                     "ingest",
                     opts,
                     (int)(sizeof opts / sizeof opts[0]),
                     IFD_SOCK_INGEST,
                     &rules,
                     "listen",
                     c->listen,
                     0,
                     g->sock.bound_listen,
                     sizeof g->sock.bound_listen};
    return open_socket(g, &s, &g->sock.router, &g->sock.conns, err);
}

static int open_control(ifd_ingest *g, int conns, ifd_error *err)
{
    const ifd_daemon_config *c = g->cfg;
    const sockopt opts[] = {
        OPT(ZMQ_LINGER, 0),
        OPT64(ZMQ_MAXMSGSIZE, IFD_CONTROL_MAXMSGSIZE), /* a request is one small JSON object */
        OPT(ZMQ_RCVHWM, IFD_CONTROL_HWM),
        OPT(ZMQ_SNDHWM, IFD_CONTROL_HWM),
        OPT(ZMQ_HANDSHAKE_IVL, IFD_HANDSHAKE_IVL_MS),
    };
    /* control always answers: a new connection takes the place of the oldest */
    ifd_conns_rules rules = {.max = conns, .idle_ns = 0, .idle = "the oldest"};
    socket_spec s = {ZMQ_REP,
                     "control",
                     opts,
                     (int)(sizeof opts / sizeof opts[0]),
                     IFD_SOCK_CONTROL,
                     &rules,
                     "control",
                     c->control,
                     c->control == c->default_control,
                     g->sock.bound_control,
                     sizeof g->sock.bound_control};
    return open_socket(g, &s, &g->sock.rep, &g->sock.ctl_conns, err);
}

int ingest_sockets_open(ifd_ingest *g, ifd_error *err)
{
    const ifd_daemon_config *c = g->cfg;
    int conns = ifd_daemon_max_connections(c);
    int rc = open_router(g, conns, err);
    if (rc == IFD_OK && c->publish && c->publish[0])
        rc = ifd_publisher_create(&g->sock.pub, g->sock.zctx, c->publish, c->security,
                                  g->sock.monitor, conns, c->run.mode, c->tensor_rate, err);
    if (rc == IFD_OK && g->sock.pub)
        ifd_publisher_set_tensor_shm(g->sock.pub, c->tensor_shm_bytes);
    if (rc == IFD_OK && c->control && c->control[0])
        rc = open_control(g, conns, err);
    g->sock.i_rep = -1;
    if (rc == IFD_OK)
        rc = ingest_wait_add(&g->sock.wait, NULL, g->sock.efd, "wake-up", &g->sock.i_efd, err);
    if (rc == IFD_OK)
        rc = ingest_wait_add(&g->sock.wait, g->sock.router, -1, "ingest", &g->sock.i_router, err);
    if (rc == IFD_OK && g->sock.rep)
        rc = ingest_wait_add(&g->sock.wait, g->sock.rep, -1, "control", &g->sock.i_rep, err);
    return rc;
}
