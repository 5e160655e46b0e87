#include "host/publisher_internal.h"
#include "host/conns.h"
#include "host/endpoint.h"
#include "host/security.h"
#include "host/tensor_pool.h"
#include "host/tensor_ring.h"

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
#include <jansson.h>
#include <zmq.h>
#include <sys/eventfd.h>

void ifd_pub_wake(ifd_publisher *p)
{
    __atomic_store_n(&p->unwoken, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->wakes, 1, __ATOMIC_RELAXED);
    uint64_t one = 1;
    ssize_t n = write(p->efd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the thread will wake */
}

void ifd_pub_outmsg_free(outmsg *m)
{
    if (m) {
        ifd_tensor_pool_put(m->data);
        free(m);
    }
}

/* Takes the outbox's head (under mu). */
static outmsg *outbox_pop(ifd_publisher *p)
{
    outmsg *m = p->head;
    p->head = m->next;
    if (p->head == NULL)
        p->tail = NULL;
    p->len--;
    if (ifd_pub_is_tensor(m))
        p->tensor_bytes -= m->bytes;
    return m;
}

/* Queues m (under mu); when the outbox is full the oldest message is not published. */
void ifd_pub_outbox_push(ifd_publisher *p, outmsg *m)
{
    if (p->len == IFD_OUTBOX_MAX) { /* the thread is behind */
        outmsg *old = outbox_pop(p);
        if (ifd_pub_is_tensor(old)) {
            p->tensor_dropped++;
            p->steps_dropped += old->steps;
        } else {
            p->dropped++;
        }
        ifd_pub_outmsg_free(old);
    }
    if (p->tail)
        p->tail->next = m;
    else
        p->head = m;
    p->tail = m;
    p->len++;
    if (ifd_pub_is_tensor(m))
        p->tensor_bytes += m->bytes;
}

static int pub_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    ifd_publisher *p = ctx;
    outmsg *m = malloc(sizeof *m + len + 1);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    *m = (outmsg){.nframes = 1, .len = {len}, .bytes = len};
    memcpy(m->buf, json, len);
    m->buf[len] = '\0';
    /* a step's tensors go before the summary that covers it: what was gathered goes first */
    ifd_mutex_lock(&p->acc_mu);
    int rc = ifd_pub_flush_all(p, err);
    ifd_mutex_lock(&p->mu);
    ifd_pub_outbox_push(p, m);
    ifd_mutex_unlock(&p->mu);
    ifd_mutex_unlock(&p->acc_mu);
    ifd_pub_wake(p);
    return rc;
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
                         ifd_monitor *mon, int max_connections, ifd_mode mode, int64_t tensor_rate,
                         ifd_error *err)
{
    *out = NULL;
    ifd_publisher *p = calloc(1, sizeof *p);
    if (p == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    ifd_mutex_init(&p->mu);
    ifd_mutex_init(&p->acc_mu);
    p->efd = -1;
    int rc;
    if ((p->pool = ifd_tensor_pool_create()) == NULL) {
        rc = ifd_error_set(err, IFD_ENOMEM, "publish");
        goto fail;
    }
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
    p->rate = (double)(tensor_rate > 0 ? tensor_rate : IFD_PUB_TENSOR_RATE);
    p->ring_bytes = IFD_TENSOR_RING_BYTES;
    p->tokens = p->rate;
    p->refill_ns = ifd_clock_ns();
    p->tsink = ifd_pub_tensor_sink(p);
    snprintf(p->mode, sizeof p->mode, "%s", ifd_mode_name(mode));
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

const ifd_tensor_sink *ifd_publisher_tensor_sink(ifd_publisher *p)
{
    return p ? &p->tsink : NULL;
}

/* Sends what the outbox holds; returns whether the thread was asked to stop. */
static int publish(ifd_publisher *p)
{
    ifd_mutex_lock(&p->mu);
    int stopping = p->stopping;
    for (;;) {
        outmsg *m = p->head ? outbox_pop(p) : NULL;
        ifd_mutex_unlock(&p->mu);
        if (m == NULL)
            return stopping;
        /* drops for a slow subscriber; the frames of a message go together or not at all */
        const char *at = m->buf;
        int tensor = ifd_pub_is_tensor(m);
        for (int i = 0; i < m->nframes; i++) {
            int more = i + 1 < m->nframes ? ZMQ_SNDMORE : 0;
            if (i == 2 && m->data) { /* a tensor's data: libzmq gives it back once sent */
                zmq_msg_t d;
                if (zmq_msg_init_data(&d, m->data, m->len[2], ifd_tensor_pool_free, NULL) == 0) {
                    m->data = NULL;
                    if (zmq_msg_send(&d, p->pub, ZMQ_DONTWAIT) < 0)
                        zmq_msg_close(&d);
                    continue;
                }
            }
            zmq_send(p->pub, i == 2 ? m->data : at, m->len[i], ZMQ_DONTWAIT | more);
            at += m->len[i];
        }
        int64_t steps = m->steps;
        int notice = m->nframes == 2, shm_data = tensor && !notice &&
                                                 strncmp(m->buf, IFD_PUB_TENSOR_SHM_PREFIX,
                                                         sizeof IFD_PUB_TENSOR_SHM_PREFIX - 1) == 0;
        ifd_pub_outmsg_free(m);
        ifd_mutex_lock(&p->mu);
        if (tensor) {
            p->tensor_sent++;
            p->steps_sent += steps;
            p->shm_notices += notice;
            p->shm_data += shm_data;
        }
    }
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
            /* counted even when its connection is closed for it: libzmq has applied it, and
             * the connection's end unsubscribes every topic it had */
            ifd_pub_count_subscription(p, d + 1, zmq_msg_size(&m) - 1, 1);
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
            ifd_pub_count_subscription(p, d + 1, zmq_msg_size(&m) - 1, 0);
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
    ifd_error err;
    ifd_mutex_lock(&p->acc_mu); /* what was gathered goes out with the rest */
    if (ifd_pub_flush_all(p, &err) != IFD_OK)
        IFD_LOG_WARN("publish: %s", err.msg);
    ifd_mutex_unlock(&p->acc_mu);
    ifd_mutex_lock(&p->mu);
    p->stopping = 1;
    ifd_mutex_unlock(&p->mu);
    ifd_pub_wake(p);
    ifd_thread_join(&p->thread);
    p->started = 0;
    if (p->dropped)
        IFD_LOG_WARN("publish: %" PRId64 " summaries were not published (the outbox was full)",
                     p->dropped);
    if (p->tensor_dropped || p->tensor_limited)
        IFD_LOG_INFO("publish: %" PRId64 " tensor messages sent (%" PRId64
                     " tensor steps), %" PRId64 " not (%" PRId64 " tensor steps: %" PRId64
                     " messages over the byte rate or "
                     "the outbox's bytes, %" PRId64 " behind in the outbox)",
                     p->tensor_sent, p->steps_sent, p->tensor_dropped + p->tensor_limited,
                     p->steps_dropped + p->steps_limited, p->tensor_limited, p->tensor_dropped);
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
        ifd_pub_outmsg_free(m);
    }
    for (int i = 0; i < p->naccs; i++)
        ifd_tensor_pool_put(p->accs[i].data);
    free(p->accs);
    ifd_tensor_ring_destroy(p->ring); /* a subscriber's mapping keeps its pages till unmapped */
    ifd_tensor_pool_destroy(p->pool); /* freed once libzmq gives back what it holds */
    ifd_conns_destroy(p->conns);      /* libzmq waits on a monitor event nobody reads */
    if (p->pub)
        zmq_close(p->pub);
    if (p->efd >= 0)
        close(p->efd);
    ifd_mutex_fini(&p->mu);
    ifd_mutex_fini(&p->acc_mu);
    free(p);
}
