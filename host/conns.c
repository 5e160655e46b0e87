#include "host/conns.h"

#include "core/log.h"
#include "core/thread.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#include <sys/resource.h>
#include <sys/socket.h>

#define LOG_EVERY_NS 5000000000LL /* a socket's connection log lines, at most one per this */
#define EVENT_HWM 10000           /* monitor events queued before libzmq waits for us */
#define BACKLOG_DROP_MAX 4096     /* connections closed per EMFILE event */
#define ANSWERED_NS 200000000LL   /* a refused connection lives this long after its answer */

#define EVENTS                                                                                     \
    (ZMQ_EVENT_LISTENING | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED | ZMQ_EVENT_DISCONNECTED | \
     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |                  \
     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)

enum { C_NONE, C_OPEN, C_HELD, C_CLOSING };

typedef struct conn {
    int state;
    uint64_t gen;     /* which connection on this descriptor (ifd_conns_mark) */
    int busy;         /* what the owner marked busy on it */
    int count;        /* the owner's (ifd_conns_count) */
    int answered;     /* C_HELD: the owner answered it */
    int64_t since_ns; /* accepted */
    int64_t until_ns; /* C_HELD: closed then */
} conn;

struct ifd_conns {
    ifd_monitor *m;
    void *socket, *pair;
    char name[16];
    ifd_conns_rules rules;
    int listen_fd; /* -1 until LISTENING */
    struct sockaddr_storage laddr;
    socklen_t laddr_len;
    conn *tab; /* by descriptor */
    int cap;
    int open, held; /* C_OPEN and C_HELD connections */
    uint64_t gens;  /* connections accepted */
    /* since the last log line */
    int64_t refused, evicted, closed, accept_failed, backlog_dropped, handshake_failed;
    int accept_errno;
    char close_why[128];
    int64_t last_log_ns;
};

int ifd_conns_create(ifd_conns **out, ifd_monitor *m, void *zctx, void *socket, const char *name,
                     const ifd_conns_rules *rules, ifd_error *err)
{
    *out = NULL;
    ifd_conns *c = calloc(1, sizeof *c);
    if (c == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "%s: connections", name);
    c->m = m;
    c->socket = socket;
    c->rules = *rules;
    c->listen_fd = -1;
    snprintf(c->name, sizeof c->name, "%s", name);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://ifd-conns-%p", socket);
    if (zmq_socket_monitor(socket, ep, EVENTS) != 0) {
        free(c);
        return ifd_error_set(err, IFD_EIO, "%s: zmq_socket_monitor: %s", name,
                             zmq_strerror(zmq_errno()));
    }
    c->pair = zmq_socket(zctx, ZMQ_PAIR);
    int hwm = EVENT_HWM, zero = 0;
    if (c->pair == NULL || zmq_setsockopt(c->pair, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(c->pair, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(c->pair, ep) != 0) {
        int e = zmq_errno();
        ifd_conns_destroy(c);
        return ifd_error_set(err, IFD_EIO, "%s: monitor: %s", name, zmq_strerror(e));
    }
    *out = c;
    return IFD_OK;
}

void *ifd_conns_pollable(ifd_conns *c)
{
    return c->pair;
}

void ifd_conns_destroy(ifd_conns *c)
{
    if (c == NULL)
        return;
    zmq_socket_monitor(c->socket, NULL, 0);
    if (c->pair)
        zmq_close(c->pair);
    free(c->tab);
    free(c);
}

static long nofile_limit(void)
{
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : -1;
}

/* Whether fd is still a connection accepted by the listener (same local address), so that a
 * descriptor libzmq has closed and the process reused for something else is left alone. */
static int accepted_here(const ifd_conns *c, int fd)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (c->laddr_len == 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return 0;
    int acc = 0;
    socklen_t alen = sizeof acc;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &alen) != 0 || acc)
        return 0; /* a listener, not a connection */
    return len == c->laddr_len && memcmp(&a, &c->laddr, len) == 0;
}

static conn *entry(ifd_conns *c, int fd)
{
    return fd >= 0 && fd < c->cap ? &c->tab[fd] : NULL;
}

/* An entry for fd (the table grows to the highest descriptor seen), or NULL (no memory). */
static conn *entry_make(ifd_conns *c, int fd)
{
    if (fd < 0)
        return NULL;
    if (fd >= c->cap) {
        int cap = c->cap ? c->cap : 64;
        while (cap <= fd)
            cap *= 2;
        conn *t = realloc(c->tab, (size_t)cap * sizeof *t);
        if (t == NULL)
            return NULL;
        memset(t + c->cap, 0, (size_t)(cap - c->cap) * sizeof *t);
        c->tab = t;
        c->cap = cap;
    }
    return &c->tab[fd];
}

/* The connection is closed, and libzmq drops it (DISCONNECTED follows). A TCP connection is
 * reset (connect to AF_UNSPEC: Linux drops what was queued either way, answers the peer with a
 * reset and reports an error to libzmq at once): after shutdown(SHUT_RD) Linux still delivers
 * what arrives and gives EOF only once the receive queue is empty, so a peer that kept sending
 * would keep its connection, its descriptor and what libzmq makes of its data, while its place
 * went to another. Other transports are shut down. */
static void close_conn(ifd_conns *c, int fd)
{
    conn *e = &c->tab[fd];
    if (e->state == C_OPEN)
        c->open--;
    else if (e->state == C_HELD)
        c->held--;
    e->state = C_CLOSING;
    /* libzmq owns the descriptor and may close it (and the number be reused) at any time: a
     * duplicate is checked and acted on, so that what is reset is what was checked (with no
     * descriptor left for one, the descriptor itself) */
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    int use = own >= 0 ? own : fd;
    struct sockaddr none = {.sa_family = AF_UNSPEC};
    if (accepted_here(c, use) &&
        (c->laddr.ss_family == AF_UNIX || connect(use, &none, sizeof none) != 0))
        shutdown(use, SHUT_RDWR);
    if (own >= 0)
        close(own);
}

/* The oldest connection idle for the rules' time (not fd), or -1. */
static int oldest_idle(const ifd_conns *c, int fd, int64_t now, int64_t idle_ns)
{
    int best = -1;
    for (int i = 0; i < c->cap; i++) {
        const conn *e = &c->tab[i];
        if (i != fd && e->state == C_OPEN && e->busy == 0 && now - e->since_ns >= idle_ns &&
            (best < 0 || e->since_ns < c->tab[best].since_ns))
            best = i;
    }
    return best;
}

/* A new connection on fd: admitted; over the limit it takes an idle one's place, or is
 * refused (held for its answer, or closed). */
static void on_accepted(ifd_conns *c, int fd, int64_t now)
{
    conn *e = entry_make(c, fd);
    if (e == NULL)
        return;
    if (e->state == C_OPEN) /* a DISCONNECTED not seen: the old connection is gone */
        c->open--;
    else if (e->state == C_HELD)
        c->held--;
    *e = (conn){.state = C_OPEN, .gen = ++c->gens, .since_ns = now};
    if (++c->open <= c->rules.max)
        return;
    int idle = c->rules.idle_ns >= 0 ? oldest_idle(c, fd, now, c->rules.idle_ns) : -1;
    if (idle >= 0) {
        close_conn(c, idle);
        c->evicted++;
        return;
    }
    c->refused++;
    if (c->rules.hold && c->held < IFD_CONNS_HELD) {
        c->open--;
        c->held++;
        e->state = C_HELD;
        e->until_ns = now + IFD_CONNS_HOLD_NS;
        return;
    }
    close_conn(c, fd);
}

/* No descriptor left to accept with: close the connections waiting in the listener's backlog,
 * giving up the spare descriptor to accept them one by one. libzmq retries a failed accept at
 * once while the backlog is not empty, so this is what ends its spin. */
static void drop_backlog(ifd_conns *c)
{
    if (c->listen_fd < 0 || !ifd_monitor_release_spare(c->m))
        return;
    for (int i = 0; i < BACKLOG_DROP_MAX; i++) {
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            break;
        close(fd);
        c->backlog_dropped++;
    }
    ifd_monitor_restore_spare(c->m); /* stays closed while none is free: the monitor retries */
}

static void on_event(ifd_conns *c, uint16_t ev, uint32_t value, int64_t now)
{
    int fd = (int)value;
    conn *e;
    switch (ev) {
    case ZMQ_EVENT_LISTENING: {
        /* libzmq's listener blocks; accepts race with its I/O thread, and an accept here must
         * not wait (libzmq takes EAGAIN as "nothing to accept") */
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
            break;
        c->listen_fd = fd;
        c->laddr_len = sizeof c->laddr;
        if (getsockname(fd, (struct sockaddr *)&c->laddr, &c->laddr_len) != 0)
            c->laddr_len = 0;
        break;
    }
    case ZMQ_EVENT_ACCEPTED:
        on_accepted(c, fd, now);
        break;
    case ZMQ_EVENT_DISCONNECTED:
        if ((e = entry(c, fd)) != NULL) {
            if (e->state == C_OPEN)
                c->open--;
            else if (e->state == C_HELD)
                c->held--;
            e->state = C_NONE;
        }
        break;
    case ZMQ_EVENT_ACCEPT_FAILED:
        if (fd == EAGAIN || fd == EWOULDBLOCK || fd == EINTR || fd == ECONNABORTED)
            break; /* another thread took it, or the peer left */
        c->accept_failed++;
        c->accept_errno = fd;
        if (fd == EMFILE || fd == ENFILE)
            drop_backlog(c);
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        c->handshake_failed++;
        break;
    default:
        break;
    }
}

/* Reads every event waiting; whether there was one. */
static int drain(ifd_conns *c, int64_t now)
{
    int any = 0;
    for (;;) {
        zmq_msg_t a, b;
        zmq_msg_init(&a);
        if (zmq_msg_recv(&a, c->pair, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&a);
            return any;
        }
        any = 1;
        zmq_msg_init(&b);
        if (zmq_msg_more(&a))
            zmq_msg_recv(&b, c->pair, 0); /* the endpoint: the second part comes with the first */
        if (zmq_msg_size(&a) >= 6) {
            uint16_t ev;
            uint32_t value;
            memcpy(&ev, zmq_msg_data(&a), 2);
            memcpy(&value, (const char *)zmq_msg_data(&a) + 2, 4);
            on_event(c, ev, value, now);
        }
        zmq_msg_close(&a);
        zmq_msg_close(&b);
    }
}

/* fd's entry, every event before the message that named fd handled first (its connection's
 * ACCEPTED, and a DISCONNECTED of an earlier one on fd); NULL: not known. */
static conn *known(ifd_conns *c, int fd)
{
    if (c == NULL || fd < 0)
        return NULL;
    drain(c, ifd_clock_ns());
    conn *e = entry(c, fd);
    return e && e->state != C_NONE ? e : NULL;
}

static void log_conns(ifd_conns *c, int64_t now)
{
    if (c->refused + c->evicted + c->closed + c->accept_failed + c->backlog_dropped +
                c->handshake_failed ==
            0 ||
        (c->last_log_ns && now - c->last_log_ns < LOG_EVERY_NS))
        return;
    c->last_log_ns = now;
    if (c->refused)
        IFD_LOG_WARN("%s: %" PRId64 " new connection%s closed: the socket is at its limit of %d "
                     "connections (--max-connections)%s",
                     c->name, c->refused, c->refused == 1 ? "" : "s", c->rules.max,
                     c->rules.hold ? "; each was told so in an ERROR when it spoke in time" : "");
    if (c->evicted)
        IFD_LOG_WARN("%s: %" PRId64 " idle connection%s (%s) closed to make room for new ones: "
                     "the socket is at its limit of %d connections (--max-connections)",
                     c->name, c->evicted, c->evicted == 1 ? "" : "s", c->rules.idle, c->rules.max);
    if (c->closed)
        IFD_LOG_WARN("%s: %" PRId64 " connection%s closed: %s", c->name, c->closed,
                     c->closed == 1 ? "" : "s", c->close_why);
    if (c->accept_failed) {
        if (c->accept_errno == EMFILE || c->accept_errno == ENFILE)
            IFD_LOG_WARN("%s: cannot accept connections: %s (the descriptor limit is %ld, see "
                         "ulimit -n); %" PRId64 " waiting connection%s closed",
                         c->name, strerror(c->accept_errno), nofile_limit(), c->backlog_dropped,
                         c->backlog_dropped == 1 ? "" : "s");
        else
            IFD_LOG_WARN("%s: %" PRId64 " connection%s could not be accepted: %s", c->name,
                         c->accept_failed, c->accept_failed == 1 ? "" : "s",
                         strerror(c->accept_errno));
    }
    if (c->handshake_failed)
        IFD_LOG_INFO("%s: %" PRId64 " connection%s closed before completing the ZeroMQ "
                     "handshake (timed out, refused, or not ZeroMQ)",
                     c->name, c->handshake_failed, c->handshake_failed == 1 ? "" : "s");
    c->refused = c->evicted = c->closed = c->accept_failed = c->backlog_dropped =
        c->handshake_failed = 0;
}

void ifd_conns_update(ifd_conns *c)
{
    if (c == NULL)
        return;
    int64_t now = ifd_clock_ns();
    drain(c, now);
    for (int fd = 0; c->held && fd < c->cap; fd++)
        if (c->tab[fd].state == C_HELD && now >= c->tab[fd].until_ns)
            close_conn(c, fd); /* its answer left ANSWERED_NS ago */
    log_conns(c, now);
}

int ifd_conns_verdict(ifd_conns *c, int fd)
{
    conn *e = known(c, fd);
    if (e == NULL || e->state == C_OPEN)
        return IFD_CONN_ADMITTED;
    if (e->state == C_CLOSING)
        return IFD_CONN_CLOSING;
    if (!e->answered) {
        e->answered = 1;
        int64_t soon = ifd_clock_ns() + ANSWERED_NS;
        if (soon < e->until_ns)
            e->until_ns = soon;
    }
    return IFD_CONN_REFUSED;
}

uint64_t ifd_conns_mark(ifd_conns *c, int fd)
{
    conn *e = known(c, fd);
    if (e == NULL || e->state == C_NONE)
        return 0;
    e->busy++;
    return e->gen;
}

void ifd_conns_unmark(ifd_conns *c, int fd, uint64_t mark)
{
    conn *e = c ? entry(c, fd) : NULL;
    if (e && e->state != C_NONE && mark && (e->gen == mark || mark == IFD_CONNS_NOW) && e->busy > 0)
        e->busy--;
}

int ifd_conns_marks(ifd_conns *c, int fd)
{
    conn *e = known(c, fd);
    return e ? e->busy : 0;
}

int ifd_conns_count(ifd_conns *c, int fd, int delta)
{
    conn *e = known(c, fd);
    if (e == NULL || e->state == C_NONE)
        return 0;
    e->count += delta;
    return e->count;
}

void ifd_conns_close(ifd_conns *c, int fd, const char *why)
{
    conn *e = known(c, fd);
    if (e == NULL || (e->state != C_OPEN && e->state != C_HELD))
        return;
    close_conn(c, fd);
    c->closed++;
    snprintf(c->close_why, sizeof c->close_why, "%s", why);
}

int ifd_conns_close_idle(ifd_conns *c, int64_t older_ns, const char *why)
{
    if (c == NULL)
        return 0;
    int64_t now = ifd_clock_ns();
    int n = 0;
    for (int fd = 0; fd < c->cap; fd++) {
        conn *e = &c->tab[fd];
        if (e->state == C_OPEN && e->busy == 0 && now - e->since_ns >= older_ns) {
            close_conn(c, fd);
            n++;
        }
    }
    if (n) {
        c->closed += n;
        snprintf(c->close_why, sizeof c->close_why, "%s", why);
    }
    return n;
}
