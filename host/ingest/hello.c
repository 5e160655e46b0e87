/*
 * HELLO (docs/protocol.md): a parsed HELLO (host/ingest/protocol.h) meets the producer table:
 * the name's owner, its slot, its position, its credit and pool, and the WELCOME. A HELLO that
 * must wait for a connection to go is handed back to its transport (park). I/O thread only.
 */
#include "host/ingest/ingest_internal.h"
#include "host/limits.h"
#include "host/security.h"

#include "core/log.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HELLO_PARKED (-1) /* welcome(): the transport keeps the HELLO to handle it again */

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

/* Every name with a batch keeps a place in the position table for the rest of the run (its
 * checkpoint position), so new names are rationed: IFD_NAMES_PER_CONN a connection, and with
 * CURVE max_producers a key (names bound to a key in authorized_keys are its own list). Whether
 * name, new in this run, may be started; else the sentence in e. */
static int name_quota_allows(ifd_ingest *g, const char *uid, const char *name, ifd_error *e)
{
    int started = ifd_conns_count(g->sock.conns, g->sock.msg_fd, 0);
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

/* The name a HELLO without one gets: its connection's producer's, or a new producer-N (not a name
 * a producer chose itself, nor one bound to a key: that would take over its stream). */
static const char *default_name(ifd_ingest *g, const producer *p, const char *uid, char *anon,
                                size_t len)
{
    if (p)
        return p->name;
    do
        snprintf(anon, len, "producer-%" PRId64, ++g->next_anon);
    while (ingest_find_by_name(g, anon) ||
           !ifd_security_name_allowed(g->cfg->security, uid, anon, NULL, 0));
    return anon;
}

/* A fresh slot for name, from first_seq (*old: the connection's producer under its former name,
 * whose slot may be the one). NULL with e set, or NULL and *parked when it waits for a slot. */
static producer *fresh_slot(ifd_ingest *g, ingest_hello_msg *m, producer **old, const char *name,
                            int64_t first_seq, int *parked, ifd_error *e)
{
    producer *p = ingest_new_slot(g);
    if (p == NULL && *old && (*old)->in_flight == 0) { /* the old stream's slot is the one */
        ingest_slot_reset(g, *old);
        p = *old;
    }
    if (p == *old)
        *old = NULL;
    if (p == NULL && m->park(m)) {
        /* a slot whose connection was just closed is freed once libzmq drops its route */
        *parked = 1;
        return NULL;
    }
    if (p == NULL) {
        ifd_error_set(e, IFD_EINVAL,
                      "HELLO: too many producers: expected at most %d (max_producers) "
                      "connected or with batches in flight",
                      g->cfg->max_producers);
        return NULL;
    }
    p->used = 1;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->last_seq = first_seq - 1;
    p->acked_seq = -1;
    return p;
}

/* A name whose slot was reused, or that a resumed checkpoint knows: its stream goes on after
 * what was consumed. (A known name has its entry: only a fresh one can fail.) */
static int take_position(ifd_ingest *g, producer *p, int fresh, const char *uid, ifd_error *e)
{
    int64_t consumed = -1;
    int pos = ingest_position_index(g, p->name, uid, &consumed);
    if (pos < 0) {
        if (fresh)
            ingest_slot_reset(g, p);
        else
            p->welcomed = 0;
        if (pos == -2)
            return ifd_error_set(e, IFD_EINVAL,
                                 "HELLO: name '%s': too many producer names in this run: expected "
                                 "at most %d names holding a position (4 x max_producers, at "
                                 "least 1024)",
                                 p->name, g->fifo.max_pos);
        return ifd_error_set(e, IFD_ENOMEM, "HELLO: no memory for producer '%s'", p->name);
    }
    p->pos = pos;
    if (consumed > p->last_seq)
        p->last_seq = consumed;
    if (consumed > p->acked_seq)
        p->acked_seq = consumed;
    return IFD_OK;
}

/* WELCOME, with p's state and the run's. */
static void send_welcome(ifd_ingest *g, const producer_rid *from, const producer *p,
                         const ingest_hello *h, const char *refused)
{
    const ifd_config *run = &g->cfg->run;
    int64_t next_seq = ingest_next_seq(p->last_seq);
    char n[4 * IFD_PROTO_NAME_MAX + 1];
    IFD_LOG_LIMITED(&g->lim_hello, IFD_LOG_INFO,
                    "producer '%s' connected (next seq %" PRId64 ", credit %d)",
                    ifd_log_escape(p->name, n, sizeof n), next_seq, p->credit);
    json_t *w = json_object();
    json_object_set_new(w, "protocol", json_integer(IFD_PROTOCOL_VERSION));
    json_object_set_new(w, "name", json_string(p->name));
    json_object_set_new(w, "credit", json_integer(p->credit));
    json_object_set_new(w, "next_seq", json_integer(next_seq));
    json_object_set_new(w, "mode", json_string(ifd_mode_name(run->mode)));
    json_object_set_new(w, "input_mode", json_string(ifd_input_mode_name(run->input_mode)));
    json_object_set_new(w, "batch_size", json_integer(g->pr.batch_rows));
    json_object_set_new(w, "global_batch_size", json_integer(run->batch_size));
    json_object_set_new(w, "max_steps_per_message", json_integer(g->pr.max_steps));
    json_object_set_new(w, "replicas", json_integer(run->replicas));
    json_object_set_new(w, "expect_producers", json_integer(g->cfg->expect_producers));
    json_object_set_new(w, "replica", h->replica >= 0 ? json_integer(h->replica) : json_null());
    json_object_set_new(w, "role", json_string(p->eval ? "eval" : "train"));
    json_object_set_new(w, "program", json_string(g->pr.program->cls->name));
    json_object_set_new(w, "settings", settings_json(&g->pr.program->settings));
    json_object_set_new(w, "schema", ingest_schema_json(&g->pr));
    json_object_set_new(w, "shm", p->pool ? ingest_shm_json(p->pool) : json_null());
    if (h->want_shm && p->pool == NULL) {
        json_object_set_new(w, "shm_refused", json_string(refused));
        IFD_LOG_LIMITED(&g->lim_hello, IFD_LOG_INFO,
                        "producer '%s' asked for shared memory and got none: %s",
                        ifd_log_escape(p->name, n, sizeof n), refused);
    }
    ingest_send_json(g, from, IFD_MSG_WELCOME, w, 1);
}

/* p is bound to `from` and welcomed (its old stream, if the connection renamed, left). */
static int bind_welcomed(ifd_ingest *g, const producer_rid *from, ingest_hello_msg *m, producer *p,
                         producer *old, int fresh, const ingest_hello *h, ifd_error *e)
{
    if (old) {
        if (old->in_flight == 0) {
            ingest_slot_reset(g, old);
        } else {
            old->ended = 1;
            ingest_slot_unbind(g, old);
            ingest_shm_drop(g, old); /* its steps in flight keep the pool until consumed */
        }
    }
    int rc = IFD_OK;
    /* an eval producer joins the eval set once, until its END there */
    if (h->eval && !p->eval_open && (rc = ifd_eval_set_join(g->eval, p->name, e)) == IFD_OK)
        p->eval_open = 1;
    if (rc == IFD_OK && ingest_slot_bind(g, p, from) != IFD_OK)
        rc = ifd_error_set(e, IFD_ENOMEM, "HELLO: no memory for producer '%s'", p->name);
    if (rc) {
        if (fresh)
            ingest_slot_reset(g, p);
        else
            p->welcomed = 0;
        return rc;
    }
    p->welcomed = 1;
    p->ended = 0;
    p->timed_out = 0;
    p->heard_ns = ifd_clock_ns();
    p->replica = h->replica; /* its batches accepted before keep the replica they were for */
    p->eval = h->eval;
    p->credit = g->pr.credit - p->in_flight;
    if (p->credit < 0)
        p->credit = 0;
    if (!p->eval)
        g->ever_welcomed = 1; /* the input's end is the train producers' */
    /* a new HELLO brings a new pool (or none): steps in flight keep the old one alive */
    ingest_shm_drop(g, p);
    char refused[IFD_ERROR_MSG_MAX] = "";
    if (h->want_shm)
        p->pool = ingest_shm_create(g, p, m, refused, sizeof refused);
    send_welcome(g, from, p, h, refused);
    return IFD_OK;
}

/* The name's owner: the connection's key must be allowed it (CURVE), a live other connection
 * keeps it (the HELLO waits, then EBUSY), and a producer whose old pools are still held waits
 * for them. IFD_OK with *named (NULL: nobody has it), HELLO_PARKED, or the error. */
static int check_owner(ifd_ingest *g, ingest_hello_msg *m, const producer *p, const char *name,
                       const ingest_hello *h, producer **named, ifd_error *e)
{
    *named = ingest_find_by_name(g, name);
    producer *o = *named;
    if (o && o != p && ingest_probe_alive(g, o)) {
        if (m->park(m))
            return HELLO_PARKED;
        /* a name is its connection's while that connection lives: no takeover */
        return ifd_error_set(e, IFD_EBUSY,
                             "HELLO: name '%s' is in use by another live connection (%s, %d "
                             "batches in flight); a name passes to a new connection only once the "
                             "old one is closed or its heartbeats time out: pick another name or "
                             "wait",
                             name, o->ended ? "ended" : "streaming", o->in_flight);
    }
    /* A producer whose earlier pools are still held by their steps in flight waits for them
     * (as a HELLO for a busy name does) before it is welcomed without a new one. */
    if (h->want_shm && o && ingest_shm_must_wait(g, o, m) && m->park(m))
        return HELLO_PARKED;
    return IFD_OK;
}

/* Welcomes the HELLO h from `from`: IFD_OK, HELLO_PARKED, or the error's code with e set. */
static int welcome(ifd_ingest *g, const producer_rid *from, ingest_hello_msg *m,
                   const ingest_hello *h, ifd_error *e)
{
    producer *p = ingest_find_by_rid(g, from);
    /* CURVE: the connection's key (the ZAP handler's User-Id) must be allowed the name */
    const ifd_security *sec = g->cfg->security;
    const char *uid = sec ? m->user_id : NULL;
    char why[IFD_ERROR_MSG_MAX], anon[32];
    if (sec && (h->name || !p) && !ifd_security_name_allowed(sec, uid, h->name, why, sizeof why))
        return ifd_error_set(e, IFD_EPERM, "%s", why);
    const char *name = h->name ? h->name : default_name(g, p, uid, anon, sizeof anon);
    producer *named;
    int rc = check_owner(g, m, p, name, h, &named, e);
    if (rc)
        return rc;
    int new_name = named == NULL && !ingest_position_known(g, name);
    if (new_name && !name_quota_allows(g, uid, name, e))
        return e->code;
    /* A connection that changes its name leaves its old stream, once the new one is set up (a
     * refused HELLO changes nothing). */
    producer *old = p && p != named ? p : NULL;
    int fresh = named == NULL, parked = 0;
    p = named;
    if (p == NULL && (p = fresh_slot(g, m, &old, name, h->first_seq, &parked, e)) == NULL)
        return parked ? HELLO_PARKED : e->code;
    if (!fresh && h->first_seq - 1 > p->last_seq)
        p->last_seq = h->first_seq - 1;
    if ((rc = take_position(g, p, fresh, uid, e)) != IFD_OK)
        return rc;
    if (new_name)
        ifd_conns_count(g->sock.conns, g->sock.msg_fd, 1);
    return bind_welcomed(g, from, m, p, old, fresh, h, e);
}

void ingest_handle_hello(ifd_ingest *g, const producer_rid *from, ingest_hello_msg *m)
{
    ifd_error e;
    ifd_error_clear(&e);
    json_t *j;
    ingest_hello h;
    int rc = ingest_hello_parse(&g->pr, m->json, &j, &h, &e);
    if (rc == IFD_OK && h.eval && g->eval == NULL)
        rc = ifd_error_set(&e, IFD_EINVAL,
                           "HELLO: role: \"eval\" sends the eval set of evaluation during "
                           "training, and this daemon evaluates none: expected \"train\" or no "
                           "role, or start infeedd in train mode with --eval-every N");
    if (rc == IFD_OK && g->input_closed && !h.eval)
        rc = ifd_error_set(&e, IFD_ECLOSED,
                           "HELLO: the input has ended (every producer sent END, or the run is "
                           "ending); no more producers are taken");
    if (rc == IFD_OK)
        rc = welcome(g, from, m, &h, &e);
    json_decref(j);
    if (rc == HELLO_PARKED)
        return;
    if (rc == IFD_OK) {
        ingest_count_producers(g);
        return;
    }
    ingest_send_error(g, from, e.code, NO_SEQ, 0, "%s", e.msg);
    ingest_count_producers(g);
    ingest_check_input_end(g); /* a renaming connection may have left only ended streams */
}
