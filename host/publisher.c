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
#include <jansson.h>
#include <zmq.h>
#include <sys/eventfd.h>

/* A message waiting for the publisher thread: a summary (one frame, JSON) or a tensor (three
 * frames: topic, JSON header, data), its frames one after another in buf. */
typedef struct outmsg {
    struct outmsg *next;
    int nframes;
    size_t len[3];
    size_t bytes; /* of the frames together */
    char buf[];
} outmsg;

/* A tensor some subscriber asked for ("tensor:NAME"), with its subscriptions counted. */
typedef struct wanted_tensor {
    char name[IFD_PUB_TOPIC_MAX];
    int subs;
} wanted_tensor;

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
    /* Tensor messages (under mu): the tensors asked for, the bytes waiting in the outbox, the
     * token bucket of the byte rate, and the messages not published. */
    wanted_tensor wanted[IFD_PUB_TENSORS_MAX];
    int nwanted; /* written under mu, atomically; read without it by the outfeed thread */
    size_t tensor_bytes;
    double rate, tokens; /* bytes a second; bytes it may send now */
    int64_t refill_ns;
    int64_t tensor_sent, tensor_dropped, tensor_limited;
    size_t largest; /* the largest tensor message so far */
    ifd_tensor_sink tsink;
    char mode[16]; /* the run's, in the tensor messages' headers */
    char bound[IFD_ENDPOINT_MAX];
};

static void wake(ifd_publisher *p)
{
    uint64_t one = 1;
    ssize_t n = write(p->efd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the thread will wake */
}

static outmsg *outmsg_new(int nframes, const size_t *len, const void *const *frames)
{
    size_t bytes = 0;
    for (int i = 0; i < nframes; i++)
        bytes += len[i];
    outmsg *m = malloc(sizeof *m + bytes + 1);
    if (m == NULL)
        return NULL;
    m->next = NULL;
    m->nframes = nframes;
    m->bytes = bytes;
    char *at = m->buf;
    for (int i = 0; i < nframes; i++) {
        m->len[i] = len[i];
        memcpy(at, frames[i], len[i]);
        at += len[i];
    }
    *at = '\0';
    return m;
}

static int is_tensor(const outmsg *m)
{
    return m->nframes > 1;
}

/* Takes the outbox's head (under mu). */
static outmsg *outbox_pop(ifd_publisher *p)
{
    outmsg *m = p->head;
    p->head = m->next;
    if (p->head == NULL)
        p->tail = NULL;
    p->len--;
    if (is_tensor(m))
        p->tensor_bytes -= m->bytes;
    return m;
}

/* Queues m (under mu); when the outbox is full the oldest message is not published. */
static void outbox_push(ifd_publisher *p, outmsg *m)
{
    if (p->len == IFD_OUTBOX_MAX) { /* the thread is behind */
        outmsg *old = outbox_pop(p);
        if (is_tensor(old))
            p->tensor_dropped++;
        else
            p->dropped++;
        free(old);
    }
    if (p->tail)
        p->tail->next = m;
    else
        p->head = m;
    p->tail = m;
    p->len++;
    if (is_tensor(m))
        p->tensor_bytes += m->bytes;
}

static int pub_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    ifd_publisher *p = ctx;
    const void *frame = json;
    outmsg *m = outmsg_new(1, &len, &frame);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    ifd_mutex_lock(&p->mu);
    outbox_push(p, m);
    ifd_mutex_unlock(&p->mu);
    wake(p);
    return IFD_OK;
}

/* ---- tensor messages ------------------------------------------------------------------------ */

static wanted_tensor *find_wanted(ifd_publisher *p, const char *name)
{
    for (int i = 0; i < p->nwanted; i++)
        if (strcmp(p->wanted[i].name, name) == 0)
            return &p->wanted[i];
    return NULL;
}

int ifd_publisher_tensor_wanted(ifd_publisher *p, const char *name)
{
    ifd_mutex_lock(&p->mu);
    int yes = find_wanted(p, name) != NULL;
    ifd_mutex_unlock(&p->mu);
    return yes;
}

/* Whether the byte rate lets a message of n bytes go now (under mu): a token bucket of a
 * second's worth. */
static int rate_allows(ifd_publisher *p, size_t n)
{
    int64_t now = ifd_clock_ns();
    p->tokens += p->rate * (double)(now - p->refill_ns) / 1e9;
    if (p->tokens > p->rate)
        p->tokens = p->rate;
    p->refill_ns = now;
    if (p->tokens < (double)n)
        return 0;
    p->tokens -= (double)n;
    return 1;
}

/* The tensor message's JSON header into buf (names are plain: IFD_NAME_MAX characters of a
 * program's declaration, no quote or backslash, and the mode's and dtype's names). */
static int tensor_header(char *buf, size_t len, const char *mode, int64_t step, const char *name,
                         const ifd_tensor *t)
{
    int n =
        snprintf(buf, len,
                 "{\"event\":\"tensor\",\"mode\":\"%s\",\"name\":\"%s\",\"global_step\":%" PRId64
                 ",\"dtype\":\"%s\",\"shape\":[",
                 mode, name, step, ifd_dtype_name(t->dtype));
    for (int i = 0; i < t->shape.rank && n > 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, "%s%" PRId64, i ? "," : "", t->shape.dims[i]);
    if (n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, "]}");
    return n > 0 && (size_t)n < len ? n : -1;
}

/* One tensor of one step. It is dropped, never waited for, when the byte rate or the outbox's
 * bytes would be exceeded. */
static int publish_tensor(ifd_publisher *p, const char *mode, int64_t step, const char *name,
                          const ifd_tensor *t, int *pushed, ifd_error *err)
{
    char topic[IFD_PUB_TOPIC_MAX + 8];
    int tn = snprintf(topic, sizeof topic, "tensor:%s", name);
    char header[256];
    int hn = tensor_header(header, sizeof header, mode, step, name, t);
    if (hn < 0)
        return ifd_error_set(err, IFD_EINTERNAL, "publish: tensor '%s': its header", name);
    size_t len[3] = {(size_t)tn, (size_t)hn, ifd_tensor_nbytes(t)};
    size_t bytes = len[0] + len[1] + len[2];
    ifd_mutex_lock(&p->mu);
    int go = find_wanted(p, name) && !p->stopping;
    if (go && (p->tensor_bytes + bytes > IFD_PUB_TENSOR_OUTBOX_BYTES || !rate_allows(p, bytes))) {
        p->tensor_limited++;
        go = 0;
    }
    int grew = go && bytes > 2 * p->largest;
    if (go && bytes > p->largest)
        p->largest = bytes;
    ifd_mutex_unlock(&p->mu);
    if (grew) /* the bound, said again whenever the largest message doubles */
        IFD_LOG_INFO("publish: tensor messages hold at most %.1f MiB waiting in the outbox and "
                     "%.1f MiB a subscriber in ZeroMQ's queue (%d messages of up to %zu bytes; "
                     "docs/summaries.md, \"Tensor messages\")",
                     (double)IFD_PUB_TENSOR_OUTBOX_BYTES / 1048576.0,
                     (double)IFD_PUB_SNDHWM * (double)bytes / 1048576.0, IFD_PUB_SNDHWM, bytes);
    if (!go)
        return IFD_OK;
    const void *frames[3] = {topic, header, t->data};
    outmsg *m = outmsg_new(3, len, frames);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish: tensor '%s'", name);
    ifd_mutex_lock(&p->mu);
    outbox_push(p, m);
    ifd_mutex_unlock(&p->mu);
    *pushed = 1;
    return IFD_OK;
}

/* The session's, before each loop: whether any subscriber asks for a tensor. */
static int tensor_wants(void *ctx)
{
    ifd_publisher *p = ctx;
    return __atomic_load_n(&p->nwanted, __ATOMIC_RELAXED) > 0;
}

/* The outfeed thread's tensor sink: the step's tensors that some subscriber asked for. */
static int tensor_write(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    ifd_publisher *p = ctx;
    if (__atomic_load_n(&p->nwanted, __ATOMIC_RELAXED) == 0)
        return IFD_OK; /* the usual case, without a lock */
    int pushed = 0, rc = IFD_OK;
    for (int i = 0; i < t->ntensors && rc == IFD_OK; i++)
        if (ifd_publisher_tensor_wanted(p, t->names[i]))
            rc = publish_tensor(p, p->mode, t->global_step, t->names[i], &t->tensors[i], &pushed,
                                err);
    if (pushed)
        wake(p); /* once a step */
    return rc;
}

/* A subscription (on = 1) or its end (0) to topic: counted when it asks for a tensor. */
static void count_subscription(ifd_publisher *p, const uint8_t *topic, size_t n, int on)
{
    static const char prefix[] = IFD_PUB_TENSOR_PREFIX;
    size_t pn = sizeof prefix - 1;
    if (n <= pn || n - pn >= IFD_PUB_TOPIC_MAX || memcmp(topic, prefix, pn) != 0 ||
        memchr(topic + pn, '\0', n - pn))
        return;
    char name[IFD_PUB_TOPIC_MAX];
    memcpy(name, topic + pn, n - pn);
    name[n - pn] = '\0';
    ifd_mutex_lock(&p->mu);
    wanted_tensor *w = find_wanted(p, name);
    if (on && w == NULL && p->nwanted < IFD_PUB_TENSORS_MAX) {
        w = &p->wanted[p->nwanted];
        __atomic_store_n(&p->nwanted, p->nwanted + 1, __ATOMIC_RELAXED);
        snprintf(w->name, sizeof w->name, "%s", name);
        w->subs = 0;
        IFD_LOG_INFO("publish: a subscriber asked for tensor '%s'", name);
    }
    if (w && (w->subs += on ? 1 : -1) <= 0) {
        *w = p->wanted[p->nwanted - 1];
        __atomic_store_n(&p->nwanted, p->nwanted - 1, __ATOMIC_RELAXED);
    }
    ifd_mutex_unlock(&p->mu);
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
    p->rate = (double)(tensor_rate > 0 ? tensor_rate : IFD_PUB_TENSOR_RATE);
    p->tokens = p->rate;
    p->refill_ns = ifd_clock_ns();
    p->tsink = (ifd_tensor_sink){.write = tensor_write, .ctx = p, .wants = tensor_wants};
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

void ifd_publisher_tensor_stats(ifd_publisher *p, ifd_publisher_tensors *st)
{
    ifd_mutex_lock(&p->mu);
    st->subscribed = p->nwanted;
    st->sent = p->tensor_sent;
    st->dropped = p->tensor_dropped;
    st->limited = p->tensor_limited;
    st->outbox_bytes = (int64_t)p->tensor_bytes;
    st->largest = (int64_t)p->largest;
    st->rate = (int64_t)p->rate;
    ifd_mutex_unlock(&p->mu);
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
        for (int i = 0; i < m->nframes; i++) {
            zmq_send(p->pub, at, m->len[i], ZMQ_DONTWAIT | (i + 1 < m->nframes ? ZMQ_SNDMORE : 0));
            at += m->len[i];
        }
        int tensor = is_tensor(m);
        free(m);
        ifd_mutex_lock(&p->mu);
        if (tensor)
            p->tensor_sent++;
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
            count_subscription(p, d + 1, zmq_msg_size(&m) - 1, 1);
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
            count_subscription(p, d + 1, zmq_msg_size(&m) - 1, 0);
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
    if (p->tensor_dropped || p->tensor_limited)
        IFD_LOG_INFO("publish: %" PRId64 " tensor messages sent, %" PRId64 " not (%" PRId64
                     " over the byte rate or the outbox's bytes, %" PRId64 " behind in the outbox)",
                     p->tensor_sent, p->tensor_dropped + p->tensor_limited, p->tensor_limited,
                     p->tensor_dropped);
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
