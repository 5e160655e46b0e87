#include "host/ingest/ingest_internal.h"
#include "host/limits.h"
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
        g->msg_fd = zmq_msg_get(&body, ZMQ_SRCFD);
        busy_free(g, b);
        ingest_handle_hello(g, &from, &body);
        g->hello_since_ns = 0;
        zmq_msg_close(&body);
    }
}

/* Checks the HELLO's schema against the program; the code and sentence of the first
 * difference. No schema (no key, or null) is the program's own: the producer reads it from
 * WELCOME and converts its batches to it. */
static int check_schema(ifd_ingest *g, json_t *schema, ifd_error *err)
{
    const ifd_program *p = g->program;
    if (schema == NULL || json_is_null(schema))
        return IFD_OK;
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

/* Every name with a batch keeps a place in the position table for the rest of the run (its
 * checkpoint position), so new names are rationed: IFD_NAMES_PER_CONN a connection, and with
 * CURVE max_producers a key (names bound to a key in authorized_keys are its own list). Whether
 * name, new in this run, may be started; else the sentence in e. */
static int name_quota_allows(ifd_ingest *g, const char *uid, const char *name, ifd_error *e)
{
    int started = ifd_conns_count(g->conns, g->msg_fd, 0);
    if (started >= IFD_NAMES_PER_CONN) {
        ifd_error_set(e, IFD_EINVAL,
                      "HELLO: name '%s' is new, and this connection has started %d producer "
                      "names already: expected at most %d a connection (every name that sends a "
                      "batch keeps a place in the position table for the rest of the run)",
                      name, started, IFD_NAMES_PER_CONN);
        return 0;
    }
    int held =
        uid && ifd_security_key_names(g->cfg->security, uid) == 0 ? ingest_key_names(g, uid) : 0;
    if (held >= g->cfg->max_producers) {
        ifd_error_set(e, IFD_EPERM,
                      "HELLO: name '%s' is new, and key %.8s... holds %d producer names already: "
                      "expected at most %d a key (max_producers; every name that sends a batch "
                      "keeps a place in the position table for the rest of the run)",
                      name, uid, held, g->cfg->max_producers);
        return 0;
    }
    return 1;
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
    int want_shm = 0;
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
        } else if (strcmp(key, "shm") == 0) {
            if (!json_is_boolean(v)) {
                ifd_error_set(&e, IFD_EINVAL, "HELLO: shm: expected true or false, got %s",
                              ifd_json_describe(v, got, sizeof got));
                goto reply;
            }
            want_shm = json_is_true(v);
        } else if (strcmp(key, "schema") != 0) {
            ifd_error_set(&e, IFD_EINVAL,
                          "HELLO: unknown key '%s' (expected name, schema, first_seq, replica, "
                          "shm)",
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
    if (named && named != p && ingest_probe_alive(g, named)) {
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
    /* A producer whose earlier pools are still held by their steps in flight waits for them
     * (as a HELLO for a busy name does) before it is welcomed without a new one. */
    if (want_shm && named && ingest_shm_must_wait(g, named, body) && park_hello(g, from, body)) {
        json_decref(j);
        return;
    }
    int new_name = named == NULL && !ingest_position_known(g, name);
    if (new_name && !name_quota_allows(g, uid, name, &e))
        goto reply;
    producer *old = p && p != named ? p : NULL;
    p = named;
    int fresh = p == NULL;
    if (p == NULL) {
        p = ingest_new_slot(g);
        if (p == NULL && old && old->in_flight == 0) { /* the old stream's slot is the one */
            ingest_slot_reset(g, old);
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
    int pos = ingest_position_index(g, p->name, uid, &consumed);
    if (pos < 0) {
        if (fresh)
            ingest_slot_reset(g, p);
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
    if (new_name)
        ifd_conns_count(g->conns, g->msg_fd, 1);
    if (consumed > p->last_seq)
        p->last_seq = consumed;
    if (consumed > p->acked_seq)
        p->acked_seq = consumed;
    if (old) {
        if (old->in_flight == 0) {
            ingest_slot_reset(g, old);
        } else {
            old->ended = 1;
            ingest_slot_unbind(g, old);
            ingest_shm_drop(g, old); /* its steps in flight keep the pool until consumed */
        }
    }
    if (ingest_slot_bind(g, p, from) != IFD_OK) {
        if (fresh)
            ingest_slot_reset(g, p);
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
    /* a new HELLO brings a new pool (or none): steps in flight keep the old one alive */
    ingest_shm_drop(g, p);
    char refused[IFD_ERROR_MSG_MAX] = "";
    if (want_shm)
        p->pool = ingest_shm_create(g, p, body, refused, sizeof refused);
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
    json_object_set_new(w, "expect_producers", json_integer(g->cfg->expect_producers));
    json_object_set_new(w, "replica", replica >= 0 ? json_integer(replica) : json_null());
    json_object_set_new(w, "program", json_string(g->program->cls->name));
    json_object_set_new(w, "settings", settings_json(&g->program->settings));
    json_object_set_new(w, "schema", schema_json(g));
    json_object_set_new(w, "shm", p->pool ? ingest_shm_json(p->pool) : json_null());
    if (want_shm && p->pool == NULL) {
        json_object_set_new(w, "shm_refused", json_string(refused));
        IFD_LOG_LIMITED(&g->lim_hello, IFD_LOG_INFO,
                        "producer '%s' asked for shared memory and got none: %s",
                        ifd_log_escape(p->name, n, sizeof n), refused);
    }
    ingest_send_json(g, from, IFD_MSG_WELCOME, w, 1);
    json_decref(j);
    ingest_count_producers(g);
    return;
reply:
    json_decref(j);
    ingest_send_error(g, from, e.code, NO_SEQ, 0, "%s", e.msg);
    ingest_count_producers(g);
    ingest_check_input_end(g); /* a renaming connection may have left only ended streams */
}
