#include "host/ingest/ingest_internal.h"

#include "core/log.h"
#include "core/thread.h"
#include "core/wire.h"
#include "device/cpu/blas.h"
#include <infeed/checkpoint.h>
#include "intake/inputs.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

/* Starvation warnings (a log line, not the --watchdog, which ends the run): when the infeed
 * thread has waited for input for STARVE_WARN_NS, and again every STARVE_WARN_NS while it still
 * waits, naming the replica it waits for. */
void ingest_watch_infeed(ifd_ingest *g)
{
    int replica = -1;
    int64_t since = 0, now = ifd_clock_ns();
    if (g->input_closed || !ifd_session_infeed_waiting(g->session, &replica, &since) ||
        now - since < STARVE_WARN_NS) {
        g->stats.starve_warned_ns = 0;
        return;
    }
    if (g->stats.starve_warned_ns && now - g->stats.starve_warned_ns < STARVE_WARN_NS)
        return;
    g->stats.starve_warned_ns = now;
    double secs = (double)(now - since) * 1e-9;
    if (g->fifo.nlanes > 1) {
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
void ingest_sample_rates(ifd_ingest *g)
{
    int64_t now = ifd_clock_ns(), step = ifd_session_global_step(g->session);
    if (g->stats.rate_t0 == 0) {
        g->stats.rate_t0 = now;
        g->stats.rate_step0 = step;
        return;
    }
    if (now - g->stats.rate_t0 < 1000000000LL)
        return;
    g->stats.steps_per_sec =
        (double)(step - g->stats.rate_step0) * 1e9 / (double)(now - g->stats.rate_t0);
    const ifd_config *r = &g->cfg->run;
    g->stats.examples_per_sec = g->stats.steps_per_sec * (double)g->pr.batch_rows *
                                (double)ifd_input_batches_per_step(r->input_mode, r->replicas);
    g->stats.rate_t0 = now;
    g->stats.rate_step0 = step;
}

/* status's eval_set: null without --eval-every. */
static json_t *eval_set_json(ifd_ingest *g)
{
    if (g->eval == NULL)
        return json_null();
    ifd_eval_set_state st;
    char why[IFD_ERROR_MSG_MAX];
    ifd_eval_set_get_state(g->eval, &st, why, sizeof why);
    json_t *j = json_pack("{s:I, s:I, s:I, s:i, s:i, s:b}", "batches", (json_int_t)st.batches,
                          "bytes", (json_int_t)st.bytes, "max_bytes", (json_int_t)st.max_bytes,
                          "producers", st.producers, "ended", st.ended, "complete", st.complete);
    json_object_set_new(j, "incomplete", why[0] ? json_string(why) : json_null());
    return j;
}

void ingest_request_stop(ifd_ingest *g, const char *why)
{
    if (g->stop_ns == 0) {
        IFD_LOG_INFO("%s: stopping at the end of the current loop", why);
        g->stop_ns = ifd_clock_ns();
        ifd_session_request_stop(g->session);
        ifd_eval_set_close(g->eval); /* a due eval no longer waits for its set */
    }
}

json_t *ifd_ingest_endpoints_json(const ifd_ingest *g)
{
    const char *pub = g->sock.pub ? ifd_publisher_endpoint(g->sock.pub) : "";
    const char *eps[] = {g->sock.bound_listen, pub, g->sock.bound_control};
    const char *keys[] = {"listen", "publish", "control"};
    json_t *j = json_object();
    for (int i = 0; i < 3; i++)
        json_object_set_new(j, keys[i], eps[i][0] ? json_string(eps[i]) : json_null());
    return j;
}

/* The cpu backend's BLAS (NULL on other backends). */
static json_t *blas_json(const ifd_ingest *g)
{
    if (strcmp(g->cfg->run.backend, "cpu") != 0)
        return NULL;
    ifd_blas_info b;
    char line[256];
    ifd_blas_info_get(&b);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "library", b.library, "kernel",
                     b.kernel, "picked", b.picked, "how", b.how, "cpu_isa", ifd_isa_name(b.cpu_isa),
                     "kernel_isa", ifd_isa_name(b.kernel_isa), "text",
                     ifd_blas_describe(&b, line, sizeof line));
}

/* The PUB socket's tensor messages (NULL without --publish). */
static json_t *tensor_messages_json(const ifd_ingest *g)
{
    if (g->sock.pub == NULL)
        return NULL;
    ifd_publisher_tensors t;
    ifd_publisher_tensor_stats(g->sock.pub, &t);
    return json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                     "subscribed", t.subscribed, "sent", (json_int_t)t.sent, "dropped",
                     (json_int_t)t.dropped, "limited", (json_int_t)t.limited, "sent_steps",
                     (json_int_t)t.sent_steps, "dropped_steps", (json_int_t)t.dropped_steps,
                     "limited_steps", (json_int_t)t.limited_steps, "outbox_bytes",
                     (json_int_t)t.outbox_bytes, "pending_bytes", (json_int_t)t.pending_bytes,
                     "largest", (json_int_t)t.largest, "rate", (json_int_t)t.rate, "shm_notices",
                     (json_int_t)t.shm_notices, "shm_data", (json_int_t)t.shm_data);
}

/* The batch queue's depth (batch_queue, and per replica in per-core mode). */
static void queue_json(ifd_ingest *g, json_t *j)
{
    size_t qlen = 0;
    json_t *per = g->fifo.nlanes > 1 ? json_array() : json_null();
    ifd_mutex_lock(&g->fifo.mu);
    for (int i = 0; i < g->fifo.nlanes; i++) {
        qlen += g->fifo.lanes[i].len;
        if (g->fifo.nlanes > 1)
            json_array_append_new(per, json_integer((json_int_t)g->fifo.lanes[i].len));
    }
    ifd_mutex_unlock(&g->fifo.mu);
    json_object_set_new(j, "batch_queue", json_integer((json_int_t)qlen));
    json_object_set_new(j, "batch_queue_per_replica", per);
}

/* Whether the infeed waits for input, how long and for which replica's batch. */
static void waiting_json(ifd_ingest *g, json_t *j)
{
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
                        waiting && g->fifo.nlanes > 1 && waiting_replica >= 0
                            ? json_integer(waiting_replica)
                            : json_null());
}

/* The producers, each a JSON object; *connected: those welcomed and not ended. */
static json_t *producers_json(const ifd_ingest *g, int *connected)
{
    json_t *ps = json_array();
    *connected = 0;
    for (int i = 0; i < g->cfg->max_producers; i++) {
        const producer *p = &g->producers[i];
        if (!p->used)
            continue;
        *connected += p->welcomed && !p->ended;
        json_t *pj =
            json_pack("{s:s, s:b, s:i, s:i, s:I, s:I, s:I, s:I}", "name", p->name, "ended",
                      p->ended, "credit", p->credit, "in_flight", p->in_flight, "last_seq",
                      (json_int_t)p->last_seq, "acked_seq", (json_int_t)p->acked_seq, "accepted",
                      (json_int_t)p->accepted, "rejected", (json_int_t)p->rejected);
        json_object_set_new(pj, "replica",
                            p->replica >= 0 ? json_integer(p->replica) : json_null());
        json_object_set_new(pj, "shm", json_boolean(p->pool != NULL));
        json_array_append_new(ps, pj);
    }
    return ps;
}

/* Each replica's rings as they are now. */
static json_t *rings_json(const ifd_ingest *g)
{
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
    return rings;
}

/* The status request's answer (docs/protocol.md, the control socket), its keys in this order. */
static json_t *status_json(ifd_ingest *g)
{
    const ifd_config *run = &g->cfg->run;
    json_t *j = json_object();
    json_object_set_new(j, "ok", json_true());
    json_object_set_new(j, "pid", json_integer(getpid()));
    json_object_set_new(j, "endpoints", ifd_ingest_endpoints_json(g));
    json_object_set_new(j, "state", json_string(g->stop_ns ? "stopping" : "running"));
    json_object_set_new(j, "mode", json_string(ifd_mode_name(run->mode)));
    json_object_set_new(j, "program", json_string(g->pr.program->cls->name));
    json_object_set_new(j, "backend", json_string(run->backend));
    json_object_set_new(j, "replicas", json_integer(run->replicas));
    json_t *blas = blas_json(g), *tm = tensor_messages_json(g);
    if (blas)
        json_object_set_new(j, "blas", blas);
    if (tm)
        json_object_set_new(j, "tensor_messages", tm);
    json_object_set_new(j, "global_step", json_integer(ifd_session_global_step(g->session)));
    json_object_set_new(j, "loop", json_integer(ifd_session_loop_index(g->session)));
    json_object_set_new(j, "last_step",
                        run->mode != IFD_MODE_TRAIN ? json_null()
                        : run->last_step > 0        ? json_integer(run->last_step)
                                             : json_integer(g->stats.first_step + run->steps));
    json_object_set_new(j, "input_mode", json_string(ifd_input_mode_name(run->input_mode)));
    queue_json(g, j);
    waiting_json(g, j);
    json_object_set_new(j, "batch_queue_limit",
                        json_integer((json_int_t)g->cfg->max_producers * g->pr.credit));
    json_object_set_new(j, "input_closed", json_boolean(g->input_closed));
    int connected;
    json_t *ps = producers_json(g, &connected);
    json_object_set_new(j, "producers_connected", json_integer(connected));
    json_object_set_new(j, "eval_set", eval_set_json(g));
    json_object_set_new(j, "producers", ps);
    json_object_set_new(j, "rings", rings_json(g));
    json_object_set_new(j, "batches_accepted", json_integer(g->stats.accepted));
    json_object_set_new(j, "batches_rejected", json_integer(g->stats.rejected));
    json_object_set_new(j, "bytes_copied_unaligned", json_integer(g->stats.copied_bytes));
    json_object_set_new(j, "steps_per_sec", json_real(g->stats.steps_per_sec));
    json_object_set_new(j, "examples_per_sec", json_real(g->stats.examples_per_sec));
    return j;
}

int ingest_control_parse(const void *data, size_t len, char *why, size_t wlen)
{
    json_t *req = json_loadb(data, len, 0, NULL);
    json_t *cmd = json_object_get(req, "cmd");
    int rc = INGEST_CONTROL_BAD;
    if (json_is_string(cmd) && strcmp(json_string_value(cmd), "status") == 0) {
        rc = INGEST_CONTROL_STATUS;
    } else if (json_is_string(cmd) && strcmp(json_string_value(cmd), "stop") == 0) {
        rc = INGEST_CONTROL_STOP;
    } else if (req == NULL) {
        snprintf(why, wlen,
                 "expected a JSON object {\"cmd\": \"status\"|\"stop\"}, got text that is not "
                 "JSON");
    } else if (!json_is_string(cmd)) {
        char got[96];
        snprintf(why, wlen, "cmd: expected \"status\" or \"stop\", got %s",
                 ifd_json_describe(cmd, got, sizeof got));
    } else {
        snprintf(why, wlen, "cmd: expected \"status\" or \"stop\", got '%.200s'",
                 json_string_value(cmd));
    }
    json_decref(req);
    return rc;
}

void ingest_handle_control(ifd_ingest *g)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, g->sock.rep, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return;
    }
    int more = zmq_msg_more(&m);
    char why[300];
    int cmd = ingest_control_parse(zmq_msg_data(&m), zmq_msg_size(&m), why, sizeof why);
    zmq_msg_close(&m);
    while (more) { /* a REP must answer the whole request; extra frames are ignored */
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, g->sock.rep, 0) < 0)
            more = 0;
        else
            more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    json_t *reply;
    if (cmd == INGEST_CONTROL_STATUS) {
        reply = status_json(g);
    } else if (cmd == INGEST_CONTROL_STOP) {
        ingest_request_stop(g, "control: stop");
        reply = json_pack("{s:b}", "ok", 1);
    } else {
        reply = json_pack("{s:b, s:s}", "ok", 0, "error", why);
    }
    char *text = json_dumps(reply, JSON_COMPACT);
    json_decref(reply);
    zmq_send(g->sock.rep, text ? text : "{}", text ? strlen(text) : 2, 0);
    free(text);
}
