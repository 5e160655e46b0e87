/*
 * The ZeroMQ transport of the ingest: a ROUTER message becomes spans for the protocol
 * (host/ingest/protocol.h) and, once a BATCH is accepted, a host_frames that keeps the received
 * zmq frames (no copy) until the runtime releases the last step that reads them. A HELLO that
 * must wait (a busy name, no free slot) is parked here with its frame, to be handled again.
 * I/O thread only.
 */
#include "host/ingest/zmq_transport.h"

#include "core/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ---- a BATCH's frames ------------------------------------------------------------------------ */

/* The received tensor frames, moved out of the message (the device reads them where libzmq put
 * them). Freed on the I/O thread (when the message is acknowledged), which keeps up to the
 * credit's worth of them for the next messages instead of a calloc and a free a message. */
typedef struct zmq_frames {
    host_frames base;
    ifd_ingest *g;
    int nframes;
    zmq_msg_t frames[IFD_MAX_INPUTS];
    struct zmq_frames *next; /* in g's spares */
} zmq_frames;

static void zmq_frames_free(host_frames *fr)
{
    zmq_frames *z = (zmq_frames *)fr;
    ifd_ingest *g = z->g;
    for (int i = 0; i < z->nframes; i++)
        zmq_msg_close(&z->frames[i]);
    if (g->sock.nframes_spare >= g->pr.credit) {
        free(z);
        return;
    }
    z->next = g->sock.frames_spare;
    g->sock.frames_spare = z;
    g->sock.nframes_spare++;
}

/* A zeroed holder: a spare one, else allocated (NULL: out of memory). */
static zmq_frames *zmq_frames_take(ifd_ingest *g)
{
    zmq_frames *z = g->sock.frames_spare;
    if (z == NULL) {
        z = calloc(1, sizeof *z);
    } else {
        g->sock.frames_spare = z->next;
        g->sock.nframes_spare--;
        memset(z, 0, sizeof *z);
    }
    if (z) {
        z->g = g;
        z->base.free = zmq_frames_free;
    }
    return z;
}

void ingest_zmq_spares_free(ifd_ingest *g)
{
    while (g->sock.frames_spare) {
        zmq_frames *z = g->sock.frames_spare;
        g->sock.frames_spare = z->next;
        free(z);
    }
    g->sock.nframes_spare = 0;
}

/* The frames move into a zmq_frames; a frame libzmq left unaligned for its dtype is copied. */
static int take_frames(ifd_ingest *g, zmq_frames *z, zmq_msg_t *frames)
{
    for (int i = 0; i < g->pr.nin; i++) {
        zmq_msg_init(&z->frames[i]);
        zmq_msg_move(&z->frames[i], &frames[i]);
        z->nframes = i + 1;
        char *data = zmq_msg_data(&z->frames[i]);
        z->base.data[i] = data;
        if ((uintptr_t)data % ifd_dtype_size(g->pr.in[i]->dtype) != 0) { /* unaligned */
            z->base.copy_len[i] = zmq_msg_size(&z->frames[i]);
            z->base.data[i] = z->base.copies[i] =
                ingest_copy_aligned(g, i, data, z->base.copy_len[i]);
            if (z->base.copies[i] == NULL)
                return IFD_ENOMEM;
        }
    }
    return IFD_OK;
}

/* BATCH: parts[1] is the header, parts[2...] the tensor frames. */
static void handle_batch(ifd_ingest *g, const producer_rid *from, zmq_msg_t *parts, int total)
{
    size_t hlen = zmq_msg_size(&parts[1]);
    if (hlen < IFD_PROTO_BATCH_HDR) {
        ingest_send_error(g, from, IFD_EPROTO, NO_SEQ, 0,
                          "BATCH header: expected %d bytes (seq, rows, flags, ntensors), got %zu",
                          IFD_PROTO_BATCH_HDR, hlen);
        return;
    }
    ifd_proto_batch bh;
    ifd_proto_parse_batch(zmq_msg_data(&parts[1]), &bh);
    int k, skip;
    producer *p = ingest_batch_begin(g, from, &bh, "BATCH", &k);
    if (p == NULL)
        return;
    int nframes = total - 2;
    ingest_span frames[MAX_PARTS];
    for (int i = 0; i < nframes && i < MAX_PARTS - 2; i++)
        frames[i] = (ingest_span){zmq_msg_data(&parts[2 + i]), zmq_msg_size(&parts[2 + i])};
    char msg[IFD_ERROR_MSG_MAX];
    int code = ingest_batch_check(&g->pr, &bh, k, frames, nframes, msg, sizeof msg);
    if (code) {
        ingest_batch_reject(g, p, from, k, code, bh.seq, msg);
        return;
    }
    if (ingest_batch_sequence(g, p, from, &bh, k, &skip))
        return;
    zmq_frames *z = zmq_frames_take(g);
    int rc = IFD_OK;
    if (z)
        rc = take_frames(g, z, &parts[2]);
    ingest_batch_accept(g, p, from, &bh, k, skip, z ? &z->base : NULL, rc, -1);
}

/* ---- HELLOs that wait -------------------------------------------------------------------------
 */

/* A parked HELLO: its connection, its JSON frame, since when it waits. */
struct busy_hello {
    int used;
    uint8_t rid[RID_MAX];
    size_t rid_len;
    zmq_msg_t body;
    int64_t since_ns, next_ns;
};

/* A HELLO the transport can park (its frame keeps the CURVE User-Id). */
typedef struct zmq_hello {
    ingest_hello_msg m;
    ifd_ingest *g;
    const producer_rid *from;
    const zmq_msg_t *body;
} zmq_hello;

/* A HELLO for a busy name waits (BUSY_HELLO_NS) for the old connection's route to go: 1 if it
 * was parked, 0 if it is to be answered now (waited long enough, or no room). */
static int park_hello(ingest_hello_msg *m)
{
    zmq_hello *z = (zmq_hello *)m;
    ifd_ingest *g = z->g;
    int64_t now = ifd_clock_ns();
    int64_t since = g->hello_since_ns ? g->hello_since_ns : now;
    if (now - since >= BUSY_HELLO_NS || g->nbusy >= BUSY_HELLO_MAX)
        return 0;
    if (g->busy == NULL && (g->busy = calloc(BUSY_HELLO_MAX, sizeof *g->busy)) == NULL)
        return 0;
    for (int i = 0; i < BUSY_HELLO_MAX; i++) {
        busy_hello *b = &g->busy[i];
        if (b->used)
            continue;
        zmq_msg_init(&b->body);
        if (zmq_msg_copy(&b->body, (zmq_msg_t *)z->body) != 0) { /* keeps the CURVE User-Id */
            zmq_msg_close(&b->body);
            return 0;
        }
        memcpy(b->rid, z->from->rid, z->from->len);
        b->rid_len = z->from->len;
        b->since_ns = since;
        /* 5, 10, 20, 40 ms... then every 100 ms */
        int64_t wait = now - since < 5000000LL ? 5000000LL : now - since;
        b->next_ns = now + (wait < 100000000LL ? wait : 100000000LL);
        b->used = 1;
        g->nbusy++;
        return 1;
    }
    return 0;
}

/* The HELLO in body, from `from`, to the protocol. */
static void handle_hello(ifd_ingest *g, const producer_rid *from, const zmq_msg_t *body)
{
    zmq_msg_t *b = (zmq_msg_t *)body;
    zmq_hello z = {.g = g, .from = from, .body = body};
    z.m.json = (ingest_span){zmq_msg_data(b), zmq_msg_size(b)};
    z.m.user_id = g->cfg->security ? zmq_msg_gets(b, "User-Id") : NULL;
    z.m.peer_address = zmq_msg_gets(b, "Peer-Address");
    z.m.park = park_hello;
    ingest_handle_hello(g, from, &z.m);
}

static void busy_free(ifd_ingest *g, busy_hello *b)
{
    zmq_msg_close(&b->body);
    b->used = 0;
    g->nbusy--;
}

void ingest_drop_busy_hello(ifd_ingest *g, const producer_rid *from)
{
    for (int i = 0; i < BUSY_HELLO_MAX && g->nbusy > 0; i++) {
        busy_hello *b = &g->busy[i];
        if (b->used && (from == NULL ||
                        (b->rid_len == from->len && memcmp(b->rid, from->rid, from->len) == 0)))
            busy_free(g, b);
    }
    if (from == NULL) {
        free(g->busy);
        g->busy = NULL;
    }
}

void ingest_retry_busy_hellos(ifd_ingest *g)
{
    if (g->nbusy == 0)
        return;
    int64_t now = ifd_clock_ns();
    for (int i = 0; i < BUSY_HELLO_MAX; i++) {
        busy_hello *b = &g->busy[i];
        if (!b->used || b->next_ns > now)
            continue;
        /* out of its slot first: handling it again may park it again */
        uint8_t rid[RID_MAX];
        memcpy(rid, b->rid, b->rid_len);
        producer_rid from = {.rid = rid, .len = b->rid_len};
        zmq_msg_t body;
        zmq_msg_init(&body);
        zmq_msg_move(&body, &b->body);
        g->hello_since_ns = b->since_ns;
        g->sock.msg_fd = zmq_msg_get(&body, ZMQ_SRCFD);
        busy_free(g, b);
        handle_hello(g, &from, &body);
        g->hello_since_ns = 0;
        zmq_msg_close(&body);
    }
}

/* ---- messages ------------------------------------------------------------------------------- */

/* Whether a message from a connection that is no producer's is handled: one over
 * --max-connections is answered why, once, and closed (host/conns.h), and one being closed is
 * ignored. */
static int admitted(ifd_ingest *g, const producer_rid *from)
{
    int v = ifd_conns_verdict(g->sock.conns, g->sock.msg_fd);
    if (v == IFD_CONN_REFUSED)
        ingest_send_error(g, from, IFD_EBUSY, NO_SEQ, 0,
                          "connection refused: the daemon is at its limit of %d connections "
                          "(--max-connections), every one with a producer or new; this "
                          "connection is closed: try again later",
                          ifd_daemon_max_connections(g->cfg));
    return v == IFD_CONN_ADMITTED;
}

void ingest_handle_message(ifd_ingest *g, zmq_msg_t *parts, int nparts, int total)
{
    (void)nparts; /* frames beyond MAX_PARTS were dropped: every type's frame count check fails */
    producer_rid from = {.rid = zmq_msg_data(&parts[0]), .len = zmq_msg_size(&parts[0])};
    if (from.len > RID_MAX)
        return;
    producer *known = ingest_find_by_rid(g, &from);
    if (known)
        known->heard_ns = ifd_clock_ns();
    if (g->nbusy)
        ingest_drop_busy_hello(g, &from); /* its newer message replaces a parked HELLO */
    ifd_error e;
    int type = 0;
    if (total < 2) { /* no header: answered before anything else */
        ingest_message_check((ingest_span){0}, 0, &type, &e);
        ingest_send_error(g, &from, e.code, NO_SEQ, 0, "%s", e.msg);
        return;
    }
    g->sock.msg_fd = known ? known->fd : zmq_msg_get(&parts[1], ZMQ_SRCFD);
    if (known == NULL && !admitted(g, &from))
        return;
    ingest_span hdr = {zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1])};
    if (ingest_message_check(hdr, total - 1, &type, &e) != IFD_OK) {
        ingest_send_error(g, &from, e.code, NO_SEQ, 0, "%s", e.msg);
        return;
    }
    switch (type) {
    case IFD_MSG_HELLO:
        handle_hello(g, &from, &parts[2]);
        return;
    case IFD_MSG_BATCH:
        handle_batch(g, &from, parts, total);
        return;
    case IFD_MSG_BATCH_SHM:
        ingest_shm_handle_batch(g, &from, hdr, total - 2);
        return;
    default: /* IFD_MSG_END */
        ingest_handle_end(g, &from);
    }
}

int ingest_recv_message(ifd_ingest *g, zmq_msg_t *parts, int *nparts, int *total)
{
    *nparts = 0;
    *total = 0;
    for (;;) {
        zmq_msg_t *m = &parts[*nparts < MAX_PARTS ? *nparts : MAX_PARTS];
        zmq_msg_init(m);
        if (zmq_msg_recv(m, g->sock.router, *total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(m);
            for (int q = 0; q < *nparts; q++) /* a message cut short: drop its first parts */
                zmq_msg_close(&parts[q]);
            *nparts = 0;
            errno = e; /* EAGAIN: the ROUTER is read empty (host/ingest/zmq_wait.h) */
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

int ingest_recv_burst(ifd_ingest *g)
{
    zmq_msg_t parts[MAX_PARTS + 1];
    int drained = 0;
    for (int k = 0; k < RECV_BURST; k++) {
        int np, total;
        if (ingest_recv_message(g, parts, &np, &total)) {
            drained = zmq_errno() == EAGAIN;
            break;
        }
        ingest_handle_message(g, parts, np, total);
        for (int q = 0; q < np; q++)
            zmq_msg_close(&parts[q]);
    }
    ingest_fifo_flush(g);
    return drained;
}
