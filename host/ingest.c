#include "host/ingest.h"

#include "core/log.h"
#include "core/thread.h"
#include "core/wire.h"
#include "infeed/checkpoint.h"
#include "infeed/infeed_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_PARTS (IFD_MAX_INPUTS + 2) /* routing id, header, tensors */
#define RECV_BURST 256                 /* messages handled before polling the others again */
#define OUTBOX_MAX 4096                /* summaries waiting for the PUB socket */
#define STOP_GRACE_NS 1000000000LL     /* a stop waits this long for input before closing it */
#define RID_MAX 256
#define STARVE_WARN_NS 5000000000LL /* a starving infeed is logged after waiting this long */

typedef struct host_batch host_batch;

/* A producer's connection: its ROUTER routing id. */
typedef struct producer_rid {
    const uint8_t *rid;
    size_t len;
} producer_rid;

typedef struct producer {
    int used;
    char name[IFD_PROTO_NAME_MAX + 1];
    uint8_t rid[RID_MAX];
    size_t rid_len;
    int welcomed, ended;
    int replica;      /* per-core input: the replica its batches are for; -1 otherwise */
    int counted_end;  /* counted in ended_total (once per name) */
    int credit;       /* batches it may still send */
    int in_flight;    /* accepted, not acknowledged */
    int64_t last_seq; /* highest accepted */
    int64_t acked_seq;
    int64_t accepted, rejected;
    int pos;                 /* its entry in the position table */
    host_batch *head, *tail; /* accepted, in order, until acknowledged */
} producer;

/* A batch's PREDICTION (predict mode), made on the outfeed thread and sent by the I/O thread
 * just before the ACK that covers the batch. */
typedef struct prediction_msg {
    uint8_t hdr[IFD_PROTO_BATCH_HDR];
    char *json; /* the tensors' names, dtypes and per-row shapes */
    int ntensors;
    size_t len[IFD_MAX_PREDICTION_TENSORS];
    void *data[IFD_MAX_PREDICTION_TENSORS];
} prediction_msg;

/* A producer name's position: the highest seq handed to the infeed (so consumed by a completed
 * step once the loop that took it has ended), or the one a resumed checkpoint recorded; -1:
 * none. Kept for every name welcomed in this run or restored, never removed. */
typedef struct position {
    char name[IFD_PROTO_NAME_MAX + 1];
    int64_t seq;
} position;

struct host_batch {
    ifd_batch b;
    prediction_msg *pred; /* written before the release, read after it (done) */
    ifd_ingest *g;
    producer *p;
    int pos;  /* the producer's position entry */
    int done; /* atomic: released by the runtime */
    int nframes;
    zmq_msg_t frames[IFD_MAX_INPUTS];
    void *copies[IFD_MAX_INPUTS];
    char name[IFD_PROTO_NAME_MAX + 1];
    host_batch *pnext; /* the producer's list */
    host_batch *qnext; /* the source FIFO */
};

/* One FIFO of the batch source: the only one, or replica r's in per-core mode. */
typedef struct src_lane {
    host_batch *head, *tail;   /* under qmu */
    size_t len;                /* under qmu */
    host_batch *bhead, *btail; /* I/O thread: accepted during this receive burst */
} src_lane;

typedef struct outmsg {
    struct outmsg *next;
    size_t len;
    char json[];
} outmsg;

struct ifd_ingest {
    const ifd_daemon_config *cfg;
    int *signals; /* atomic */
    void *zctx;
    void *router, *pub, *rep;
    int efd;
    ifd_session *session;
    const ifd_program *program;
    /* the program inputs a batch carries in this mode (predict: no labels), in frame order */
    int nin;
    const ifd_input_spec *in[IFD_MAX_INPUTS];
    ifd_thread thread;
    int started;
    size_t max_frame;
    int credit;         /* per producer: cfg->credit, or the auto credit for the batch size */
    int64_t batch_rows; /* rows every batch must have (ifd_input_batch_rows) */

    producer *producers;
    int64_t next_anon;
    int ever_welcomed;
    int ended_total; /* producers (names) that sent END at least once */
    /* for the watchdog's sentence (another thread): welcomed and not ended, and ended_total */
    int watch_connected, watch_ended; /* atomic */
    int input_closed;
    int handled_signals;
    int64_t stop_ns; /* when a stop was asked, 0: none */
    int64_t accepted, rejected, copied_bytes;
    double steps_per_sec, examples_per_sec;
    int64_t rate_t0, rate_step0;

    int64_t starve_warned_ns; /* the last starvation warning about the current wait */

    /* the source FIFOs: one, or one per replica in per-core mode (batches accepted during one
     * receive burst are pushed together, with one wake-up) */
    ifd_mutex qmu;
    ifd_cond qcv;
    int nlanes;
    src_lane *lanes;
    int qclosed, qaborted;
    position *pos; /* the position table, also under qmu */
    int npos, cap_pos;

    /* the outbox, from other threads */
    ifd_mutex omu;
    outmsg *ohead, *otail;
    size_t olen;
    int64_t odropped;
    int acks_pending; /* atomic */
    int finishing;    /* under omu */
    int fin_code;
    char fin_reason[32];
    char fin_message[512];

    ifd_sink *pub_sink;
};

/* ---- small helpers ------------------------------------------------------------------------ */

void ifd_ingest_wake(ifd_ingest *g)
{
    uint64_t one = 1;
    ssize_t n = write(g->efd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the thread will wake */
}

static int zerr(ifd_error *err, const char *what, const char *endpoint)
{
    return ifd_error_set(err, IFD_EIO, "%s: cannot bind '%s': %s", what, endpoint,
                         zmq_strerror(zmq_errno()));
}

static void send_parts(ifd_ingest *g, const producer_rid *to, const void *hdr, size_t hlen,
                       const char *json)
{
    int rc = zmq_send(g->router, to->rid, to->len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (rc >= 0)
        rc = zmq_send(g->router, hdr, hlen, (json ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
    if (rc >= 0 && json)
        rc = zmq_send(g->router, json, strlen(json), ZMQ_DONTWAIT);
    if (rc < 0)
        IFD_LOG_WARN("ingest: a reply (type %u) was not sent: %s",
                     (unsigned)((const uint8_t *)hdr)[6], zmq_strerror(zmq_errno()));
}

static void send_json(ifd_ingest *g, const producer_rid *to, int type, json_t *j)
{
    uint8_t hdr[IFD_PROTO_HDR];
    ifd_proto_header(hdr, type);
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (text) {
        send_parts(g, to, hdr, sizeof hdr, text);
        free(text);
    }
}

/* Printable ASCII kept, every other byte written as \xHH, always terminated. */
static void ascii_escape(const char *in, char *out, size_t len)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 5 < len; p++) {
        if (*p >= 0x20 && *p < 0x7f)
            out[o++] = (char)*p;
        else
            o += (size_t)snprintf(out + o, len - o, "\\x%02x", *p);
    }
    out[o] = '\0';
}

/* ERROR: code, seq (< 0: null), credit returned, and the sentence. */
static void send_error(ifd_ingest *g, const producer_rid *to, int code, int64_t seq, int credit,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void send_error(ifd_ingest *g, const producer_rid *to, int code, int64_t seq, int credit,
                       const char *fmt, ...)
{
    char msg[IFD_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    IFD_LOG_DEBUG("ERROR %s: %s", ifd_errname(code), msg);
    json_t *j = json_object();
    const char *name = ifd_errname(code);
    if (strncmp(name, "IFD_", 4) == 0) /* the wire names are ESHAPE, EPROTO, ... */
        name += 4;
    json_object_set_new(j, "code", json_string(name));
    json_object_set_new(j, "seq", seq >= 0 ? json_integer(seq) : json_null());
    json_object_set_new(j, "credit", json_integer(credit));
    json_t *text = json_string(msg);
    if (text == NULL) { /* not UTF-8: bytes a peer sent, quoted back; escape them */
        char safe[IFD_ERROR_MSG_MAX * 2];
        ascii_escape(msg, safe, sizeof safe);
        text = json_string(safe);
    }
    json_object_set_new(j, "message", text);
    send_json(g, to, IFD_MSG_ERROR, j);
}

static void send_credit_msg(ifd_ingest *g, const producer_rid *to, int type, int64_t seq)
{
    uint8_t hdr[IFD_PROTO_ACK_HDR];
    size_t len = type == IFD_MSG_ACK ? ifd_proto_ack(hdr, seq, 1) : ifd_proto_credit(hdr, 1);
    send_parts(g, to, hdr, len, NULL);
}

static producer_rid rid_of(const producer *p)
{
    producer_rid r = {.rid = p->rid, .len = p->rid_len};
    return r;
}

static producer *find_by_rid(ifd_ingest *g, const producer_rid *r)
{
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        if (p->used && p->rid_len == r->len && memcmp(p->rid, r->rid, r->len) == 0)
            return p;
    }
    return NULL;
}

static producer *find_by_name(ifd_ingest *g, const char *name)
{
    for (int i = 0; i < g->cfg->max_producers; i++)
        if (g->producers[i].used && strcmp(g->producers[i].name, name) == 0)
            return &g->producers[i];
    return NULL;
}

/* The index of name's position entry, added (seq -1, or seq when given >= 0) when missing; -1
 * when out of memory. Locks qmu: the infeed thread updates the table in src_pop. */
static int position_index(ifd_ingest *g, const char *name, int64_t *seq)
{
    ifd_mutex_lock(&g->qmu);
    int i = 0;
    while (i < g->npos && strcmp(g->pos[i].name, name) != 0)
        i++;
    if (i == g->npos) {
        if (g->npos == g->cap_pos) {
            int cap = g->cap_pos ? 2 * g->cap_pos : 16;
            position *t = realloc(g->pos, (size_t)cap * sizeof *t);
            if (t == NULL) {
                ifd_mutex_unlock(&g->qmu);
                return -1;
            }
            g->pos = t;
            g->cap_pos = cap;
        }
        snprintf(g->pos[i].name, sizeof g->pos[i].name, "%s", name);
        g->pos[i].seq = -1;
        g->npos++;
    }
    if (*seq > g->pos[i].seq)
        g->pos[i].seq = *seq;
    *seq = g->pos[i].seq;
    ifd_mutex_unlock(&g->qmu);
    return i;
}

/* A free slot, reusing one whose producer ended with nothing in flight. */
static producer *new_slot(ifd_ingest *g)
{
    for (int i = 0; i < g->cfg->max_producers; i++)
        if (!g->producers[i].used)
            return &g->producers[i];
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        if (p->ended && p->in_flight == 0) {
            memset(p, 0, sizeof *p);
            return p;
        }
    }
    return NULL;
}

/* ---- the batch source ----------------------------------------------------------------------- */

static void host_batch_free_frames(host_batch *hb)
{
    for (int i = 0; i < hb->nframes; i++) {
        zmq_msg_close(&hb->frames[i]);
        free(hb->copies[i]);
        hb->copies[i] = NULL;
    }
    hb->nframes = 0;
}

static void prediction_free(prediction_msg *m)
{
    if (m == NULL)
        return;
    free(m->json);
    for (int i = 0; i < m->ntensors; i++)
        free(m->data[i]);
    free(m);
}

/* Frees an acknowledged or abandoned batch. */
static void host_batch_free(host_batch *hb)
{
    host_batch_free_frames(hb);
    prediction_free(hb->pred);
    free(hb);
}

/* The runtime's release: any thread, once. */
static void host_batch_release(ifd_batch *b, void *arg)
{
    (void)b;
    host_batch *hb = arg;
    ifd_ingest *g = hb->g;
    host_batch_free_frames(hb);
    __atomic_store_n(&hb->done, 1, __ATOMIC_RELEASE);
    if (__atomic_exchange_n(&g->acks_pending, 1, __ATOMIC_ACQ_REL) == 0)
        ifd_ingest_wake(g);
}

static int src_pop(ifd_ingest *g, int lane, ifd_batch **out, int wait, ifd_error *err)
{
    if (lane < 0 || lane >= g->nlanes)
        return ifd_error_set(err, IFD_EINVAL, "batch source: replica %d: expected 0 to %d", lane,
                             g->nlanes - 1);
    src_lane *l = &g->lanes[lane];
    ifd_mutex_lock(&g->qmu);
    while (wait && l->head == NULL && !g->qclosed && !g->qaborted)
        ifd_cond_wait(&g->qcv, &g->qmu);
    int rc;
    if (g->qaborted) {
        rc = IFD_ESTOPPED;
    } else if (l->head) {
        host_batch *hb = l->head;
        l->head = hb->qnext;
        if (l->head == NULL)
            l->tail = NULL;
        l->len--;
        if (hb->b.seq > g->pos[hb->pos].seq)
            g->pos[hb->pos].seq = hb->b.seq;
        *out = &hb->b;
        rc = IFD_OK;
    } else {
        rc = g->qclosed ? IFD_EEOF : IFD_ETIMEDOUT;
    }
    ifd_mutex_unlock(&g->qmu);
    return rc;
}

static int src_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    return src_pop(ctx, 0, out, 1, err);
}

static int src_try_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    return src_pop(ctx, 0, out, 0, err);
}

static int src_next_for(void *ctx, int replica, ifd_batch **out, ifd_error *err)
{
    return src_pop(ctx, replica, out, 1, err);
}

static int src_try_next_for(void *ctx, int replica, ifd_batch **out, ifd_error *err)
{
    return src_pop(ctx, replica, out, 0, err);
}

static void src_abort(void *ctx)
{
    ifd_ingest *g = ctx;
    ifd_mutex_lock(&g->qmu);
    g->qaborted = 1;
    ifd_cond_broadcast(&g->qcv);
    ifd_mutex_unlock(&g->qmu);
}

/* I/O thread: queues hb for the next src_flush, in its replica's FIFO in per-core mode. */
static void src_push(ifd_ingest *g, host_batch *hb)
{
    src_lane *l = &g->lanes[g->nlanes > 1 ? hb->b.replica : 0];
    hb->qnext = NULL;
    if (l->btail)
        l->btail->qnext = hb;
    else
        l->bhead = hb;
    l->btail = hb;
}

/* I/O thread: hands the batches of a receive burst to the infeed thread with one wake-up. */
static void src_flush(ifd_ingest *g)
{
    int any = 0;
    for (int i = 0; i < g->nlanes; i++)
        any |= g->lanes[i].bhead != NULL;
    if (!any)
        return;
    ifd_mutex_lock(&g->qmu);
    for (int i = 0; i < g->nlanes; i++) {
        src_lane *l = &g->lanes[i];
        if (l->bhead == NULL)
            continue;
        size_t n = 0;
        for (host_batch *hb = l->bhead; hb; hb = hb->qnext)
            n++;
        if (l->tail)
            l->tail->qnext = l->bhead;
        else
            l->head = l->bhead;
        l->tail = l->btail;
        l->len += n;
        l->bhead = l->btail = NULL;
    }
    /* One consumer (the infeed thread), waiting for one FIFO: a wake-up for another FIFO's batch
     * makes it check again and wait on. */
    ifd_cond_signal(&g->qcv);
    ifd_mutex_unlock(&g->qmu);
}

static void close_input(ifd_ingest *g, const char *why)
{
    if (g->input_closed)
        return;
    src_flush(g);
    g->input_closed = 1;
    IFD_LOG_INFO("input closed: %s", why);
    ifd_mutex_lock(&g->qmu);
    g->qclosed = 1;
    ifd_cond_broadcast(&g->qcv);
    ifd_mutex_unlock(&g->qmu);
}

static const ifd_batch_source_ops src_ops = {
    .next = src_next,
    .abort = src_abort,
    .try_next = src_try_next,
    .next_for = src_next_for,
    .try_next_for = src_try_next_for,
};

ifd_batch_source ifd_ingest_source(ifd_ingest *g)
{
    ifd_batch_source s = {.ops = &src_ops, .ctx = g};
    return s;
}

/* ---- the PUB sink ----------------------------------------------------------------------- */

static int pub_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    (void)err;
    ifd_ingest *g = ctx;
    outmsg *m = malloc(sizeof *m + len + 1);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    m->next = NULL;
    m->len = len;
    memcpy(m->json, json, len);
    m->json[len] = '\0';
    ifd_mutex_lock(&g->omu);
    if (g->olen == OUTBOX_MAX) { /* the I/O thread is behind: the oldest is not published */
        outmsg *old = g->ohead;
        g->ohead = old->next;
        g->olen--;
        g->odropped++;
        free(old);
        if (g->ohead == NULL)
            g->otail = NULL;
    }
    if (g->otail)
        g->otail->next = m;
    else
        g->ohead = m;
    g->otail = m;
    g->olen++;
    ifd_mutex_unlock(&g->omu);
    ifd_ingest_wake(g);
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

ifd_sink *ifd_ingest_pub_sink(ifd_ingest *g)
{
    return g->pub_sink;
}

/* ---- create / destroy ------------------------------------------------------------------- */

/* The largest tensor frame of a batch, and a batch's bytes (of the rows the input mode takes a
 * batch). */
static size_t batch_sizes(const ifd_daemon_config *c, size_t *total)
{
    ifd_program p;
    *total = 0;
    if (ifd_program_init(&p, c->run.program, &c->run.settings, NULL))
        return 0;
    size_t most = 0;
    for (int i = 0; i < p.ninputs; i++) {
        size_t row = ifd_dtype_size(p.inputs[i].dtype);
        for (int d = 0; d < p.inputs[i].rank; d++)
            row *= (size_t)p.inputs[i].dims[d];
        size_t bytes = row * (size_t)ifd_input_batch_rows(c->run.input_mode, c->run.batch_size,
                                                          c->run.replicas);
        *total += bytes;
        if (bytes > most)
            most = bytes;
    }
    return most;
}

int ifd_ingest_create(ifd_ingest **out, const ifd_daemon_config *c, int *signals, ifd_error *err)
{
    *out = NULL;
    ifd_ingest *g = calloc(1, sizeof *g);
    if (g == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "ingest");
    g->cfg = c;
    g->signals = signals;
    g->efd = -1;
    ifd_mutex_init(&g->qmu);
    ifd_cond_init(&g->qcv);
    ifd_mutex_init(&g->omu);
    int rc;
    g->producers = calloc((size_t)c->max_producers, sizeof *g->producers);
    g->nlanes = c->run.input_mode == IFD_INPUT_PER_CORE ? c->run.replicas : 1;
    g->lanes = calloc((size_t)g->nlanes, sizeof *g->lanes);
    if (g->producers == NULL || g->lanes == NULL) {
        rc = ifd_error_set(err, IFD_ENOMEM, "ingest: producer table");
        goto fail;
    }
    g->batch_rows = ifd_input_batch_rows(c->run.input_mode, c->run.batch_size, c->run.replicas);
    g->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->efd < 0) {
        rc = ifd_error_set(err, IFD_EIO, "ingest: eventfd: %s", strerror(errno));
        goto fail;
    }
    g->zctx = zmq_ctx_new();
    if (g->zctx == NULL) {
        rc = ifd_error_set(err, IFD_EIO, "ingest: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    g->router = zmq_socket(g->zctx, ZMQ_ROUTER);
    size_t batch_bytes;
    g->max_frame = batch_sizes(c, &batch_bytes) + 65536;
    g->credit = c->credit > 0 ? c->credit : ifd_proto_auto_credit(batch_bytes);
    /* per-host-v2: a step holds one batch a replica until all are in; one producer alone must
     * be able to send them all (config validation refuses a smaller explicit credit) */
    if (c->run.input_mode == IFD_INPUT_PER_HOST_V2 && g->credit < c->run.replicas)
        g->credit = c->run.replicas;
    int64_t maxmsg = (int64_t)g->max_frame;
    int linger = 1000;
    zmq_setsockopt(g->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(g->router, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(g->router, c->listen) != 0) {
        rc = zerr(err, "listen", c->listen);
        goto fail;
    }
    if (c->publish && c->publish[0]) {
        g->pub = zmq_socket(g->zctx, ZMQ_PUB);
        zmq_setsockopt(g->pub, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_bind(g->pub, c->publish) != 0) {
            rc = zerr(err, "publish", c->publish);
            goto fail;
        }
        rc = ifd_sink_create(&g->pub_sink, &pub_ops, g);
        if (rc) {
            ifd_error_set(err, rc, "publish: sink");
            goto fail;
        }
    }
    if (c->control && c->control[0]) {
        g->rep = zmq_socket(g->zctx, ZMQ_REP);
        int zero = 0;
        int64_t maxreq = 64 * 1024; /* a request is one small JSON object */
        zmq_setsockopt(g->rep, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(g->rep, ZMQ_MAXMSGSIZE, &maxreq, sizeof maxreq);
        if (zmq_bind(g->rep, c->control) != 0) {
            rc = zerr(err, "control", c->control);
            goto fail;
        }
    }
    *out = g;
    return IFD_OK;
fail:
    ifd_ingest_destroy(g);
    return rc;
}

void ifd_ingest_destroy(ifd_ingest *g)
{
    if (g == NULL)
        return;
    if (g->started) {
        ifd_mutex_lock(&g->omu);
        g->finishing = 1;
        ifd_mutex_unlock(&g->omu);
        ifd_ingest_wake(g);
        ifd_thread_join(&g->thread);
        g->started = 0;
    }
    /* Batches never taken by the run: release them (no ACK is sent any more). */
    for (int i = 0; g->lanes && i < g->nlanes; i++)
        for (host_batch *hb = g->lanes[i].head; hb; hb = hb->qnext)
            host_batch_free_frames(hb);
    free(g->lanes);
    for (int i = 0; g->producers && i < g->cfg->max_producers; i++) {
        host_batch *hb = g->producers[i].head;
        while (hb) {
            host_batch *next = hb->pnext;
            host_batch_free(hb);
            hb = next;
        }
    }
    free(g->producers);
    free(g->pos);
    while (g->ohead) {
        outmsg *m = g->ohead;
        g->ohead = m->next;
        free(m);
    }
    if (g->pub_sink)
        ifd_sink_destroy(g->pub_sink);
    if (g->router)
        zmq_close(g->router);
    if (g->pub)
        zmq_close(g->pub);
    if (g->rep)
        zmq_close(g->rep);
    if (g->zctx)
        zmq_ctx_term(g->zctx);
    if (g->efd >= 0)
        close(g->efd);
    ifd_mutex_fini(&g->omu);
    ifd_cond_fini(&g->qcv);
    ifd_mutex_fini(&g->qmu);
    free(g);
}

/* ---- HELLO ------------------------------------------------------------------------------ */

static const char *dims_format(int rank, const int64_t *dims, char *buf, size_t len)
{
    ifd_shape s = {.rank = rank};
    for (int i = 0; i < rank && i < IFD_MAX_RANK; i++)
        s.dims[i] = dims[i];
    return ifd_shape_format(&s, buf, len);
}

/* Checks the HELLO's schema against the program; the code and sentence of the first
 * difference. */
static int check_schema(ifd_ingest *g, json_t *schema, ifd_error *err)
{
    const ifd_program *p = g->program;
    char want[256] = "";
    for (int i = 0; i < g->nin; i++) {
        char shape[96];
        size_t n = strlen(want);
        snprintf(want + n, sizeof want - n, "%s%s %s %s", i ? ", " : "", g->in[i]->name,
                 ifd_dtype_name(g->in[i]->dtype),
                 dims_format(g->in[i]->rank, g->in[i]->dims, shape, sizeof shape));
    }
    if (!json_is_array(schema)) {
        char got[96];
        return ifd_error_set(err, IFD_EINVAL,
                             "HELLO: schema: expected an array of {name, dtype, shape}, got %s",
                             ifd_json_describe(schema, got, sizeof got));
    }
    if ((int)json_array_size(schema) != g->nin)
        return ifd_error_set(
            err, IFD_ESHAPE,
            "schema: expected %d tensors for program '%s' in %s mode (%s), got %zu", g->nin,
            p->cls->name, ifd_mode_name(g->cfg->run.mode), want, json_array_size(schema));
    for (int i = 0; i < g->nin; i++) {
        const ifd_input_spec *in = g->in[i];
        json_t *t = json_array_get(schema, (size_t)i);
        json_t *name = json_object_get(t, "name"), *dtype = json_object_get(t, "dtype"),
               *shape = json_object_get(t, "shape");
        if (!json_is_object(t) || !json_is_string(name) || !json_is_string(dtype) ||
            !json_is_array(shape) || json_object_size(t) != 3)
            return ifd_error_set(err, IFD_EINVAL,
                                 "schema: tensor %d: expected an object with exactly the keys "
                                 "name (string), dtype (string) and shape (array of integers)",
                                 i);
        if (strcmp(json_string_value(name), in->name) != 0)
            return ifd_error_set(err, IFD_ESHAPE,
                                 "schema: tensor %d: expected name '%s' (program '%s' takes %s), "
                                 "got '%s'",
                                 i, in->name, p->cls->name, want, json_string_value(name));
        ifd_dtype dt;
        if (ifd_dtype_parse(json_string_value(dtype), &dt))
            return ifd_error_set(err, IFD_EDTYPE,
                                 "schema: tensor %d '%s': dtype: expected one of float32, int32, "
                                 "int64, uint8, got '%s'",
                                 i, in->name, json_string_value(dtype));
        if (dt != in->dtype)
            return ifd_error_set(err, IFD_EDTYPE,
                                 "schema: tensor %d '%s': expected dtype %s, got %s", i, in->name,
                                 ifd_dtype_name(in->dtype), ifd_dtype_name(dt));
        int rank = (int)json_array_size(shape);
        int64_t dims[IFD_MAX_RANK];
        int ok = rank <= IFD_MAX_RANK;
        for (int d = 0; ok && d < rank; d++) {
            json_t *v = json_array_get(shape, (size_t)d);
            ok = json_is_integer(v) && json_integer_value(v) >= 0;
            if (ok)
                dims[d] = json_integer_value(v);
        }
        if (!ok)
            return ifd_error_set(err, IFD_ESHAPE,
                                 "schema: tensor %d '%s': shape: expected at most %d "
                                 "non-negative integers",
                                 i, in->name, IFD_MAX_RANK);
        int same = rank == in->rank;
        for (int d = 0; same && d < rank; d++)
            same = dims[d] == in->dims[d];
        if (!same) {
            char a[96], b[96];
            return ifd_error_set(err, IFD_ESHAPE,
                                 "schema: tensor %d '%s': expected per-row shape %s, got %s", i,
                                 in->name, dims_format(in->rank, in->dims, a, sizeof a),
                                 dims_format(rank, dims, b, sizeof b));
        }
    }
    return IFD_OK;
}

/* The program's settings that are set: {"features": 64, "classes": 10, "hidden": 32}. */
static json_t *settings_json(const ifd_program_settings *ps)
{
    json_t *j = json_object();
    const char *const names[] = {"features", "classes", "hidden"};
    const int64_t values[] = {ps->features, ps->classes, ps->hidden};
    for (int i = 0; i < 3; i++)
        if (values[i] > 0)
            json_object_set_new(j, names[i], json_integer(values[i]));
    return j;
}

static json_t *schema_json(const ifd_ingest *g)
{
    json_t *a = json_array();
    for (int i = 0; i < g->nin; i++) {
        const ifd_input_spec *in = g->in[i];
        json_t *shape = json_array();
        for (int d = 0; d < in->rank; d++)
            json_array_append_new(shape, json_integer(in->dims[d]));
        json_array_append_new(a, json_pack("{s:s, s:s, s:o}", "name", in->name, "dtype",
                                           ifd_dtype_name(in->dtype), "shape", shape));
    }
    return a;
}

/* The input ends once every producer welcomed so far has sent END, or, with expect_producers,
 * once that many have (so that a producer that connects late is not shut out). */
/* Publishes the producer counts the watchdog's sentence reads. */
static void count_producers(ifd_ingest *g)
{
    int connected = 0;
    for (int i = 0; i < g->cfg->max_producers; i++)
        connected += g->producers[i].used && g->producers[i].welcomed && !g->producers[i].ended;
    __atomic_store_n(&g->watch_connected, connected, __ATOMIC_RELAXED);
    __atomic_store_n(&g->watch_ended, g->ended_total, __ATOMIC_RELAXED);
}

/* The watchdog's context (its thread): "1 producer connected, 0 ended". */
static void watchdog_context(void *arg, char *buf, size_t len)
{
    ifd_ingest *g = arg;
    int connected = __atomic_load_n(&g->watch_connected, __ATOMIC_RELAXED);
    snprintf(buf, len, "%d producer%s connected, %d ended", connected, connected == 1 ? "" : "s",
             __atomic_load_n(&g->watch_ended, __ATOMIC_RELAXED));
}

static void check_input_end(ifd_ingest *g)
{
    if (g->input_closed || !g->ever_welcomed)
        return;
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        if (p->used && p->welcomed && !p->ended)
            return;
    }
    if (g->cfg->expect_producers > 0 && g->ended_total < g->cfg->expect_producers)
        return;
    close_input(g, "every producer sent END");
}

static void handle_hello(ifd_ingest *g, const producer_rid *from, const zmq_msg_t *body)
{
    if (zmq_msg_size((zmq_msg_t *)body) > IFD_PROTO_HELLO_JSON_MAX) {
        send_error(g, from, IFD_EPROTO, -1, 0, "HELLO: JSON: expected at most %d bytes, got %zu",
                   IFD_PROTO_HELLO_JSON_MAX, zmq_msg_size((zmq_msg_t *)body));
        return;
    }
    json_error_t je;
    json_t *j = json_loadb(zmq_msg_data((zmq_msg_t *)body), zmq_msg_size((zmq_msg_t *)body),
                           JSON_REJECT_DUPLICATES, &je);
    if (j == NULL) {
        send_error(g, from, IFD_EPROTO, -1, 0, "HELLO: JSON: line %d, column %d: %s", je.line,
                   je.column, je.text);
        return;
    }
    ifd_error e;
    ifd_error_clear(&e);
    const char *key;
    json_t *v;
    const char *name = NULL;
    int64_t first_seq = 0;
    int replica = -1, per_core = g->cfg->run.input_mode == IFD_INPUT_PER_CORE;
    char got[96];
    if (!json_is_object(j)) {
        ifd_error_set(&e, IFD_EPROTO, "HELLO: expected a JSON object, got %s",
                      ifd_json_describe(j, got, sizeof got));
        goto reply;
    }
    json_object_foreach(j, key, v)
    {
        if (strcmp(key, "name") == 0) {
            if (!json_is_string(v) || json_string_length(v) == 0 ||
                json_string_length(v) > IFD_PROTO_NAME_MAX) {
                ifd_error_set(&e, IFD_EINVAL,
                              "HELLO: name: expected a string of 1 to %d bytes, got %s",
                              IFD_PROTO_NAME_MAX, ifd_json_describe(v, got, sizeof got));
                goto reply;
            }
            name = json_string_value(v);
        } else if (strcmp(key, "first_seq") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 0) {
                ifd_error_set(&e, IFD_EINVAL, "HELLO: first_seq: expected an integer >= 0, got %s",
                              ifd_json_describe(v, got, sizeof got));
                goto reply;
            }
            first_seq = json_integer_value(v);
        } else if (strcmp(key, "replica") == 0) {
            if (!per_core && !json_is_null(v)) {
                ifd_error_set(&e, IFD_EINVAL,
                              "HELLO: replica: the input mode is %s, which takes no replica; "
                              "expected null or no key, got %s",
                              ifd_input_mode_name(g->cfg->run.input_mode),
                              ifd_json_describe(v, got, sizeof got));
                goto reply;
            }
            if (per_core) {
                if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) >= g->cfg->run.replicas) {
                    ifd_error_set(&e, IFD_EINVAL,
                                  "HELLO: replica: per-core input with %d replicas: expected an "
                                  "integer from 0 to %d, got %s",
                                  g->cfg->run.replicas, g->cfg->run.replicas - 1,
                                  ifd_json_describe(v, got, sizeof got));
                    goto reply;
                }
                replica = (int)json_integer_value(v);
            }
        } else if (strcmp(key, "schema") != 0) {
            ifd_error_set(&e, IFD_EINVAL,
                          "HELLO: unknown key '%s' (expected name, schema, first_seq, replica)",
                          key);
            goto reply;
        }
    }
    if (per_core && replica < 0) {
        ifd_error_set(&e, IFD_EINVAL,
                      "HELLO: replica: per-core input with %d replicas: expected an integer from "
                      "0 to %d naming the replica this producer feeds, got no key",
                      g->cfg->run.replicas, g->cfg->run.replicas - 1);
        goto reply;
    }
    if (check_schema(g, json_object_get(j, "schema"), &e))
        goto reply;
    if (g->input_closed) {
        ifd_error_set(&e, IFD_ECLOSED,
                      "HELLO: the input has ended (every producer sent END, or the run is "
                      "ending); no more producers are taken");
        goto reply;
    }

    producer *p = find_by_rid(g, from);
    char anon[32];
    if (name == NULL) {
        if (p) {
            name = p->name;
        } else {
            do /* not a name a producer chose itself: that would take over its stream */
                snprintf(anon, sizeof anon, "producer-%" PRId64, ++g->next_anon);
            while (find_by_name(g, anon));
            name = anon;
        }
    }
    producer *named = find_by_name(g, name);
    if (p && p != named) { /* this connection changes its name: forget the old stream */
        if (p->in_flight == 0) {
            memset(p, 0, sizeof *p);
        } else {
            p->ended = 1;
            p->rid_len = 0;
        }
        p = NULL;
    }
    p = named;
    int fresh = p == NULL;
    if (p == NULL) {
        p = new_slot(g);
        if (p == NULL) {
            ifd_error_set(&e, IFD_EINVAL,
                          "HELLO: too many producers: expected at most %d (max_producers)",
                          g->cfg->max_producers);
            goto reply;
        }
        p->used = 1;
        snprintf(p->name, sizeof p->name, "%s", name);
        p->last_seq = first_seq - 1;
        p->acked_seq = -1;
    } else if (first_seq - 1 > p->last_seq) {
        p->last_seq = first_seq - 1;
    }
    /* A name whose slot was reused, or that a resumed checkpoint knows: its stream goes on after
     * what was consumed. (A known name has its entry: only a fresh one can fail.) */
    int64_t consumed = -1;
    p->pos = position_index(g, p->name, &consumed);
    if (p->pos < 0) {
        if (fresh)
            memset(p, 0, sizeof *p);
        else
            p->welcomed = 0;
        ifd_error_set(&e, IFD_ENOMEM, "HELLO: no memory for producer '%s'", name);
        goto reply;
    }
    if (consumed > p->last_seq)
        p->last_seq = consumed;
    if (consumed > p->acked_seq)
        p->acked_seq = consumed;
    memcpy(p->rid, from->rid, from->len);
    p->rid_len = from->len;
    p->welcomed = 1;
    p->ended = 0;
    p->replica = replica; /* its batches accepted before keep the replica they were for */
    p->credit = g->credit - p->in_flight;
    if (p->credit < 0)
        p->credit = 0;
    g->ever_welcomed = 1;
    /* The sequence numbers end at INT64_MAX: after a batch with that seq, no later one exists
     * (every seq is a duplicate) and next_seq stays at INT64_MAX rather than overflowing. */
    int64_t next_seq = p->last_seq < INT64_MAX ? p->last_seq + 1 : INT64_MAX;
    IFD_LOG_INFO("producer '%s' connected (next seq %" PRId64 ", credit %d)", p->name, next_seq,
                 p->credit);
    json_t *w = json_object();
    json_object_set_new(w, "protocol", json_integer(IFD_PROTO_VERSION));
    json_object_set_new(w, "name", json_string(p->name));
    json_object_set_new(w, "credit", json_integer(p->credit));
    json_object_set_new(w, "next_seq", json_integer(next_seq));
    json_object_set_new(w, "mode", json_string(ifd_mode_name(g->cfg->run.mode)));
    json_object_set_new(w, "input_mode", json_string(ifd_input_mode_name(g->cfg->run.input_mode)));
    json_object_set_new(w, "batch_size", json_integer(g->batch_rows));
    json_object_set_new(w, "global_batch_size", json_integer(g->cfg->run.batch_size));
    json_object_set_new(w, "replicas", json_integer(g->cfg->run.replicas));
    json_object_set_new(w, "replica", replica >= 0 ? json_integer(replica) : json_null());
    json_object_set_new(w, "program", json_string(g->program->cls->name));
    json_object_set_new(w, "settings", settings_json(&g->program->settings));
    json_object_set_new(w, "schema", schema_json(g));
    send_json(g, from, IFD_MSG_WELCOME, w);
    json_decref(j);
    count_producers(g);
    return;
reply:
    json_decref(j);
    send_error(g, from, e.code, -1, 0, "%s", e.msg);
    count_producers(g);
    check_input_end(g); /* a renaming connection may have left only ended streams */
}

/* ---- BATCH ------------------------------------------------------------------------------ */

static void reject(ifd_ingest *g, producer *p, const producer_rid *from, int code, int64_t seq,
                   const char *msg)
{
    p->credit++;
    p->rejected++;
    g->rejected++;
    send_error(g, from, code, seq, 1, "batch %" PRId64 " from producer '%s': %s", seq, p->name,
               msg);
}

static void handle_batch(ifd_ingest *g, const producer_rid *from, zmq_msg_t *parts, int nparts,
                         int total)
{
    zmq_msg_t *hdr = &parts[1];
    producer *p = find_by_rid(g, from);
    size_t hlen = zmq_msg_size(hdr);
    if (hlen < IFD_PROTO_BATCH_HDR) {
        send_error(g, from, IFD_EPROTO, -1, 0,
                   "BATCH header: expected %d bytes (seq, rows, flags, ntensors), got %zu",
                   IFD_PROTO_BATCH_HDR, hlen);
        return;
    }
    ifd_proto_batch bh;
    ifd_proto_parse_batch(zmq_msg_data(hdr), &bh);
    if (p == NULL || !p->welcomed) {
        send_error(g, from, IFD_EPROTO, bh.seq, 0,
                   "BATCH %" PRId64 " before HELLO: send HELLO with the schema first", bh.seq);
        return;
    }
    /* From here on a rejection returns the credit the producer spent on the batch. */
    if (p->ended || g->input_closed) {
        send_error(g, from, IFD_ECLOSED, bh.seq, 1, "batch %" PRId64 " from producer '%s': %s",
                   bh.seq, p->name,
                   g->input_closed ? "the input has ended; no more batches are taken"
                                   : "the producer sent END; send HELLO to start again");
        return;
    }
    if (p->credit <= 0) { /* the producer counted a credit it did not have: give it back */
        send_error(g, from, IFD_EPROTO, bh.seq, 1,
                   "batch %" PRId64 " from producer '%s': no credit left (%d batches in flight, "
                   "credit %d): wait for an ACK",
                   bh.seq, p->name, p->in_flight, g->credit);
        return;
    }
    p->credit--;
    char msg[IFD_ERROR_MSG_MAX];
    const ifd_program *prog = g->program;
    int nframes = total - 2;
    if (bh.ntensors != (uint32_t)nframes) {
        snprintf(msg, sizeof msg, "header ntensors says %" PRIu32 ", but %d frames follow",
                 bh.ntensors, nframes);
        reject(g, p, from, IFD_EPROTO, bh.seq, msg);
        return;
    }
    if (nframes != g->nin) {
        snprintf(msg, sizeof msg, "expected %d tensor frames (the schema's tensors), got %d",
                 g->nin, nframes);
        reject(g, p, from, IFD_ESHAPE, bh.seq, msg);
        return;
    }
    if (bh.flags != 0) {
        snprintf(msg, sizeof msg, "flags: expected 0 in %s mode, got 0x%" PRIx32,
                 ifd_mode_name(g->cfg->run.mode), bh.flags);
        reject(g, p, from, IFD_EINVAL, bh.seq, msg);
        return;
    }
    int predict = g->cfg->run.mode == IFD_MODE_PREDICT;
    if (predict ? bh.rows < 1 || bh.rows > g->batch_rows : bh.rows != g->batch_rows) {
        char per[96] = "the batch size";
        if (g->cfg->run.input_mode != IFD_INPUT_PER_HOST)
            snprintf(per, sizeof per, "%s input: batch_size %" PRId64 " / %d replicas",
                     ifd_input_mode_name(g->cfg->run.input_mode), g->cfg->run.batch_size,
                     g->cfg->run.replicas);
        snprintf(msg, sizeof msg, "rows: expected %s%" PRId64 " (%s%s), got %" PRId64,
                 predict ? "1 to " : "", g->batch_rows, per,
                 predict ? "; predict mode pads a partial batch" : "", bh.rows);
        reject(g, p, from, IFD_ESHAPE, bh.seq, msg);
        return;
    }
    for (int i = 0; i < nframes; i++) {
        const ifd_input_spec *in = g->in[i];
        size_t row = ifd_dtype_size(in->dtype);
        for (int d = 0; d < in->rank; d++)
            row *= (size_t)in->dims[d];
        size_t want = row * (size_t)bh.rows, got = zmq_msg_size(&parts[2 + i]);
        if (got != want) {
            char shape[96];
            snprintf(msg, sizeof msg,
                     "tensor '%s' is %zu bytes, expected %zu (%" PRId64 " rows of %s %s)", in->name,
                     got, want, bh.rows, dims_format(in->rank, in->dims, shape, sizeof shape),
                     ifd_dtype_name(in->dtype));
            reject(g, p, from, IFD_ESHAPE, bh.seq, msg);
            return;
        }
    }
    if (bh.seq < 0) {
        snprintf(msg, sizeof msg, "seq: expected an integer >= 0, got %" PRId64, bh.seq);
        reject(g, p, from, IFD_EINVAL, bh.seq, msg);
        return;
    }
    if (bh.seq <= p->last_seq) { /* a resent batch: drop it, give the credit back */
        p->credit++;
        if (bh.seq <= p->acked_seq)
            send_credit_msg(g, from, IFD_MSG_ACK, bh.seq);
        else
            send_credit_msg(g, from, IFD_MSG_CREDIT, 0);
        IFD_LOG_DEBUG("producer '%s': dropped duplicate batch %" PRId64, p->name, bh.seq);
        return;
    }

    host_batch *hb = calloc(1, sizeof *hb);
    if (hb == NULL) {
        reject(g, p, from, IFD_ENOMEM, bh.seq, "out of memory");
        return;
    }
    ifd_batch_init(&hb->b);
    hb->g = g;
    hb->p = p;
    hb->pos = p->pos;
    snprintf(hb->name, sizeof hb->name, "%s", p->name);
    hb->b.seq = bh.seq;
    hb->b.rows = bh.rows;
    hb->b.flags = bh.flags;
    hb->b.replica = p->replica >= 0 ? p->replica : 0;
    hb->b.ntensors = nframes;
    hb->b.producer = hb->name;
    hb->b.release = host_batch_release;
    hb->b.release_arg = hb;
    hb->b.user = hb;
    int rc = IFD_OK;
    for (int i = 0; i < nframes && rc == IFD_OK; i++) {
        const ifd_input_spec *in = g->in[i];
        zmq_msg_init(&hb->frames[i]);
        zmq_msg_move(&hb->frames[i], &parts[2 + i]);
        hb->nframes = i + 1;
        void *data = zmq_msg_data(&hb->frames[i]);
        size_t size = zmq_msg_size(&hb->frames[i]);
        size_t align = ifd_dtype_size(in->dtype);
        if ((uintptr_t)data % align != 0) { /* libzmq packed a small frame unaligned */
            hb->copies[i] = aligned_alloc(64, (size + 63) / 64 * 64);
            if (hb->copies[i] == NULL) {
                rc = IFD_ENOMEM;
                break;
            }
            memcpy(hb->copies[i], data, size);
            data = hb->copies[i];
            g->copied_bytes += (int64_t)size;
        }
        int64_t dims[IFD_MAX_RANK + 1];
        dims[0] = bh.rows;
        for (int d = 0; d < in->rank; d++)
            dims[d + 1] = in->dims[d];
        rc = ifd_tensor_init(&hb->b.tensors[i], in->dtype, in->rank + 1, dims, data);
    }
    ifd_error e;
    ifd_error_clear(&e);
    if (rc)
        ifd_error_set(&e, rc, "cannot take the batch: %s", ifd_strerror(rc));
    else
        rc = ifd_infeed_check_batch(prog, &hb->b, g->batch_rows, g->cfg->run.mode, &e);
    (void)nparts;
    if (rc) {
        host_batch_free(hb);
        reject(g, p, from, rc, bh.seq, ifd_error_text(&e));
        return;
    }
    p->last_seq = bh.seq;
    p->in_flight++;
    p->accepted++;
    g->accepted++;
    if (p->tail)
        p->tail->pnext = hb;
    else
        p->head = hb;
    p->tail = hb;
    src_push(g, hb);
}

/* ---- ACKs, summaries, control --------------------------------------------------------------- */

/* PREDICTION: header, the tensors' description, one raw frame per tensor. */
static void send_prediction(ifd_ingest *g, producer *p, const prediction_msg *m)
{
    producer_rid r = rid_of(p);
    int rc = zmq_send(g->router, r.rid, r.len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (rc >= 0)
        rc = zmq_send(g->router, m->hdr, sizeof m->hdr, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (rc >= 0)
        rc = zmq_send(g->router, m->json, strlen(m->json), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    for (int i = 0; rc >= 0 && i < m->ntensors; i++)
        rc = zmq_send(g->router, m->data[i], m->len[i],
                      (i + 1 < m->ntensors ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
    if (rc < 0)
        IFD_LOG_WARN("ingest: a PREDICTION for producer '%s' was not sent: %s", p->name,
                     zmq_strerror(zmq_errno()));
}

/* The prediction sink (outfeed thread): the message is built here and attached to the batch;
 * the I/O thread sends it just before the ACK that covers the batch. */
static int ingest_predictions(void *ctx, const ifd_batch *b, const ifd_predictions *pr,
                              ifd_error *err)
{
    (void)ctx;
    host_batch *hb = b->user;
    if (hb == NULL)
        return IFD_OK; /* not a producer's batch */
    prediction_msg *m = calloc(1, sizeof *m);
    json_t *desc = json_array();
    if (m == NULL || desc == NULL)
        goto nomem;
    ifd_proto_prediction(m->hdr, hb->b.seq, pr->rows, (uint32_t)pr->ntensors);
    for (int i = 0; i < pr->ntensors; i++) {
        const ifd_tensor *t = &pr->tensors[i];
        json_t *shape = json_array();
        for (int d = 1; d < t->shape.rank; d++)
            json_array_append_new(shape, json_integer(t->shape.dims[d]));
        json_array_append_new(desc, json_pack("{s:s, s:s, s:o}", "name", pr->names[i], "dtype",
                                              ifd_dtype_name(t->dtype), "shape", shape));
        m->len[i] = ifd_tensor_nbytes(t);
        m->data[i] = malloc(m->len[i] ? m->len[i] : 1);
        m->ntensors = i + 1;
        if (m->data[i] == NULL)
            goto nomem;
        memcpy(m->data[i], t->data, m->len[i]);
    }
    m->json = json_dumps(desc, JSON_COMPACT);
    if (m->json == NULL)
        goto nomem;
    json_decref(desc);
    hb->pred = m;
    return IFD_OK;

nomem:
    json_decref(desc);
    prediction_free(m);
    return ifd_error_set(err, IFD_ENOMEM, "the PREDICTION of batch %lld from producer '%s'",
                         (long long)b->seq, hb->name);
}

ifd_prediction_sink ifd_ingest_prediction_sink(ifd_ingest *g)
{
    return (ifd_prediction_sink){.write = ingest_predictions, .ctx = g};
}

/* One cumulative ACK per producer for the batches consumed since the last pass: they are
 * acknowledged in the producer's order, so "up to seq, n batches" names them all. */
static void send_acks(ifd_ingest *g)
{
    __atomic_store_n(&g->acks_pending, 0, __ATOMIC_RELEASE);
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        uint32_t n = 0;
        while (p->head && __atomic_load_n(&p->head->done, __ATOMIC_ACQUIRE)) {
            host_batch *hb = p->head;
            p->head = hb->pnext;
            if (p->head == NULL)
                p->tail = NULL;
            p->in_flight--;
            p->acked_seq = hb->b.seq;
            n++;
            if (hb->pred && p->rid_len)
                send_prediction(g, p, hb->pred);
            host_batch_free(hb);
        }
        if (n && p->rid_len) {
            producer_rid r = rid_of(p);
            p->credit += (int)n;
            uint8_t hdr[IFD_PROTO_ACK_HDR];
            send_parts(g, &r, hdr, ifd_proto_ack(hdr, p->acked_seq, n), NULL);
        }
    }
}

/* Starvation warnings (a log line, not the --watchdog, which ends the run): when the infeed
 * thread has waited for input for STARVE_WARN_NS, and again every STARVE_WARN_NS while it still
 * waits, naming the replica it waits for. */
static void watch_infeed(ifd_ingest *g)
{
    int replica = -1;
    int64_t since = 0, now = ifd_clock_ns();
    if (g->input_closed || !ifd_session_infeed_waiting(g->session, &replica, &since) ||
        now - since < STARVE_WARN_NS) {
        g->starve_warned_ns = 0;
        return;
    }
    if (g->starve_warned_ns && now - g->starve_warned_ns < STARVE_WARN_NS)
        return;
    g->starve_warned_ns = now;
    double secs = (double)(now - since) * 1e-9;
    if (g->nlanes > 1) {
        int feeding = 0;
        for (int i = 0; i < g->cfg->max_producers; i++) {
            producer *p = &g->producers[i];
            feeding += p->used && p->welcomed && !p->ended && p->replica == replica;
        }
        IFD_LOG_WARN("infeed: replica %d is starving: the step has waited %.1f s for its batch "
                     "(%d producer%s streaming for replica %d)",
                     replica, secs, feeding, feeding == 1 ? "" : "s", replica);
    } else if (replica >= 0) {
        IFD_LOG_WARN("infeed: waited %.1f s for batch %d of the step's %d (replica %d's), no batch "
                     "is queued",
                     secs, replica + 1, g->cfg->run.replicas, replica);
    } else {
        IFD_LOG_WARN("infeed: waited %.1f s for the next batch; none is queued", secs);
    }
}

/* The rates status reports: global steps over the last second or so. */
static void sample_rates(ifd_ingest *g)
{
    int64_t now = ifd_clock_ns(), step = ifd_session_global_step(g->session);
    if (g->rate_t0 == 0) {
        g->rate_t0 = now;
        g->rate_step0 = step;
        return;
    }
    if (now - g->rate_t0 < 1000000000LL)
        return;
    g->steps_per_sec = (double)(step - g->rate_step0) * 1e9 / (double)(now - g->rate_t0);
    const ifd_config *r = &g->cfg->run;
    g->examples_per_sec = g->steps_per_sec * (double)g->batch_rows *
                          (double)ifd_input_batches_per_step(r->input_mode, r->replicas);
    g->rate_t0 = now;
    g->rate_step0 = step;
}

static void publish(ifd_ingest *g)
{
    ifd_mutex_lock(&g->omu);
    outmsg *m = g->ohead;
    g->ohead = g->otail = NULL;
    g->olen = 0;
    ifd_mutex_unlock(&g->omu);
    while (m) {
        outmsg *next = m->next;
        if (g->pub)
            zmq_send(g->pub, m->json, m->len, ZMQ_DONTWAIT); /* drops for a slow subscriber */
        free(m);
        m = next;
    }
}

static void request_stop(ifd_ingest *g, const char *why)
{
    if (g->stop_ns == 0) {
        IFD_LOG_INFO("%s: stopping at the end of the current loop", why);
        g->stop_ns = ifd_clock_ns();
        ifd_session_request_stop(g->session);
    }
}

static json_t *status_json(ifd_ingest *g)
{
    json_t *j = json_object();
    json_object_set_new(j, "ok", json_true());
    json_object_set_new(j, "state", json_string(g->stop_ns ? "stopping" : "running"));
    json_object_set_new(j, "mode", json_string(ifd_mode_name(g->cfg->run.mode)));
    json_object_set_new(j, "program", json_string(g->program->cls->name));
    json_object_set_new(j, "backend", json_string(g->cfg->run.backend));
    json_object_set_new(j, "replicas", json_integer(g->cfg->run.replicas));
    json_object_set_new(j, "global_step", json_integer(ifd_session_global_step(g->session)));
    json_object_set_new(j, "loop", json_integer(ifd_session_loop_index(g->session)));
    json_object_set_new(j, "input_mode", json_string(ifd_input_mode_name(g->cfg->run.input_mode)));
    size_t qlen = 0;
    json_t *per = g->nlanes > 1 ? json_array() : json_null();
    ifd_mutex_lock(&g->qmu);
    for (int i = 0; i < g->nlanes; i++) {
        qlen += g->lanes[i].len;
        if (g->nlanes > 1)
            json_array_append_new(per, json_integer((json_int_t)g->lanes[i].len));
    }
    ifd_mutex_unlock(&g->qmu);
    json_object_set_new(j, "batch_queue", json_integer((json_int_t)qlen));
    json_object_set_new(j, "batch_queue_per_replica", per);
    int waiting_replica = -1;
    int64_t since = 0;
    int waiting = ifd_session_infeed_waiting(g->session, &waiting_replica, &since);
    json_object_set_new(j, "infeed_waiting", json_boolean(waiting));
    json_object_set_new(j, "infeed_waiting_sec",
                        json_real(waiting ? (double)(ifd_clock_ns() - since) * 1e-9 : 0.0));
    json_object_set_new(j, "infeed_waiting_replica",
                        waiting && waiting_replica >= 0 ? json_integer(waiting_replica)
                                                        : json_null());
    json_object_set_new(j, "starving_replica",
                        waiting && g->nlanes > 1 && waiting_replica >= 0
                            ? json_integer(waiting_replica)
                            : json_null());
    json_object_set_new(j, "batch_queue_limit",
                        json_integer((json_int_t)g->cfg->max_producers * g->credit));
    json_object_set_new(j, "input_closed", json_boolean(g->input_closed));
    json_t *ps = json_array();
    int connected = 0;
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        if (!p->used)
            continue;
        connected += p->welcomed && !p->ended;
        json_t *pj =
            json_pack("{s:s, s:b, s:i, s:i, s:I, s:I, s:I, s:I}", "name", p->name, "ended",
                      p->ended, "credit", p->credit, "in_flight", p->in_flight, "last_seq",
                      (json_int_t)p->last_seq, "acked_seq", (json_int_t)p->acked_seq, "accepted",
                      (json_int_t)p->accepted, "rejected", (json_int_t)p->rejected);
        json_object_set_new(pj, "replica",
                            p->replica >= 0 ? json_integer(p->replica) : json_null());
        json_array_append_new(ps, pj);
    }
    json_object_set_new(j, "producers_connected", json_integer(connected));
    json_object_set_new(j, "producers", ps);
    json_t *rings = json_array();
    for (int r = 0; r < g->cfg->run.replicas; r++) {
        ifd_ring_depths d;
        if (ifd_session_ring_depths(g->session, r, &d) == IFD_OK)
            json_array_append_new(
                rings, json_pack("{s:i, s:I, s:I, s:I, s:I}", "replica", r, "infeed",
                                 (json_int_t)d.infeed, "infeed_capacity",
                                 (json_int_t)d.infeed_capacity, "outfeed", (json_int_t)d.outfeed,
                                 "outfeed_capacity", (json_int_t)d.outfeed_capacity));
    }
    json_object_set_new(j, "rings", rings);
    json_object_set_new(j, "batches_accepted", json_integer(g->accepted));
    json_object_set_new(j, "batches_rejected", json_integer(g->rejected));
    json_object_set_new(j, "bytes_copied_unaligned", json_integer(g->copied_bytes));
    json_object_set_new(j, "steps_per_sec", json_real(g->steps_per_sec));
    json_object_set_new(j, "examples_per_sec", json_real(g->examples_per_sec));
    return j;
}

static void handle_control(ifd_ingest *g)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, g->rep, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return;
    }
    int more = zmq_msg_more(&m);
    json_t *req = json_loadb(zmq_msg_data(&m), zmq_msg_size(&m), 0, NULL);
    zmq_msg_close(&m);
    while (more) { /* a REP must answer the whole request; extra frames are ignored */
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, g->rep, 0) < 0)
            more = 0;
        else
            more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    json_t *cmd = json_object_get(req, "cmd");
    json_t *reply;
    if (json_is_string(cmd) && strcmp(json_string_value(cmd), "status") == 0) {
        reply = status_json(g);
    } else if (json_is_string(cmd) && strcmp(json_string_value(cmd), "stop") == 0) {
        request_stop(g, "control: stop");
        reply = json_pack("{s:b}", "ok", 1);
    } else {
        char why[300];
        if (req == NULL)
            snprintf(why, sizeof why,
                     "expected a JSON object {\"cmd\": \"status\"|\"stop\"}, got text that is "
                     "not JSON");
        else if (!json_is_string(cmd)) {
            char got[96];
            snprintf(why, sizeof why, "cmd: expected \"status\" or \"stop\", got %s",
                     ifd_json_describe(cmd, got, sizeof got));
        } else
            snprintf(why, sizeof why, "cmd: expected \"status\" or \"stop\", got '%.200s'",
                     json_string_value(cmd));
        reply = json_pack("{s:b, s:s}", "ok", 0, "error", why);
    }
    json_decref(req);
    char *text = json_dumps(reply, JSON_COMPACT);
    json_decref(reply);
    zmq_send(g->rep, text ? text : "{}", text ? strlen(text) : 2, 0);
    free(text);
}

/* ---- the I/O thread --------------------------------------------------------------------- */

static void handle_message(ifd_ingest *g, zmq_msg_t *parts, int nparts, int total)
{
    producer_rid from = {.rid = zmq_msg_data(&parts[0]), .len = zmq_msg_size(&parts[0])};
    if (from.len > RID_MAX)
        return;
    if (total < 2) {
        send_error(g, &from, IFD_EPROTO, -1, 0, "message: expected a header frame, got none");
        return;
    }
    ifd_proto_header_info h;
    char why[200];
    if (ifd_proto_parse_header(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), &h, why,
                               sizeof why)) {
        send_error(g, &from, IFD_EPROTO, -1, 0, "%s", why);
        return;
    }
    switch (h.type) {
    case IFD_MSG_HELLO:
        if (total != 3) {
            send_error(g, &from, IFD_EPROTO, -1, 0,
                       "HELLO: expected 2 frames (header, JSON), got %d", total - 1);
            return;
        }
        handle_hello(g, &from, &parts[2]);
        return;
    case IFD_MSG_BATCH:
        handle_batch(g, &from, parts, nparts, total);
        return;
    case IFD_MSG_END: {
        producer *p = find_by_rid(g, &from);
        if (p == NULL || !p->welcomed) {
            send_error(g, &from, IFD_EPROTO, -1, 0, "END before HELLO");
            return;
        }
        if (!p->ended) {
            IFD_LOG_INFO("producer '%s' ended its stream after batch %" PRId64, p->name,
                         p->last_seq);
            if (!p->counted_end)
                g->ended_total++;
            p->counted_end = 1;
        }
        p->ended = 1;
        count_producers(g);
        check_input_end(g);
        return;
    }
    default:
        send_error(g, &from, IFD_EPROTO, -1, 0,
                   "header: type: expected HELLO (1), BATCH (3) or END (6) from a producer, got "
                   "%u",
                   (unsigned)h.type);
    }
}

/* Reads one multipart message; parts beyond MAX_PARTS are read and dropped but counted. */
static int recv_message(ifd_ingest *g, zmq_msg_t *parts, int *nparts, int *total)
{
    *nparts = 0;
    *total = 0;
    for (;;) {
        zmq_msg_t *m = &parts[*nparts < MAX_PARTS ? *nparts : MAX_PARTS];
        zmq_msg_init(m);
        if (zmq_msg_recv(m, g->router, *total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(m);
            for (int q = 0; q < *nparts; q++) /* a message cut short: drop its first parts */
                zmq_msg_close(&parts[q]);
            *nparts = 0;
            return -1;
        }
        int more = zmq_msg_more(m);
        if (*nparts < MAX_PARTS)
            (*nparts)++;
        else
            zmq_msg_close(m);
        (*total)++;
        if (!more)
            return 0;
    }
}

/*
 * After the BYEs: read and drop what producers still send (at most their credit) until the
 * socket has been quiet for DRAIN_QUIET_NS, for at most DRAIN_MAX_NS. Closing a TCP socket with
 * unread data makes the kernel answer with a reset, and a reset can destroy the last ACKs and
 * the BYE before the producer has read them (seen under load: a producer waiting for a BYE that
 * the daemon had sent).
 */
#define DRAIN_QUIET_NS 50000000LL
#define DRAIN_MAX_NS 2000000000LL
static void drain_router(ifd_ingest *g)
{
    int64_t start = ifd_clock_ns(), quiet_since = start;
    zmq_msg_t parts[MAX_PARTS + 1];
    while (ifd_clock_ns() - start < DRAIN_MAX_NS && ifd_clock_ns() - quiet_since < DRAIN_QUIET_NS) {
        zmq_pollitem_t it = {.socket = g->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 10) <= 0)
            continue;
        int np, total;
        while (recv_message(g, parts, &np, &total) == 0) {
            for (int q = 0; q < np; q++)
                zmq_msg_close(&parts[q]);
            quiet_since = ifd_clock_ns();
        }
    }
}

static void finish(ifd_ingest *g)
{
    send_acks(g);
    publish(g);
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        if (!p->used || !p->welcomed || p->rid_len == 0)
            continue;
        json_t *b = json_object();
        json_object_set_new(b, "status", json_string(g->fin_code ? "error" : "ok"));
        json_object_set_new(b, "reason", json_string(g->fin_reason));
        json_object_set_new(b, "global_step", json_integer(ifd_session_global_step(g->session)));
        json_object_set_new(b, "acked_seq", json_integer(p->acked_seq));
        if (g->fin_message[0])
            json_object_set_new(b, "message", json_string(g->fin_message));
        producer_rid r = rid_of(p);
        send_json(g, &r, IFD_MSG_BYE, b);
        IFD_LOG_DEBUG("BYE to producer '%s' (acked up to %" PRId64 ")", p->name, p->acked_seq);
    }
    drain_router(g);
}

static void *io_main(void *arg)
{
    ifd_ingest *g = arg;
    zmq_pollitem_t items[3];
    int n = 0;
    items[n++] = (zmq_pollitem_t){.fd = g->efd, .events = ZMQ_POLLIN};
    int i_router = n;
    items[n++] = (zmq_pollitem_t){.socket = g->router, .events = ZMQ_POLLIN};
    int i_rep = g->rep ? n : -1;
    if (g->rep)
        items[n++] = (zmq_pollitem_t){.socket = g->rep, .events = ZMQ_POLLIN};
    zmq_msg_t parts[MAX_PARTS + 1];
    for (;;) {
        int rc = zmq_poll(items, n, 100);
        if (rc < 0 && zmq_errno() != EINTR) {
            IFD_LOG_ERROR("ingest: zmq_poll: %s", zmq_strerror(zmq_errno()));
            ifd_sleep_ns(10000000);
        }
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN)) {
            uint64_t v;
            ssize_t r = read(g->efd, &v, sizeof v);
            (void)r;
        }
        if (rc > 0 && (items[i_router].revents & ZMQ_POLLIN)) {
            for (int k = 0; k < RECV_BURST; k++) {
                int np, total;
                if (recv_message(g, parts, &np, &total))
                    break;
                handle_message(g, parts, np, total);
                for (int q = 0; q < np; q++)
                    zmq_msg_close(&parts[q]);
            }
            src_flush(g);
        }
        if (i_rep >= 0 && rc > 0 && (items[i_rep].revents & ZMQ_POLLIN))
            handle_control(g);
        send_acks(g);
        publish(g);
        sample_rates(g);
        watch_infeed(g);

        int sigs = g->signals ? __atomic_load_n(g->signals, __ATOMIC_RELAXED) : 0;
        if (sigs > g->handled_signals) {
            if (g->handled_signals == 0)
                request_stop(g, "signal");
            if (sigs >= 2) {
                IFD_LOG_WARN("second signal: aborting the run");
                ifd_session_abort(g->session, "aborted by a second signal");
                close_input(g, "aborted");
            }
            g->handled_signals = sigs;
        }
        if (g->stop_ns && !g->input_closed && ifd_clock_ns() - g->stop_ns > STOP_GRACE_NS)
            close_input(g, "stopping, and the current loop still waits for input");

        ifd_mutex_lock(&g->omu);
        int fin = g->finishing;
        ifd_mutex_unlock(&g->omu);
        if (fin) {
            finish(g);
            return NULL;
        }
    }
}

int ifd_ingest_restore(ifd_ingest *g, const ifd_checkpoint *c, ifd_error *err)
{
    for (int i = 0; i < ifd_checkpoint_producer_count(c); i++) {
        const char *name = ifd_checkpoint_producer_name(c, i);
        int64_t seq = ifd_checkpoint_producer_seq(c, i);
        if (strlen(name) > IFD_PROTO_NAME_MAX)
            return ifd_error_set(err, IFD_EINVAL, "checkpoint: producer '%s': name too long", name);
        int pos = position_index(g, name, &seq);
        if (pos < 0)
            return ifd_error_set(err, IFD_ENOMEM, "checkpoint: producer '%s'", name);
        /* Known, not connected: a HELLO under this name is told next_seq = seq + 1. An ended
         * slot may be reused for another name (the position table still knows this one). */
        producer *p = find_by_name(g, name);
        if (p == NULL && (p = new_slot(g)) != NULL) {
            p->used = 1;
            p->ended = 1;
            snprintf(p->name, sizeof p->name, "%s", name);
        }
        if (p) {
            p->last_seq = p->acked_seq = seq;
            p->pos = pos;
        }
        IFD_LOG_INFO("producer '%s' resumes at seq %" PRId64, name, seq + 1);
    }
    return IFD_OK;
}

int ifd_ingest_positions(void *arg, ifd_checkpoint *c, ifd_error *err)
{
    ifd_ingest *g = arg;
    int rc = IFD_OK;
    ifd_mutex_lock(&g->qmu);
    for (int i = 0; i < g->npos && rc == IFD_OK; i++)
        if (g->pos[i].seq >= 0)
            rc = ifd_checkpoint_set_producer(c, g->pos[i].name, g->pos[i].seq, err);
    ifd_mutex_unlock(&g->qmu);
    return rc;
}

int ifd_ingest_start(ifd_ingest *g, ifd_session *s, ifd_error *err)
{
    g->session = s;
    g->program = ifd_session_program(s);
    int idx[IFD_MAX_INPUTS];
    g->nin = ifd_infeed_mode_inputs(g->program, g->cfg->run.mode, idx);
    for (int i = 0; i < g->nin; i++)
        g->in[i] = &g->program->inputs[idx[i]];
    ifd_session_set_watchdog_context(s, watchdog_context, g);
    int rc = ifd_thread_start(&g->thread, "ifd-ingest", io_main, g);
    if (rc)
        return ifd_error_set(err, rc, "ingest: cannot start the I/O thread");
    g->started = 1;
    return IFD_OK;
}

void ifd_ingest_finish(ifd_ingest *g, int code, const char *reason, const char *message)
{
    ifd_mutex_lock(&g->omu);
    g->fin_code = code;
    snprintf(g->fin_reason, sizeof g->fin_reason, "%s", reason ? reason : "");
    snprintf(g->fin_message, sizeof g->fin_message, "%s", message ? message : "");
    g->finishing = 1;
    ifd_mutex_unlock(&g->omu);
    ifd_ingest_wake(g);
    if (g->started) {
        ifd_thread_join(&g->thread);
        g->started = 0;
    }
}
