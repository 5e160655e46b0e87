#include "host/ingest_internal.h"
#include "host/security.h"

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
#include <search.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

/* ---- the producer table -------------------------------------------------------------------- */

/* Producers are found by connection (every message) through a tsearch tree of their rids, by name
 * (a HELLO) by a scan of the max_producers slots; positions by name through a tree of their
 * own. POSIX tsearch is the libc's balanced tree: no hand-written index. */

static int rid_cmp(const void *a, const void *b)
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
    void *node = tfind(r, &g->by_rid, rid_cmp);
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

/* p forgets its connection. */
static void slot_unbind(ifd_ingest *g, producer *p)
{
    if (p->rid_len)
        tdelete(&p->key, &g->by_rid, rid_cmp);
    p->rid_len = 0;
    p->key = (producer_rid){0};
}

/* p is now reached through connection r (which no other producer has); IFD_ENOMEM when the index
 * cannot grow. */
static int slot_bind(ifd_ingest *g, producer *p, const producer_rid *r)
{
    slot_unbind(g, p);
    memcpy(p->rid, r->rid, r->len);
    p->rid_len = r->len;
    p->key = (producer_rid){.rid = p->rid, .len = p->rid_len};
    p->gone = 0;
    if (tsearch(&p->key, &g->by_rid, rid_cmp) == NULL) {
        p->rid_len = 0;
        return IFD_ENOMEM;
    }
    return IFD_OK;
}

static void slot_reset(ifd_ingest *g, producer *p)
{
    slot_unbind(g, p);
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
int ingest_position_index(ifd_ingest *g, const char *name, int64_t *seq)
{
    position key;
    snprintf(key.name, sizeof key.name, "%s", name);
    ifd_mutex_lock(&g->qmu);
    int i;
    void *node = tfind(&key, &g->pos_index, pos_cmp);
    if (node) {
        position *e = *(position **)node;
        for (i = 0; g->pos[i] != e; i++)
            ;
    } else {
        /* a new name: a fresh entry, or one that never got a position and has no producer */
        i = g->npos;
        if (g->npos >= g->max_pos)
            for (int k = 0; k < g->npos; k++)
                if (g->pos[k]->seq < 0 && !position_in_use(g, k)) {
                    i = k;
                    break;
                }
        if (i == g->npos && g->npos >= g->max_pos) {
            ifd_mutex_unlock(&g->qmu);
            return -2;
        }
        position *e;
        if (i < g->npos) { /* recycled */
            e = g->pos[i];
            tdelete(e, &g->pos_index, pos_cmp);
        } else {
            if (g->npos == g->cap_pos) {
                int cap = g->cap_pos ? 2 * g->cap_pos : 16;
                position **tab = realloc(g->pos, (size_t)cap * sizeof *tab);
                if (tab == NULL) {
                    ifd_mutex_unlock(&g->qmu);
                    return -1;
                }
                g->pos = tab;
                g->cap_pos = cap;
            }
            e = malloc(sizeof *e);
            if (e == NULL) {
                ifd_mutex_unlock(&g->qmu);
                return -1;
            }
            g->pos[g->npos++] = e;
        }
        *e = key;
        e->seq = -1;
        if (tsearch(e, &g->pos_index, pos_cmp) == NULL) {
            e->name[0] = '\0'; /* an entry no name finds; recycled later */
            ifd_mutex_unlock(&g->qmu);
            return -1;
        }
    }
    if (*seq > g->pos[i]->seq)
        g->pos[i]->seq = *seq;
    *seq = g->pos[i]->seq;
    ifd_mutex_unlock(&g->qmu);
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
    tdestroy(g->pos_index, no_free);
    for (int i = 0; i < g->npos; i++)
        free(g->pos[i]);
    free(g->pos);
    g->by_rid = g->pos_index = NULL;
    g->pos = NULL;
}

/* Whether p's connection still exists: a CREDIT of 0 (a no-op every client ignores) is sent to
 * it; libzmq's ROUTER (ZMQ_ROUTER_MANDATORY) refuses a connection that is closed or whose
 * heartbeats went unanswered. */
static int probe_alive(ifd_ingest *g, producer *p)
{
    if (p->rid_len == 0 || p->gone)
        return 0;
    uint8_t hdr[IFD_PROTO_CREDIT_HDR];
    producer_rid r = ingest_rid_of(p);
    ingest_send_parts(g, &r, hdr, ifd_proto_credit(hdr, 0), NULL);
    return !p->gone;
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
            if (p->in_flight == 0 && (pass == 0 ? p->ended : !probe_alive(g, p))) {
                if (pass == 1) {
                    char n[4 * IFD_PROTO_NAME_MAX + 1];
                    IFD_LOG_LIMITED(&g->lim_gone, IFD_LOG_INFO,
                                    "producer '%s' (connection gone, nothing in flight) gives "
                                    "its slot to a new producer",
                                    ifd_log_escape(p->name, n, sizeof n));
                    if (!p->counted_end)
                        g->ended_total++; /* as a timeout would: it no longer holds the input */
                }
                slot_reset(g, p);
                return p;
            }
        }
    return NULL;
}

/* ---- liveness ------------------------------------------------------------------------------- */

void ingest_note_gone(ifd_ingest *g, const producer_rid *to)
{
    producer *p = ingest_find_by_rid(g, to);
    if (p == NULL || p->gone)
        return;
    p->gone = 1;
    p->gone_ns = ifd_clock_ns();
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
    if (!p->counted_end)
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
            if (!probe_alive(g, p)) /* gone just now: give it the timeout from here */
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

/* ---- HELLO ------------------------------------------------------------------------------ */

/* A HELLO for a busy name waits (BUSY_HELLO_NS) for the old connection's route to go: 1 if it
 * was parked, 0 if it is to be answered EBUSY now (waited long enough, or no room). */
static int park_hello(ifd_ingest *g, const producer_rid *from, const zmq_msg_t *body)
{
    int64_t now = ifd_clock_ns();
    int64_t since = g->hello_since_ns ? g->hello_since_ns : now;
    if (now - since >= BUSY_HELLO_NS || g->nbusy >= BUSY_HELLO_MAX)
        return 0;
    for (int i = 0; i < BUSY_HELLO_MAX; i++) {
        busy_hello *b = &g->busy[i];
        if (b->used)
            continue;
        zmq_msg_init(&b->body);
        if (zmq_msg_copy(&b->body, (zmq_msg_t *)body) != 0) { /* keeps the CURVE User-Id */
            zmq_msg_close(&b->body);
            return 0;
        }
        memcpy(b->rid, from->rid, from->len);
        b->rid_len = from->len;
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
        busy_free(g, b);
        ingest_handle_hello(g, &from, &body);
        g->hello_since_ns = 0;
        zmq_msg_close(&body);
    }
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
                 ingest_dims_format(g->in[i]->rank, g->in[i]->dims, shape, sizeof shape));
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
                                 in->name, ingest_dims_format(in->rank, in->dims, a, sizeof a),
                                 ingest_dims_format(rank, dims, b, sizeof b));
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
        if (p->used && p->welcomed && !p->ended)
            return;
    }
    if (g->cfg->expect_producers > 0 && g->ended_total < g->cfg->expect_producers)
        return;
    ingest_close_input(g, "every producer sent END or timed out");
}

void ingest_handle_hello(ifd_ingest *g, const producer_rid *from, const zmq_msg_t *body)
{
    if (zmq_msg_size((zmq_msg_t *)body) > IFD_PROTO_HELLO_JSON_MAX) {
        ingest_send_error(g, from, IFD_EPROTO, NO_SEQ, 0,
                          "HELLO: JSON: expected at most %d bytes, got %zu",
                          IFD_PROTO_HELLO_JSON_MAX, zmq_msg_size((zmq_msg_t *)body));
        return;
    }
    json_error_t je;
    json_t *j = json_loadb(zmq_msg_data((zmq_msg_t *)body), zmq_msg_size((zmq_msg_t *)body),
                           JSON_REJECT_DUPLICATES, &je);
    if (j == NULL) {
        ingest_send_error(g, from, IFD_EPROTO, NO_SEQ, 0, "HELLO: JSON: line %d, column %d: %s",
                          je.line, je.column, je.text);
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

    producer *p = ingest_find_by_rid(g, from);
    /* CURVE: the connection's key (the ZAP handler's User-Id) must be allowed the name */
    const ifd_security *sec = g->cfg->security;
    const char *uid = sec ? zmq_msg_gets((zmq_msg_t *)body, "User-Id") : NULL;
    char why[IFD_ERROR_MSG_MAX];
    if (sec && (name || !p) && !ifd_security_name_allowed(sec, uid, name, why, sizeof why)) {
        ifd_error_set(&e, IFD_EPERM, "%s", why);
        goto reply;
    }
    char anon[32];
    if (name == NULL) {
        if (p) {
            name = p->name;
        } else {
            do /* not a name a producer chose itself, nor one bound to a key: that would take
                  over its stream */
                snprintf(anon, sizeof anon, "producer-%" PRId64, ++g->next_anon);
            while (ingest_find_by_name(g, anon) ||
                   !ifd_security_name_allowed(sec, uid, anon, NULL, 0));
            name = anon;
        }
    }
    producer *named = ingest_find_by_name(g, name);
    if (named && named != p && probe_alive(g, named)) {
        if (park_hello(g, from, body)) {
            json_decref(j);
            return;
        }
        /* a name is its connection's while that connection lives: no takeover */
        ifd_error_set(&e, IFD_EBUSY,
                      "HELLO: name '%s' is in use by another live connection (%s, %d batches in "
                      "flight); a name passes to a new connection only once the old one is "
                      "closed or its heartbeats time out: pick another name or wait",
                      name, named->ended ? "ended" : "streaming", named->in_flight);
        goto reply;
    }
    /* A connection that changes its name leaves its old stream, once the new one is set up
     * (a refused HELLO changes nothing). */
    producer *old = p && p != named ? p : NULL;
    p = named;
    int fresh = p == NULL;
    if (p == NULL) {
        p = ingest_new_slot(g);
        if (p == NULL && old && old->in_flight == 0) { /* the old stream's slot is the one */
            slot_reset(g, old);
            p = old;
        }
        if (p == old)
            old = NULL;
        if (p == NULL && park_hello(g, from, body)) {
            /* a slot whose connection was just closed is freed once libzmq drops its route */
            json_decref(j);
            return;
        }
        if (p == NULL) {
            ifd_error_set(&e, IFD_EINVAL,
                          "HELLO: too many producers: expected at most %d (max_producers) "
                          "connected or with batches in flight",
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
    int pos = ingest_position_index(g, p->name, &consumed);
    if (pos < 0) {
        if (fresh)
            slot_reset(g, p);
        else
            p->welcomed = 0;
        if (pos == -2)
            ifd_error_set(&e, IFD_EINVAL,
                          "HELLO: name '%s': too many producer names in this run: expected at "
                          "most %d names holding a position (4 x max_producers, at least 1024)",
                          name, g->max_pos);
        else
            ifd_error_set(&e, IFD_ENOMEM, "HELLO: no memory for producer '%s'", name);
        goto reply;
    }
    p->pos = pos;
    if (consumed > p->last_seq)
        p->last_seq = consumed;
    if (consumed > p->acked_seq)
        p->acked_seq = consumed;
    if (old) {
        if (old->in_flight == 0) {
            slot_reset(g, old);
        } else {
            old->ended = 1;
            slot_unbind(g, old);
        }
    }
    if (slot_bind(g, p, from) != IFD_OK) {
        if (fresh)
            slot_reset(g, p);
        else
            p->welcomed = 0;
        ifd_error_set(&e, IFD_ENOMEM, "HELLO: no memory for producer '%s'", name);
        goto reply;
    }
    p->welcomed = 1;
    p->ended = 0;
    p->timed_out = 0;
    p->heard_ns = ifd_clock_ns();
    p->replica = replica; /* its batches accepted before keep the replica they were for */
    p->credit = g->credit - p->in_flight;
    if (p->credit < 0)
        p->credit = 0;
    g->ever_welcomed = 1;
    /* The sequence numbers end at INT64_MAX: after a batch with that seq, no later one exists
     * (every seq is a duplicate) and next_seq stays at INT64_MAX rather than overflowing. */
    int64_t next_seq = p->last_seq < INT64_MAX ? p->last_seq + 1 : INT64_MAX;
    char n[4 * IFD_PROTO_NAME_MAX + 1];
    IFD_LOG_LIMITED(&g->lim_hello, IFD_LOG_INFO,
                    "producer '%s' connected (next seq %" PRId64 ", credit %d)",
                    ifd_log_escape(p->name, n, sizeof n), next_seq, p->credit);
    json_t *w = json_object();
    json_object_set_new(w, "protocol", json_integer(IFD_PROTO_VERSION));
    json_object_set_new(w, "name", json_string(p->name));
    json_object_set_new(w, "credit", json_integer(p->credit));
    json_object_set_new(w, "next_seq", json_integer(next_seq));
    json_object_set_new(w, "mode", json_string(ifd_mode_name(g->cfg->run.mode)));
    json_object_set_new(w, "input_mode", json_string(ifd_input_mode_name(g->cfg->run.input_mode)));
    json_object_set_new(w, "batch_size", json_integer(g->batch_rows));
    json_object_set_new(w, "global_batch_size", json_integer(g->cfg->run.batch_size));
    json_object_set_new(w, "max_steps_per_message", json_integer(g->max_steps));
    json_object_set_new(w, "replicas", json_integer(g->cfg->run.replicas));
    json_object_set_new(w, "replica", replica >= 0 ? json_integer(replica) : json_null());
    json_object_set_new(w, "program", json_string(g->program->cls->name));
    json_object_set_new(w, "settings", settings_json(&g->program->settings));
    json_object_set_new(w, "schema", schema_json(g));
    ingest_send_json(g, from, IFD_MSG_WELCOME, w);
    json_decref(j);
    ingest_count_producers(g);
    return;
reply:
    json_decref(j);
    ingest_send_error(g, from, e.code, NO_SEQ, 0, "%s", e.msg);
    ingest_count_producers(g);
    ingest_check_input_end(g); /* a renaming connection may have left only ended streams */
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
        if (!p->counted_end)
            g->ended_total++;
        p->counted_end = 1;
    }
    p->ended = 1;
    ingest_count_producers(g);
    ingest_check_input_end(g);
}
