/*
 * Replies to producers (docs/protocol.md), sent by the I/O thread without ever waiting.
 *
 * libzmq's ROUTER queues at most ZMQ_SNDHWM messages for a connection; one that does not read
 * its socket (a paused or busy producer, or one that others flood with liveness probes) fills
 * its queue, and a send to it then fails with EAGAIN. A reply that carries state (ACK, CREDIT,
 * WELCOME, BYE, PREDICTION, an ERROR that returns credit) is then kept in the connection's
 * outbox, in order, and sent once the queue takes it: the I/O thread retries at every pass.
 * While a connection has an outbox every reply to it joins it, so nothing overtakes; an ACK or a
 * CREDIT joins one of its type at the outbox's end (ACKs are cumulative), so a producer that
 * stops reading holds a few kept replies, not one a batch. An outbox goes with its connection
 * (a send finds it gone) and holds at most ifd_outbox_max(credit) replies (only a producer that
 * breaks the protocol reaches that: its later replies are dropped and logged). Replies without
 * state (an ERROR returning no credit, a probe) are dropped when the queue is full.
 */
#include "host/ingest/ingest_internal.h"
#include "host/limits.h"

#include "core/log.h"
#include "core/wire.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <search.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

typedef struct reply reply;
struct reply {
    reply *next;
    int type;
    int64_t seq;     /* ACK: the newest batch it covers */
    uint32_t credit; /* ACK, CREDIT: the credits it returns */
    uint8_t hdr[IFD_PROTO_HDR];
    char *json;           /* WELCOME, ERROR, BYE (owned) */
    prediction_msg *pred; /* PREDICTION (owned) */
};

/* A connection's replies waiting for its queue (in g's list and, by routing id, its tree). */
struct outbox {
    producer_rid key; /* points at rid */
    uint8_t rid[RID_MAX];
    reply *head, *tail;
    int len;
    outbox *next, *prev;
};

static void reply_free_parts(reply *r)
{
    free(r->json);
    ingest_prediction_free(r->pred);
    r->json = NULL;
    r->pred = NULL;
}

/* One message to `to` without waiting: 0, or why not (EAGAIN: its queue is full; EHOSTUNREACH:
 * the connection is gone). libzmq's ROUTER decides at the routing-id frame, and once it took
 * that it takes the rest of the message. */
static int reply_send(ifd_ingest *g, const producer_rid *to, const reply *r)
{
    uint8_t hdr[IFD_PROTO_ACK_HDR];
    const void *h = r->hdr;
    size_t hlen = IFD_PROTO_HDR;
    if (r->type == IFD_MSG_ACK) {
        hlen = ifd_proto_ack(hdr, r->seq, r->credit);
        h = hdr;
    } else if (r->type == IFD_MSG_CREDIT) {
        hlen = ifd_proto_credit(hdr, r->credit);
        h = hdr;
    } else if (r->pred) {
        h = r->pred->hdr;
        hlen = sizeof r->pred->hdr;
    }
    const char *json = r->pred ? r->pred->json : r->json;
    int nt = r->pred ? r->pred->ntensors : 0;
    if (zmq_send(g->sock.router, to->rid, to->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return zmq_errno();
    int rc = zmq_send(g->sock.router, h, hlen, (json ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
    if (rc >= 0 && json)
        rc = zmq_send(g->sock.router, json, strlen(json), (nt ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
    for (int i = 0; rc >= 0 && i < nt; i++)
        rc = zmq_send(g->sock.router, r->pred->data[i], r->pred->len[i],
                      (i + 1 < nt ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
    return rc < 0 ? zmq_errno() : 0;
}

static const char *type_name(int type)
{
    static const char *const names[] = {"?",   "HELLO", "WELCOME",    "BATCH", "CREDIT",   "ACK",
                                        "END", "ERROR", "PREDICTION", "BYE",   "BATCH_SHM"};
    return type > 0 && type < (int)(sizeof names / sizeof names[0]) ? names[type] : names[0];
}

/* A send to `to` failed with e (not EAGAIN on a kept reply): a closed connection marks its
 * producer gone (and drops its outbox); other failures are logged, rate-limited. */
static void send_failed(ifd_ingest *g, const producer_rid *to, int type, int e)
{
    if (e == EHOSTUNREACH) { /* the connection is closed or its heartbeats timed out */
        IFD_LOG_DEBUG("ingest: a %s was not sent: the peer is gone", type_name(type));
        ingest_note_gone(g, to);
        return;
    }
    IFD_LOG_LIMITED(&g->lim_reject, IFD_LOG_WARN, "ingest: a %s was not sent: %s", type_name(type),
                    zmq_strerror(e));
}

/* ---- outboxes -------------------------------------------------------------------------- */

static outbox *box_find(ifd_ingest *g, const producer_rid *to)
{
    void *node = tfind(to, &g->out.box_index, ingest_rid_cmp);
    return node ? (outbox *)((char *)*(producer_rid *const *)node - offsetof(outbox, key)) : NULL;
}

static outbox *box_new(ifd_ingest *g, const producer_rid *to)
{
    outbox *b = calloc(1, sizeof *b);
    if (b == NULL)
        return NULL;
    memcpy(b->rid, to->rid, to->len);
    b->key = (producer_rid){.rid = b->rid, .len = to->len};
    if (tsearch(&b->key, &g->out.box_index, ingest_rid_cmp) == NULL) {
        free(b);
        return NULL;
    }
    b->next = g->out.boxes;
    if (g->out.boxes)
        g->out.boxes->prev = b;
    g->out.boxes = b;
    g->out.nboxes++;
    return b;
}

static void box_free(ifd_ingest *g, outbox *b)
{
    while (b->head) {
        reply *r = b->head;
        b->head = r->next;
        reply_free_parts(r);
        free(r);
    }
    tdelete(&b->key, &g->out.box_index, ingest_rid_cmp);
    if (b->prev)
        b->prev->next = b->next;
    else
        g->out.boxes = b->next;
    if (b->next)
        b->next->prev = b->prev;
    g->out.nboxes--;
    free(b);
}

/* r (its parts now the outbox's) at the end of b: an ACK or CREDIT joins one of its type there. */
static void box_push(ifd_ingest *g, outbox *b, reply *r)
{
    reply *t = b->tail;
    if (t && t->type == r->type && (r->type == IFD_MSG_ACK || r->type == IFD_MSG_CREDIT)) {
        t->credit += r->credit;
        if (r->seq > t->seq)
            t->seq = r->seq;
        return;
    }
    reply *n = b->len < ifd_outbox_max(g->pr.credit) ? malloc(sizeof *n) : NULL;
    if (n == NULL) {
        producer *p = ingest_find_by_rid(g, &b->key);
        char name[4 * IFD_PROTO_NAME_MAX + 1];
        IFD_LOG_LIMITED(&g->lim_reject, IFD_LOG_WARN,
                        "ingest: a %s to %s%s%s was dropped: %d replies wait for the connection "
                        "to read them (at most %d; it does not read its socket)",
                        type_name(r->type), p ? "producer '" : "a connection",
                        p ? ifd_log_escape(p->name, name, sizeof name) : "", p ? "'" : "", b->len,
                        ifd_outbox_max(g->pr.credit));
        reply_free_parts(r);
        return;
    }
    *n = *r;
    n->next = NULL;
    if (t)
        t->next = n;
    else
        b->head = n;
    b->tail = n;
    b->len++;
}

/* Sends r to `to`, or keeps it in the connection's outbox (when it has one, or when keep and
 * the queue is full); r's parts are sent, kept or freed. */
static void reply_out(ifd_ingest *g, const producer_rid *to, reply r, int keep)
{
    outbox *b = g->out.nboxes ? box_find(g, to) : NULL;
    if (b == NULL) {
        int e = reply_send(g, to, &r);
        if (e == 0 || (e != EAGAIN && e != EINTR) || !keep) {
            if (e)
                send_failed(g, to, r.type, e);
            reply_free_parts(&r);
            return;
        }
        if ((b = box_new(g, to)) == NULL) {
            IFD_LOG_LIMITED(&g->lim_reject, IFD_LOG_WARN,
                            "ingest: a %s was not sent: its queue is full and there is no memory "
                            "to keep it",
                            type_name(r.type));
            reply_free_parts(&r);
            return;
        }
    }
    box_push(g, b, &r);
}

void ingest_replies_flush(ifd_ingest *g)
{
    for (outbox *b = g->out.boxes, *next; b; b = next) {
        next = b->next;
        int e = 0;
        while (b->head && (e = reply_send(g, &b->key, b->head)) == 0) {
            reply *r = b->head;
            b->head = r->next;
            if (b->head == NULL)
                b->tail = NULL;
            b->len--;
            reply_free_parts(r);
            free(r);
        }
        if (b->head && (e == EAGAIN || e == EINTR))
            continue; /* still full: next pass */
        if (e == 0) {
            box_free(g, b);
            continue;
        }
        uint8_t rid[RID_MAX];
        producer_rid to = {.rid = rid, .len = b->key.len};
        memcpy(rid, b->rid, to.len);
        int type = b->head->type;
        box_free(g, b); /* the connection is gone (or cannot be sent to): its replies with it */
        send_failed(g, &to, type, e);
    }
}

int ingest_replies_waiting(const ifd_ingest *g)
{
    return g->out.nboxes;
}

int ingest_replies_held(ifd_ingest *g, const producer_rid *to)
{
    return g->out.nboxes && box_find(g, to) != NULL;
}

void ingest_replies_drop(ifd_ingest *g, const producer_rid *to)
{
    outbox *b = g->out.nboxes ? box_find(g, to) : NULL;
    if (b)
        box_free(g, b);
}

void ingest_replies_free(ifd_ingest *g)
{
    while (g->out.boxes)
        box_free(g, g->out.boxes);
}

/* ---- the replies ------------------------------------------------------------------------ */

void ingest_send_json(ifd_ingest *g, const producer_rid *to, int type, json_t *j, int keep)
{
    reply r = {.type = type};
    ifd_proto_header(r.hdr, type);
    r.json = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (r.json)
        reply_out(g, to, r, keep);
}

void ingest_reply_ack(ifd_ingest *g, const producer_rid *to, int64_t seq, uint32_t n)
{
    reply_out(g, to, (reply){.type = IFD_MSG_ACK, .seq = seq, .credit = n}, 1);
}

void ingest_reply_credit(ifd_ingest *g, const producer_rid *to, uint32_t n)
{
    reply_out(g, to, (reply){.type = IFD_MSG_CREDIT, .credit = n}, 1);
}

void ingest_reply_prediction(ifd_ingest *g, const producer_rid *to, prediction_msg *m)
{
    reply_out(g, to, (reply){.type = IFD_MSG_PREDICTION, .pred = m}, 1);
}

int ingest_send_probe(ifd_ingest *g, const producer_rid *to)
{
    reply r = {.type = IFD_MSG_CREDIT, .credit = 0};
    int e = reply_send(g, to, &r);
    if (e && e != EAGAIN)
        send_failed(g, to, r.type, e);
    return e;
}

/* Printable ASCII kept, every other byte written as \xHH, always terminated. */
void ingest_ascii_escape(const char *in, char *out, size_t len)
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

/* ERROR: code, seq (NO_SEQ: null), credit returned (kept when > 0), and the sentence. */
void ingest_send_error(ifd_ingest *g, const producer_rid *to, int code, int64_t seq, int credit,
                       const char *fmt, ...)
{
    char msg[IFD_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (IFD_LOG_INFO <= ifd_log_level_) { /* every rejection, escaped, rate-limited */
        char safe[4 * IFD_ERROR_MSG_MAX + 1];
        IFD_LOG_LIMITED(&g->lim_reject, IFD_LOG_INFO, "rejected (%s): %s", ifd_errname(code),
                        ifd_log_escape(msg, safe, sizeof safe));
    }
    json_t *j = json_object();
    const char *name = ifd_errname(code);
    if (strncmp(name, "IFD_", 4) == 0) /* the wire names are ESHAPE, EPROTO, ... */
        name += 4;
    json_object_set_new(j, "code", json_string(name));
    json_object_set_new(j, "seq", seq != NO_SEQ ? json_integer(seq) : json_null());
    json_object_set_new(j, "credit", json_integer(credit));
    json_t *text = json_string(msg);
    if (text == NULL) { /* not UTF-8: bytes a peer sent, quoted back; escape them */
        char safe[IFD_ERROR_MSG_MAX * 2];
        ingest_ascii_escape(msg, safe, sizeof safe);
        text = json_string(safe);
    }
    json_object_set_new(j, "message", text);
    ingest_send_json(g, to, IFD_MSG_ERROR, j, credit > 0);
}
