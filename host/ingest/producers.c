/*
 * The producer table (I/O thread): slots by connection and by name, the position table (under
 * fifo.mu, which the infeed thread takes to update it), liveness probes and timeouts, END and
 * the input's end, the connections of ended producers that still wait for their BYE.
 */
#include "host/ingest/ingest_internal.h"
#include "host/security.h"

#include "core/log.h"
#include "core/thread.h"
#include "core/wire.h"
#include <infeed/checkpoint.h>
#include "intake/inputs.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <search.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* ---- the producer table -------------------------------------------------------------------- */

/* Producers are found by connection (every message) through a tsearch tree of their rids, by name
 * (a HELLO) by a scan of the max_producers slots; positions by name through a tree of their
 * own. POSIX tsearch is the libc's balanced tree: no hand-written index. */

int ingest_rid_cmp(const void *a, const void *b)
{
    const producer_rid *x = a, *y = b;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return memcmp(x->rid, y->rid, x->len);
}

static int pos_cmp(const void *a, const void *b)
{
    return strcmp(((const position *)a)->name, ((const position *)b)->name);
}

producer_rid ingest_rid_of(const producer *p)
{
    producer_rid r = {.rid = p->rid, .len = p->rid_len};
    return r;
}

producer *ingest_find_by_rid(ifd_ingest *g, const producer_rid *r)
{
    void *node = tfind(r, &g->by_rid, ingest_rid_cmp);
    if (node == NULL)
        return NULL;
    const producer_rid *key = *(producer_rid *const *)node;
    return (producer *)((char *)key - offsetof(producer, key));
}

producer *ingest_find_by_name(ifd_ingest *g, const char *name)
{
    for (int i = 0; i < g->cfg->max_producers; i++)
        if (g->producers[i].used && strcmp(g->producers[i].name, name) == 0)
            return &g->producers[i];
    return NULL;
}

static void forget_ended_conn(ifd_ingest *g, const producer_rid *r);

/* p forgets its connection. */
void ingest_slot_unbind(ifd_ingest *g, producer *p)
{
    if (p->rid_len) {
        tdelete(&p->key, &g->by_rid, ingest_rid_cmp);
        ifd_conns_unmark(g->sock.conns, p->fd, p->conn_mark);
    }
    p->rid_len = 0;
    p->fd = -1;
    p->conn_mark = 0;
    p->key = (producer_rid){0};
}

/* p is now reached through connection r (which no other producer has); IFD_ENOMEM when the index
 * cannot grow. */
int ingest_slot_bind(ifd_ingest *g, producer *p, const producer_rid *r)
{
    ingest_slot_unbind(g, p);
    if (g->nended_conns)
        forget_ended_conn(g, r);
    memcpy(p->rid, r->rid, r->len);
    p->rid_len = r->len;
    p->key = (producer_rid){.rid = p->rid, .len = p->rid_len};
    p->gone = 0;
    if (tsearch(&p->key, &g->by_rid, ingest_rid_cmp) == NULL) {
        p->rid_len = 0;
        return IFD_ENOMEM;
    }
    p->probe_ns = p->probe_ivl_ns = 0; /* a new connection: probed afresh */
    p->fd = g->sock.msg_fd;            /* a producer's connection is never closed to make room */
    p->conn_mark = ifd_conns_mark(g->sock.conns, p->fd);
    return IFD_OK;
}

void ingest_slot_reset(ifd_ingest *g, producer *p)
{
    if (p->eval_open)
        ifd_eval_set_abandon(g->eval, p->name, "gave up its producer slot");
    ingest_slot_unbind(g, p);
    ingest_shm_drop(g, p);
    memset(p, 0, sizeof *p);
}

/* Whether position entry i belongs to a producer slot (a slot's batches use its entry). */
static int position_in_use(ifd_ingest *g, int i)
{
    for (int k = 0; k < g->cfg->max_producers; k++)
        if (g->producers[k].used && g->producers[k].pos == i)
            return 1;
    return 0;
}

/* The index of name's position entry, added (seq -1, or seq when given >= 0) when missing; -1
 * when out of memory, -2 when the table holds max_pos names already, each with a position or a
 * producer. Locks qmu: the infeed thread updates the table in src_pop. */
int ingest_position_known(ifd_ingest *g, const char *name)
{
    position key;
    snprintf(key.name, sizeof key.name, "%s", name);
    ifd_mutex_lock(&g->fifo.mu);
    int known = tfind(&key, &g->fifo.pos_index, pos_cmp) != NULL;
    ifd_mutex_unlock(&g->fifo.mu);
    return known;
}

int ingest_key_names(ifd_ingest *g, const char *key)
{
    int n = 0;
    ifd_mutex_lock(&g->fifo.mu);
    for (int i = 0; i < g->fifo.npos; i++)
        n += strcmp(g->fifo.pos[i]->key, key) == 0 &&
             (g->fifo.pos[i]->seq >= 0 || position_in_use(g, i));
    ifd_mutex_unlock(&g->fifo.mu);
    return n;
}

int ingest_position_index(ifd_ingest *g, const char *name, const char *owner, int64_t *seq)
{
    position key = {.key = ""};
    snprintf(key.name, sizeof key.name, "%s", name);
    snprintf(key.key, sizeof key.key, "%s", owner ? owner : "");
    ifd_mutex_lock(&g->fifo.mu);
    int i;
    void *node = tfind(&key, &g->fifo.pos_index, pos_cmp);
    if (node) {
        position *e = *(position **)node;
        for (i = 0; g->fifo.pos[i] != e; i++)
            ;
    } else {
        /* a new name: a fresh entry, or one that never got a position and has no producer */
        i = g->fifo.npos;
        if (g->fifo.npos >= g->fifo.max_pos)
            for (int k = 0; k < g->fifo.npos; k++)
                if (g->fifo.pos[k]->seq < 0 && !position_in_use(g, k)) {
                    i = k;
                    break;
                }
        if (i == g->fifo.npos && g->fifo.npos >= g->fifo.max_pos) {
            ifd_mutex_unlock(&g->fifo.mu);
            return -2;
        }
        position *e;
        if (i < g->fifo.npos) { /* recycled */
            e = g->fifo.pos[i];
            tdelete(e, &g->fifo.pos_index, pos_cmp);
        } else {
            if (g->fifo.npos == g->fifo.cap_pos) {
                int cap = g->fifo.cap_pos ? 2 * g->fifo.cap_pos : 16;
                position **tab = realloc(g->fifo.pos, (size_t)cap * sizeof *tab);
                if (tab == NULL) {
                    ifd_mutex_unlock(&g->fifo.mu);
                    return -1;
                }
                g->fifo.pos = tab;
                g->fifo.cap_pos = cap;
            }
            e = malloc(sizeof *e);
            if (e == NULL) {
                ifd_mutex_unlock(&g->fifo.mu);
                return -1;
            }
            g->fifo.pos[g->fifo.npos++] = e;
        }
        *e = key;
        e->seq = -1;
        if (tsearch(e, &g->fifo.pos_index, pos_cmp) == NULL) {
            e->name[0] = '\0'; /* an entry no name finds; recycled later */
            ifd_mutex_unlock(&g->fifo.mu);
            return -1;
        }
    }
    if (*seq > g->fifo.pos[i]->seq)
        g->fifo.pos[i]->seq = *seq;
    *seq = g->fifo.pos[i]->seq;
    ifd_mutex_unlock(&g->fifo.mu);
    return i;
}

static void no_free(void *p)
{
    (void)p;
}

void ingest_producers_free(ifd_ingest *g)
{
    ingest_drop_busy_hello(g, NULL);
    tdestroy(g->by_rid, no_free);
    tdestroy(g->fifo.pos_index, no_free);
    for (int i = 0; i < g->fifo.npos; i++)
        free(g->fifo.pos[i]);
    free(g->fifo.pos);
    g->by_rid = g->fifo.pos_index = NULL;
    g->fifo.pos = NULL;
}

/*
 * Whether p's connection still exists: a CREDIT of 0 (a no-op every client ignores) is sent to
 * it; libzmq's ROUTER (ZMQ_ROUTER_MANDATORY) refuses a connection that is closed or whose
 * heartbeats went unanswered. Probes cost the producer a place in its queue, and anyone can
 * cause them (a HELLO naming it, a full producer table), so a producer is probed at most once
 * per interval: PROBE_MIN_NS after a message from it, doubling to PROBE_MAX_NS while it stays
 * silent (a connection just closed is found within the waits of a parked HELLO). Between probes,
 * and while its replies wait in an outbox (its queue was full: the connection is there), the
 * answer is the last one: alive unless a send found it gone.
 */
#define PROBE_MIN_NS 5000000LL
#define PROBE_MAX_NS 1000000000LL
int ingest_probe_alive(ifd_ingest *g, producer *p)
{
    if (p->rid_len == 0 || p->gone)
        return 0;
    producer_rid r = ingest_rid_of(p);
    int64_t now = ifd_clock_ns();
    if (p->probe_ns && now - p->probe_ns < p->probe_ivl_ns)
        return 1;
    if (ingest_replies_held(g, &r))
        return 1;
    if (p->heard_ns >= p->probe_ns || p->probe_ivl_ns < PROBE_MIN_NS)
        p->probe_ivl_ns = PROBE_MIN_NS;
    else if (p->probe_ivl_ns < PROBE_MAX_NS)
        p->probe_ivl_ns = 2 * p->probe_ivl_ns < PROBE_MAX_NS ? 2 * p->probe_ivl_ns : PROBE_MAX_NS;
    p->probe_ns = now;
    ingest_send_probe(g, &r); /* EHOSTUNREACH marks it gone; EAGAIN: full, so there */
    return !p->gone;
}

/* ---- ended producers whose slots were given away ------------------------------------------ */

/* At most this many such connections wait for their BYE (there are never more connections). */
static int ended_conns_max(const ifd_ingest *g)
{
    return ifd_daemon_max_connections(g->cfg);
}

static void ended_conn_unlink(ifd_ingest *g, ended_conn **at)
{
    ended_conn *e = *at;
    *at = e->next;
    free(e);
    g->nended_conns--;
}

/* r's entry, if it has one, is removed (its connection said HELLO again: the BYE will be its
 * producer's). */
static void forget_ended_conn(ifd_ingest *g, const producer_rid *r)
{
    for (ended_conn **at = &g->ended_conns; *at; at = &(*at)->next)
        if ((*at)->rid_len == r->len && memcmp((*at)->rid, r->rid, r->len) == 0) {
            ended_conn_unlink(g, at);
            return;
        }
}

/* p ended and its slot goes to another producer: its connection, if it is still there, keeps
 * its BYE. When the list is full, entries whose connections are gone are removed (a probe
 * each), then the oldest. */
static void keep_ended_conn(ifd_ingest *g, const producer *p)
{
    if (p->rid_len == 0 || p->gone)
        return;
    if (g->nended_conns >= ended_conns_max(g)) {
        ended_conn **oldest = NULL;
        for (ended_conn **at = &g->ended_conns; *at;) {
            producer_rid r = {.rid = (*at)->rid, .len = (*at)->rid_len};
            int e = ingest_replies_held(g, &r) ? EAGAIN : ingest_send_probe(g, &r);
            if (e != 0 && e != EAGAIN) {
                ended_conn_unlink(g, at);
                continue;
            }
            oldest = at; /* entries are added at the front: the last is the oldest */
            at = &(*at)->next;
        }
        if (g->nended_conns >= ended_conns_max(g) && oldest)
            ended_conn_unlink(g, oldest);
    }
    ended_conn *e = malloc(sizeof *e);
    if (e == NULL)
        return;
    memcpy(e->rid, p->rid, p->rid_len);
    e->rid_len = p->rid_len;
    memcpy(e->name, p->name, sizeof e->name);
    e->acked_seq = p->acked_seq;
    e->next = g->ended_conns;
    g->ended_conns = e;
    g->nended_conns++;
}

void ingest_bye_ended_conns(ifd_ingest *g, json_t *bye)
{
    while (g->ended_conns) {
        ended_conn *e = g->ended_conns;
        json_t *b = json_copy(bye);
        json_object_set_new(b, "acked_seq", json_integer(e->acked_seq));
        producer_rid r = {.rid = e->rid, .len = e->rid_len};
        ingest_send_json(g, &r, IFD_MSG_BYE, b, 1);
        IFD_LOG_DEBUG("BYE to producer '%s', ended, its slot given away", e->name);
        ended_conn_unlink(g, &g->ended_conns);
    }
}

void ingest_ended_conns_free(ifd_ingest *g)
{
    while (g->ended_conns)
        ended_conn_unlink(g, &g->ended_conns);
}

/* A free slot, reusing one whose producer ended (sent END or timed out) with nothing in flight,
 * else one whose connection is gone (probed) with nothing in flight (a peer that said HELLO and
 * left; its position stays in the position table). */
producer *ingest_new_slot(ifd_ingest *g)
{
    for (int i = 0; i < g->cfg->max_producers; i++)
        if (!g->producers[i].used)
            return &g->producers[i];
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->cfg->max_producers; i++) {
            producer *p = &g->producers[i];
            if (p->in_flight == 0 && (pass == 0 ? p->ended : !ingest_probe_alive(g, p))) {
                if (pass == 0)
                    keep_ended_conn(g, p);
                if (pass == 1) {
                    char n[4 * IFD_PROTO_NAME_MAX + 1];
                    IFD_LOG_LIMITED(&g->lim_gone, IFD_LOG_INFO,
                                    "producer '%s' (connection gone, nothing in flight) gives "
                                    "its slot to a new producer",
                                    ifd_log_escape(p->name, n, sizeof n));
                    if (!p->counted_end && !p->eval)
                        g->ended_total++; /* as a timeout would: it no longer holds the input */
                }
                ingest_slot_reset(g, p);
                return p;
            }
        }
    return NULL;
}

/* ---- liveness ------------------------------------------------------------------------------- */

void ingest_note_gone(ifd_ingest *g, const producer_rid *to)
{
    ingest_replies_drop(g, to);
    producer *p = ingest_find_by_rid(g, to);
    if (p == NULL || p->gone)
        return;
    p->gone = 1;
    p->gone_ns = ifd_clock_ns();
    ingest_shm_drop(g, p); /* a new connection says HELLO, with a new pool if it asks */
    if (p->welcomed && !p->ended) {
        char n[4 * IFD_PROTO_NAME_MAX + 1];
        IFD_LOG_LIMITED(&g->lim_gone, IFD_LOG_INFO,
                        "producer '%s': its connection is gone without END (%d batches in "
                        "flight, last seq %" PRId64 "); %s",
                        ifd_log_escape(p->name, n, sizeof n), p->in_flight, p->last_seq,
                        g->cfg->producer_timeout > 0
                            ? "it is timed out unless it comes back within producer_timeout"
                            : "the input stays open for it (producer_timeout 0)");
    }
}

static void time_out(ifd_ingest *g, producer *p, const char *why)
{
    char n[4 * IFD_PROTO_NAME_MAX + 1];
    IFD_LOG_LIMITED(&g->lim_gone, IFD_LOG_INFO,
                    "producer '%s' timed out (%s for %g s; producer_timeout): %d unused credits "
                    "taken back, %d accepted batches still trained on, counted as ended",
                    ifd_log_escape(p->name, n, sizeof n), why, g->cfg->producer_timeout, p->credit,
                    p->in_flight);
    p->timed_out = 1;
    p->ended = 1;
    p->credit = 0;
    if (p->eval_open) {
        p->eval_open = 0;
        ifd_eval_set_abandon(g->eval, p->name, "timed out (producer_timeout)");
    }
    ingest_shm_drop(g, p); /* its steps in flight keep the pool until they are consumed */
    if (!p->counted_end && !p->eval)
        g->ended_total++;
    p->counted_end = 1;
}

void ingest_check_liveness(ifd_ingest *g)
{
    int64_t now = ifd_clock_ns();
    if (now - g->liveness_ns < 100000000LL)
        return;
    g->liveness_ns = now;
    if (g->cfg->producer_timeout <= 0)
        return;
    int64_t limit = (int64_t)(g->cfg->producer_timeout * 1e9);
    int changed = 0;
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        if (!p->used || !p->welcomed || p->ended)
            continue;
        if (p->gone && now - p->gone_ns >= limit) {
            time_out(g, p, "connection gone");
            changed = 1;
        } else if (!p->gone && p->credit > 0 && now - p->heard_ns >= limit) {
            if (!ingest_probe_alive(g, p)) /* gone just now: give it the timeout from here */
                continue;
            time_out(g, p, "silent with credit");
            changed = 1;
        }
    }
    if (changed) {
        ingest_count_producers(g);
        ingest_check_input_end(g);
    }
}

/* The input ends once every producer welcomed so far has sent END, or, with expect_producers,
 * once that many have (so that a producer that connects late is not shut out). */
/* Publishes the producer counts the watchdog's sentence reads. */
void ingest_count_producers(ifd_ingest *g)
{
    int connected = 0;
    for (int i = 0; i < g->cfg->max_producers; i++)
        connected += g->producers[i].used && g->producers[i].welcomed && !g->producers[i].ended;
    __atomic_store_n(&g->watch_connected, connected, __ATOMIC_RELAXED);
    __atomic_store_n(&g->watch_ended, g->ended_total, __ATOMIC_RELAXED);
}

/* The watchdog's context (its thread): "1 producer connected, 0 ended". */
void ingest_watchdog_context(void *arg, char *buf, size_t len)
{
    ifd_ingest *g = arg;
    int connected = __atomic_load_n(&g->watch_connected, __ATOMIC_RELAXED);
    snprintf(buf, len, "%d producer%s connected, %d ended", connected, connected == 1 ? "" : "s",
             __atomic_load_n(&g->watch_ended, __ATOMIC_RELAXED));
}

void ingest_check_input_end(ifd_ingest *g)
{
    if (g->input_closed || !g->ever_welcomed)
        return;
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        if (p->used && p->welcomed && !p->ended && !p->eval)
            return;
    }
    if (g->cfg->expect_producers > 0 && g->ended_total < g->cfg->expect_producers)
        return;
    ingest_close_input(g, "every producer sent END or timed out");
}

void ingest_handle_end(ifd_ingest *g, const producer_rid *from)
{
    producer *p = ingest_find_by_rid(g, from);
    if (p == NULL || !p->welcomed) {
        ingest_send_error(g, from, IFD_EPROTO, NO_SEQ, 0, "END before HELLO");
        return;
    }
    if (!p->ended) {
        char n[4 * IFD_PROTO_NAME_MAX + 1];
        IFD_LOG_LIMITED(&g->lim_hello, IFD_LOG_INFO,
                        "producer '%s' ended its stream after batch %" PRId64,
                        ifd_log_escape(p->name, n, sizeof n), p->last_seq);
        if (!p->counted_end && !p->eval)
            g->ended_total++;
        p->counted_end = 1;
    }
    if (p->eval_open) {
        p->eval_open = 0;
        ifd_eval_set_end(g->eval);
    }
    p->ended = 1;
    ingest_shm_drop(g, p); /* a HELLO starts again, with a new pool if it asks */
    ingest_count_producers(g);
    ingest_check_input_end(g);
}
