#include "host/monitor.h"

#include "core/log.h"
#include "core/thread.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>

#define MAX_WATCHED 4
#define LOG_EVERY_NS 5000000000LL    /* a socket's connection log lines, at most one per this */
#define HEAP_EVERY_NS 1000000000LL   /* heap checks */
#define HEAP_WARN_NS 10000000000LL   /* heap warnings, at most one per this */
#define FREE_TRIM ((size_t)64 << 20) /* free heap above this is given back */
#define EVENT_HWM 10000              /* monitor events queued before libzmq waits for us */
#define BACKLOG_DROP_MAX 4096        /* connections closed per EMFILE event */

#define EVENTS                                                                                     \
    (ZMQ_EVENT_LISTENING | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED | ZMQ_EVENT_DISCONNECTED | \
     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |                  \
     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)

typedef struct watched {
    char name[16];
    void *pair;
    int listen_fd; /* -1 until LISTENING */
    struct sockaddr_storage laddr;
    socklen_t laddr_len;
    int open; /* accepted, not yet disconnected */
    /* since the last log line */
    int64_t refused, accept_failed, backlog_dropped, handshake_failed;
    int accept_errno;
    int64_t last_log_ns;
} watched;

struct ifd_monitor {
    void *zctx;
    int max_connections;
    size_t heap_bound;
    watched w[MAX_WATCHED];
    int nw;
    int spare; /* a descriptor given up to accept (and close) when there is none left */
    ifd_thread thread;
    int started;
    int stop; /* atomic */
    int wake; /* eventfd: destroy wakes the thread's poll with it, so exit does not wait for it */
    int64_t heap_checked_ns, heap_warned_ns;
};

int ifd_monitor_create(ifd_monitor **out, void *zctx, int max_connections, size_t heap_bound,
                       ifd_error *err)
{
    ifd_monitor *m = calloc(1, sizeof *m);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "monitor");
    m->zctx = zctx;
    m->max_connections = max_connections;
    m->heap_bound = heap_bound;
    m->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    m->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m->wake < 0) {
        int e = errno;
        ifd_monitor_destroy(m);
        return ifd_error_set(err, IFD_ENOMEM, "monitor: eventfd: %s", strerror(e));
    }
    IFD_LOG_INFO("at most %d connections a socket; memory bound %zu MiB (docs/protocol.md)",
                 max_connections, heap_bound >> 20);
    *out = m;
    return IFD_OK;
}

int ifd_monitor_watch(ifd_monitor *m, void *socket, const char *name, ifd_error *err)
{
    if (m->nw == MAX_WATCHED)
        return ifd_error_set(err, IFD_EINVAL, "monitor: too many sockets");
    watched *w = &m->w[m->nw];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->listen_fd = -1;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://ifd-monitor-%p", socket);
    if (zmq_socket_monitor(socket, ep, EVENTS) != 0)
        return ifd_error_set(err, IFD_EIO, "%s: zmq_socket_monitor: %s", name,
                             zmq_strerror(zmq_errno()));
    w->pair = zmq_socket(m->zctx, ZMQ_PAIR);
    int hwm = EVENT_HWM, zero = 0;
    if (w->pair == NULL || zmq_setsockopt(w->pair, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(w->pair, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(w->pair, ep) != 0) {
        int e = zmq_errno();
        if (w->pair)
            zmq_close(w->pair);
        w->pair = NULL;
        zmq_socket_monitor(socket, NULL, 0);
        return ifd_error_set(err, IFD_EIO, "%s: monitor: %s", name, zmq_strerror(e));
    }
    m->nw++;
    return IFD_OK;
}

void ifd_monitor_unwatch(void *socket)
{
    if (socket)
        zmq_socket_monitor(socket, NULL, 0);
}

static long nofile_limit(void)
{
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (long)rl.rlim_cur : -1;
}

/* Whether fd is still a connection accepted by w's listener (same local address), so that a
 * descriptor libzmq has closed and the process reused for something else is left alone. */
static int accepted_here(const watched *w, int fd)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (w->laddr_len == 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return 0;
    int acc = 0;
    socklen_t alen = sizeof acc;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &alen) != 0 || acc)
        return 0; /* a listener, not a connection */
    return len == w->laddr_len && memcmp(&a, &w->laddr, len) == 0;
}

/* No descriptor left to accept with: close the connections waiting in the listener's backlog,
 * giving up the spare descriptor to accept them one by one. libzmq retries a failed accept at
 * once while the backlog is not empty, so this is what ends its spin. */
static void drop_backlog(ifd_monitor *m, watched *w)
{
    if (w->listen_fd < 0 || m->spare < 0)
        return;
    close(m->spare);
    m->spare = -1;
    for (int i = 0; i < BACKLOG_DROP_MAX; i++) {
        int fd = accept4(w->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            break;
        close(fd);
        w->backlog_dropped++;
    }
    m->spare = open("/dev/null", O_RDONLY | O_CLOEXEC); /* -1 while none is free: retried */
}

static void on_event(ifd_monitor *m, watched *w, uint16_t ev, uint32_t value)
{
    int fd = (int)value;
    switch (ev) {
    case ZMQ_EVENT_LISTENING: {
        /* libzmq's listener blocks; accepts race with its I/O thread, and an accept in the
         * monitor must not wait (libzmq takes EAGAIN as "nothing to accept") */
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
            break;
        w->listen_fd = fd;
        w->laddr_len = sizeof w->laddr;
        if (getsockname(fd, (struct sockaddr *)&w->laddr, &w->laddr_len) != 0)
            w->laddr_len = 0;
        break;
    }
    case ZMQ_EVENT_ACCEPTED:
        if (++w->open > m->max_connections && accepted_here(w, fd)) {
            shutdown(fd, SHUT_RDWR); /* libzmq reads EOF and drops it (DISCONNECTED follows) */
            w->refused++;
        }
        break;
    case ZMQ_EVENT_DISCONNECTED:
        if (w->open > 0)
            w->open--;
        break;
    case ZMQ_EVENT_ACCEPT_FAILED:
        if (fd == EAGAIN || fd == EWOULDBLOCK || fd == EINTR || fd == ECONNABORTED)
            break; /* another thread took it, or the peer left */
        w->accept_failed++;
        w->accept_errno = fd;
        if (fd == EMFILE || fd == ENFILE)
            drop_backlog(m, w);
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        w->handshake_failed++;
        break;
    default:
        break;
    }
}

/* Reads one event; 0 when none was waiting. */
static int read_event(ifd_monitor *m, watched *w)
{
    zmq_msg_t a, b;
    zmq_msg_init(&a);
    if (zmq_msg_recv(&a, w->pair, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&a);
        return 0;
    }
    zmq_msg_init(&b);
    if (zmq_msg_more(&a))
        zmq_msg_recv(&b, w->pair, 0); /* the endpoint: the second part comes with the first */
    if (zmq_msg_size(&a) >= 6) {
        uint16_t ev;
        uint32_t value;
        memcpy(&ev, zmq_msg_data(&a), 2);
        memcpy(&value, (const char *)zmq_msg_data(&a) + 2, 4);
        on_event(m, w, ev, value);
    }
    zmq_msg_close(&a);
    zmq_msg_close(&b);
    return 1;
}

static void log_socket(ifd_monitor *m, watched *w, int64_t now)
{
    if (w->refused + w->accept_failed + w->backlog_dropped + w->handshake_failed == 0 ||
        (w->last_log_ns && now - w->last_log_ns < LOG_EVERY_NS))
        return;
    w->last_log_ns = now;
    if (w->refused)
        IFD_LOG_WARN("%s: %" PRId64 " new connection%s closed: the socket is at its limit of %d "
                     "connections (--max-connections)",
                     w->name, w->refused, w->refused == 1 ? "" : "s", m->max_connections);
    if (w->accept_failed) {
        if (w->accept_errno == EMFILE || w->accept_errno == ENFILE)
            IFD_LOG_WARN("%s: cannot accept connections: %s (the descriptor limit is %ld, see "
                         "ulimit -n); %" PRId64 " waiting connection%s closed",
                         w->name, strerror(w->accept_errno), nofile_limit(), w->backlog_dropped,
                         w->backlog_dropped == 1 ? "" : "s");
        else
            IFD_LOG_WARN("%s: %" PRId64 " connection%s could not be accepted: %s", w->name,
                         w->accept_failed, w->accept_failed == 1 ? "" : "s",
                         strerror(w->accept_errno));
    }
    if (w->handshake_failed)
        IFD_LOG_INFO("%s: %" PRId64 " connection%s closed before completing the ZeroMQ "
                     "handshake (timed out, refused, or not ZeroMQ)",
                     w->name, w->handshake_failed, w->handshake_failed == 1 ? "" : "s");
    w->refused = w->accept_failed = w->backlog_dropped = w->handshake_failed = 0;
}

static void check_heap(ifd_monitor *m, int64_t now)
{
    if (now - m->heap_checked_ns < HEAP_EVERY_NS)
        return;
    m->heap_checked_ns = now;
    struct mallinfo2 mi = mallinfo2();
    if (mi.fordblks > FREE_TRIM)
        malloc_trim(0);
    size_t used = mi.uordblks + mi.hblkhd;
    if (m->heap_bound && used > m->heap_bound &&
        (m->heap_warned_ns == 0 || now - m->heap_warned_ns >= HEAP_WARN_NS)) {
        m->heap_warned_ns = now;
        IFD_LOG_WARN("memory: %zu MiB of heap in use, above the bound of %zu MiB "
                     "(docs/protocol.md): peers are holding back the last frames of messages, "
                     "which libzmq buffers without limit",
                     used >> 20, m->heap_bound >> 20);
    }
}

static void *monitor_main(void *arg)
{
    ifd_monitor *m = arg;
    zmq_pollitem_t items[MAX_WATCHED + 1];
    for (int i = 0; i < m->nw; i++)
        items[i] = (zmq_pollitem_t){.socket = m->w[i].pair, .events = ZMQ_POLLIN};
    items[m->nw] = (zmq_pollitem_t){.fd = m->wake, .events = ZMQ_POLLIN};
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        int rc = zmq_poll(items, m->nw + 1, 200);
        for (int i = 0; rc > 0 && i < m->nw; i++)
            if (items[i].revents & ZMQ_POLLIN)
                for (int k = 0; k < 1024 && read_event(m, &m->w[i]); k++)
                    ;
        int64_t now = ifd_clock_ns();
        for (int i = 0; i < m->nw; i++)
            log_socket(m, &m->w[i], now);
        if (m->spare < 0)
            m->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
        check_heap(m, now);
    }
    return NULL;
}

int ifd_monitor_start(ifd_monitor *m, ifd_error *err)
{
    int rc = ifd_thread_start(&m->thread, "ifd-monitor", monitor_main, m);
    if (rc)
        return ifd_error_set(err, rc, "monitor: cannot start its thread");
    m->started = 1;
    return IFD_OK;
}

void ifd_monitor_destroy(ifd_monitor *m)
{
    if (m == NULL)
        return;
    if (m->started) {
        __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
        uint64_t one = 1;
        if (write(m->wake, &one, sizeof one) < 0) /* never full: a stale poll ends in 200 ms */
            IFD_LOG_DEBUG("monitor: cannot wake its thread: %s", strerror(errno));
        ifd_thread_join(&m->thread);
    }
    for (int i = 0; i < m->nw; i++)
        zmq_close(m->w[i].pair);
    if (m->spare >= 0)
        close(m->spare);
    if (m->wake >= 0)
        close(m->wake);
    free(m);
}
