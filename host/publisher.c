#include "host/publisher.h"
#include "host/conns.h"
#include "host/endpoint.h"
#include "host/security.h"

#include "core/log.h"
#include "core/thread.h"
#include "host/limits.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#include <sys/eventfd.h>

typedef struct outmsg {
    struct outmsg *next;
    size_t len;
    char json[];
} outmsg;

struct ifd_publisher {
    void *pub;
    ifd_conns *conns; /* its connections and their subscriptions (this thread's) */
    int efd;
    ifd_sink *sink;
    ifd_thread thread;
    int started;
    ifd_mutex mu;
    outmsg *head, *tail; /* under mu */
    size_t len;          /* under mu */
    int64_t dropped;     /* under mu */
    int stopping;        /* under mu */
    char bound[IFD_ENDPOINT_MAX];
};

static void wake(ifd_publisher *p)
{
    uint64_t one = 1;
    ssize_t n = write(p->efd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the thread will wake */
}

static int pub_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    ifd_publisher *p = ctx;
    outmsg *m = malloc(sizeof *m + len + 1);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    m->next = NULL;
    m->len = len;
    memcpy(m->json, json, len);
    m->json[len] = '\0';
    ifd_mutex_lock(&p->mu);
    if (p->len == IFD_OUTBOX_MAX) { /* the thread is behind: the oldest is not published */
        outmsg *old = p->head;
        p->head = old->next;
        p->len--;
        p->dropped++;
        free(old);
        if (p->head == NULL)
            p->tail = NULL;
    }
    if (p->tail)
        p->tail->next = m;
    else
        p->head = m;
    p->tail = m;
    p->len++;
    ifd_mutex_unlock(&p->mu);
    wake(p);
    return IFD_OK;
}

static int pub_flush(void *ctx, ifd_error *err)
{
    (void)ctx;
    (void)err;
    return IFD_OK;
}

static void pub_destroy(void *ctx)
{
    (void)ctx;
}

static const ifd_sink_ops pub_ops = {
    .write = pub_write, .flush = pub_flush, .destroy = pub_destroy};

int ifd_publisher_create(ifd_publisher **out, void *zctx, const char *endpoint, ifd_security *sec,
                         ifd_monitor *mon, int max_connections, ifd_error *err)
{
    *out = NULL;
    ifd_publisher *p = calloc(1, sizeof *p);
    if (p == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    ifd_mutex_init(&p->mu);
    p->efd = -1;
    int rc;
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        rc = ifd_error_set(err, IFD_EIO, "publish: eventfd: %s", strerror(errno));
        goto fail;
    }
    p->pub = zmq_socket(zctx, ZMQ_XPUB);
    if (p->pub == NULL) {
        rc = ifd_error_set(err, IFD_EIO, "publish: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* XPUB, verbose: every subscription and unsubscription is read here, with its connection's
     * descriptor, so that each connection's are counted (IFD_PUB_SUBS_MAX) */
    int linger = 1000, sndhwm = IFD_PUB_SNDHWM, rcvhwm = IFD_PUB_RCVHWM, hs = IFD_HANDSHAKE_IVL_MS,
        verboser = 1, rcvbuf = IFD_PUB_RCVBUF;
    /* a subscriber sends little; a small kernel buffer bounds what it has sent and libzmq will
     * still read once its connection is closed for too many subscriptions */
    zmq_setsockopt(p->pub, ZMQ_RCVBUF, &rcvbuf, sizeof rcvbuf);
    zmq_setsockopt(p->pub, ZMQ_XPUB_VERBOSER, &verboser, sizeof verboser);
    int64_t maxmsg = IFD_PUB_MAXMSGSIZE; /* a subscription: 1 byte and the prefix */
    zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(p->pub, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
    zmq_setsockopt(p->pub, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
    zmq_setsockopt(p->pub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(p->pub, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
    if ((rc = ifd_security_apply(sec, p->pub, IFD_SOCK_PUBLISH, err)) != IFD_OK)
        goto fail;
    /* a subscriber over the limit takes the place of a connection without a subscription */
    ifd_conns_rules rules = {.max = max_connections,
                             .idle_ns = IFD_HANDSHAKE_IVL_MS * 1000000LL,
                             .idle = "no subscription on it"};
    if ((rc = ifd_conns_create(&p->conns, mon, zctx, p->pub, "publish", &rules, err)))
        goto fail;
    if ((rc = ifd_endpoint_bind(p->pub, "publish", endpoint, 0, p->bound, sizeof p->bound, err)) !=
        IFD_OK)
        goto fail;
    rc = ifd_sink_create(&p->sink, &pub_ops, p);
    if (rc) {
        ifd_error_set(err, rc, "publish: sink");
        goto fail;
    }
    *out = p;
    return IFD_OK;
fail:
    ifd_publisher_destroy(p);
    return rc;
}

const char *ifd_publisher_endpoint(const ifd_publisher *p)
{
    return p->bound;
}

ifd_sink *ifd_publisher_sink(ifd_publisher *p)
{
    return p ? p->sink : NULL;
}

/* Sends what the outbox holds; returns whether the thread was asked to stop. */
static int publish(ifd_publisher *p)
{
    ifd_mutex_lock(&p->mu);
    outmsg *m = p->head;
    p->head = p->tail = NULL;
    p->len = 0;
    int stopping = p->stopping;
    ifd_mutex_unlock(&p->mu);
    while (m) {
        outmsg *next = m->next;
        zmq_send(p->pub, m->json, m->len, ZMQ_DONTWAIT); /* drops for a slow subscriber */
        free(m);
        m = next;
    }
    return stopping;
}

/* Reads what subscribers sent (libzmq has applied each subscription already): each
 * connection's subscriptions are counted, and one that goes beyond IFD_PUB_SUBS_MAX is closed,
 * which drops them all (a subscription of 1 KiB costs libzmq's trie about 48 KiB). Anything
 * else (an XSUB peer's messages) is dropped. */
static void read_subscriptions(ifd_publisher *p)
{
    for (int k = 0; k < 4096; k++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->pub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        const uint8_t *d = zmq_msg_data(&m);
        int fd = zmq_msg_get(&m, ZMQ_SRCFD);
        if (zmq_msg_size(&m) >= 1 && d[0] == 1) {
            if (ifd_conns_marks(p->conns, fd) >= IFD_PUB_SUBS_MAX) {
                char why[128];
                snprintf(why, sizeof why,
                         "a subscriber made more than %d subscriptions (each costs the daemon "
                         "memory until it leaves)",
                         IFD_PUB_SUBS_MAX);
                ifd_conns_close(p->conns, fd, why);
            } else {
                ifd_conns_mark(p->conns, fd);
            }
        } else if (zmq_msg_size(&m) >= 1 && d[0] == 0) {
            ifd_conns_unmark(p->conns, fd, IFD_CONNS_NOW);
        }
        zmq_msg_close(&m);
    }
}

static void *publisher_main(void *arg)
{
    ifd_publisher *p = arg;
    /* Polling the socket makes libzmq process its commands: new subscribers and their
     * subscriptions are taken while no summary is sent. */
    zmq_pollitem_t items[3] = {{.fd = p->efd, .events = ZMQ_POLLIN},
                               {.socket = p->pub, .events = ZMQ_POLLIN},
                               {.socket = ifd_conns_pollable(p->conns), .events = ZMQ_POLLIN}};
    for (;;) {
        int rc = zmq_poll(items, 3, 100);
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN)) {
            uint64_t v;
            ssize_t r = read(p->efd, &v, sizeof v);
            (void)r;
        }
        ifd_conns_update(p->conns); /* before the subscriptions: their connections are known */
        read_subscriptions(p);
        if (publish(p))
            return NULL;
    }
}

int ifd_publisher_start(ifd_publisher *p, ifd_error *err)
{
    int rc = ifd_thread_start(&p->thread, "ifd-publish", publisher_main, p);
    if (rc)
        return ifd_error_set(err, rc, "publish: cannot start its thread");
    p->started = 1;
    return IFD_OK;
}

void ifd_publisher_stop(ifd_publisher *p)
{
    if (p == NULL || !p->started)
        return;
    ifd_mutex_lock(&p->mu);
    p->stopping = 1;
    ifd_mutex_unlock(&p->mu);
    wake(p);
    ifd_thread_join(&p->thread);
    p->started = 0;
    if (p->dropped)
        IFD_LOG_WARN("publish: %" PRId64 " summaries were not published (the outbox was full)",
                     p->dropped);
}

void ifd_publisher_destroy(ifd_publisher *p)
{
    if (p == NULL)
        return;
    ifd_publisher_stop(p);
    if (p->sink)
        ifd_sink_destroy(p->sink);
    while (p->head) {
        outmsg *m = p->head;
        p->head = m->next;
        free(m);
    }
    ifd_conns_destroy(p->conns); /* libzmq waits on a monitor event nobody reads */
    if (p->pub)
        zmq_close(p->pub);
    if (p->efd >= 0)
        close(p->efd);
    ifd_mutex_fini(&p->mu);
    free(p);
}
