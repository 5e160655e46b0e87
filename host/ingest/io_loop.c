#include "host/ingest/ingest_internal.h"
#include "host/endpoint.h"
#include "host/security.h"
#include "host/limits.h"

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
#include <unistd.h>
#include <zmq.h>
#include <sys/eventfd.h>

/* ---- small helpers ------------------------------------------------------------------------ */

void ifd_ingest_wake(ifd_ingest *g)
{
    uint64_t one = 1;
    ssize_t n = write(g->efd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the thread will wake */
}

const char *ingest_dims_format(int rank, const int64_t *dims, char *buf, size_t len)
{
    ifd_shape s = {.rank = rank};
    for (int i = 0; i < rank && i < IFD_MAX_RANK; i++)
        s.dims[i] = dims[i];
    return ifd_shape_format(&s, buf, len);
}

/* ---- create / destroy ------------------------------------------------------------------- */

/* The largest tensor frame of a batch, a batch's bytes (of the rows the input mode takes a
 * batch) and its tensors. */
static size_t batch_sizes(const ifd_daemon_config *c, size_t *total, int *tensors)
{
    ifd_program p;
    *total = 0;
    *tensors = 0;
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
        ++*tensors;
        if (bytes > most)
            most = bytes;
    }
    return most;
}

/* Heartbeats: a ping every HEARTBEAT_IVL_MS; a connection silent (no traffic, no pong) for the
 * timeout is closed: 10 s, or half of producer_timeout when that is shorter (at least 1 s), so
 * that a stopped producer is found gone well within its timeout. */
#define HEARTBEAT_IVL_MS 1000
static int heartbeat_timeout_ms(const ifd_daemon_config *c)
{
    double ms = 10000;
    if (c->producer_timeout > 0 && c->producer_timeout * 500 < ms)
        ms = c->producer_timeout * 500;
    return ms < 1000 ? 1000 : (int)ms;
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
    g->msg_fd = -1;
    ifd_mutex_init(&g->qmu);
    ifd_cond_init(&g->qcv);
    ifd_mutex_init(&g->omu);
    ifd_mutex_init(&g->pool_mu);
    int rc;
    g->producers = calloc((size_t)c->max_producers, sizeof *g->producers);
    g->nlanes = c->run.input_mode == IFD_INPUT_PER_CORE ? c->run.replicas : 1;
    g->lanes = calloc((size_t)g->nlanes, sizeof *g->lanes);
    if (g->producers == NULL || g->lanes == NULL) {
        rc = ifd_error_set(err, IFD_ENOMEM, "ingest: producer table");
        goto fail;
    }
    g->batch_rows = ifd_input_batch_rows(c->run.input_mode, c->run.batch_size, c->run.replicas);
    g->max_pos = 4 * c->max_producers > 1024 ? 4 * c->max_producers : 1024;
    g->lim_hello = (ifd_log_limit)IFD_LOG_LIMIT_INIT(20, 1000000000LL);
    g->lim_reject = (ifd_log_limit)IFD_LOG_LIMIT_INIT(10, 1000000000LL);
    g->lim_gone = (ifd_log_limit)IFD_LOG_LIMIT_INIT(20, 1000000000LL);
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
    /* CURVE: the ZAP handler is bound before any socket and stopped after they are closed */
    if ((rc = ifd_security_start(c->security, g->zctx, err)) != IFD_OK)
        goto fail;
    g->router = zmq_socket(g->zctx, ZMQ_ROUTER);
    size_t batch_bytes;
    int tensors;
    size_t largest = batch_sizes(c, &batch_bytes, &tensors);
    /* a message may carry max_steps_per_message steps (predict: one batch at most) */
    g->max_steps = c->run.mode == IFD_MODE_PREDICT ? 1 : c->max_steps_per_message;
    g->max_frame = ifd_router_max_frame(largest * (size_t)g->max_steps);
    g->credit = c->credit > 0 ? c->credit : ifd_proto_auto_credit(batch_bytes);
    if (g->credit < g->max_steps) /* a credit a step: a message of max_steps must fit */
        g->credit = g->max_steps;
    /* per-host-v2: a step holds one batch a replica until all are in; one producer alone must
     * be able to send them all (config validation refuses a smaller explicit credit) */
    if (c->run.input_mode == IFD_INPUT_PER_HOST_V2 && g->credit < c->run.replicas)
        g->credit = c->run.replicas;
    int conns = ifd_daemon_max_connections(c);
    /* the ingest's: its connections and the refused ones held for their answer */
    ifd_memory_terms mt = {c->max_producers,       g->credit, batch_bytes, g->max_frame, tensors,
                           conns + IFD_CONNS_HELD, conns,     conns};
    if ((rc = ifd_monitor_create(&g->monitor, conns, ifd_memory_bound(&mt), err)))
        goto fail;
    if (c->shm)
        IFD_LOG_INFO("shared-memory pools (--shm on): at most %zu MiB besides the heap "
                     "(docs/protocol.md)",
                     (ifd_shm_bound(&mt, g->max_steps) + (1u << 20) - 1) >> 20);
    int64_t maxmsg = (int64_t)g->max_frame;
    int linger = 1000, rcvhwm = IFD_ROUTER_RCVHWM, sndhwm = ifd_router_sndhwm(g->credit),
        hs = IFD_HANDSHAKE_IVL_MS;
    zmq_setsockopt(g->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(g->router, ZMQ_LINGER, &linger, sizeof linger);
    /* Liveness: a send to a closed connection fails (EHOSTUNREACH) instead of vanishing, and
     * ZMTP heartbeats close a connection whose peer stopped answering (a SIGSTOPped or
     * unplugged producer), so its producer is found gone (host/producers.c). */
    int mandatory = 1, hb_ivl = HEARTBEAT_IVL_MS, hb_timeout = heartbeat_timeout_ms(c);
    zmq_setsockopt(g->router, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
    zmq_setsockopt(g->router, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
    zmq_setsockopt(g->router, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
    zmq_setsockopt(g->router, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
    zmq_setsockopt(g->router, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
    zmq_setsockopt(g->router, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
    /* A connection over the limit takes the place of one without a producer for as long as a
     * handshake may take; else it is told why in an ERROR (host/conns.h). */
    ifd_conns_rules in_rules = {.max = conns,
                                .idle_ns = IFD_HANDSHAKE_IVL_MS * 1000000LL,
                                .idle = "no producer on it",
                                .hold = 1};
    if ((rc = ifd_security_apply(c->security, g->router, IFD_SOCK_INGEST, err)) != IFD_OK ||
        (rc =
             ifd_conns_create(&g->conns, g->monitor, g->zctx, g->router, "ingest", &in_rules, err)))
        goto fail;
    if ((rc = ifd_endpoint_bind(g->router, "listen", c->listen, 0, g->bound_listen,
                                sizeof g->bound_listen, err)) != IFD_OK)
        goto fail;
    if (c->publish && c->publish[0] &&
        (rc = ifd_publisher_create(&g->pub, g->zctx, c->publish, c->security, g->monitor, conns,
                                   err)))
        goto fail;
    if (c->control && c->control[0]) {
        g->rep = zmq_socket(g->zctx, ZMQ_REP);
        int zero = 0, hwm = IFD_CONTROL_HWM;
        int64_t maxreq = IFD_CONTROL_MAXMSGSIZE; /* a request is one small JSON object */
        zmq_setsockopt(g->rep, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(g->rep, ZMQ_MAXMSGSIZE, &maxreq, sizeof maxreq);
        zmq_setsockopt(g->rep, ZMQ_RCVHWM, &hwm, sizeof hwm);
        zmq_setsockopt(g->rep, ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_setsockopt(g->rep, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
        /* control always answers: a new connection takes the place of the oldest */
        ifd_conns_rules ctl_rules = {.max = conns, .idle_ns = 0, .idle = "the oldest"};
        if ((rc = ifd_security_apply(c->security, g->rep, IFD_SOCK_CONTROL, err)) != IFD_OK ||
            (rc = ifd_conns_create(&g->ctl_conns, g->monitor, g->zctx, g->rep, "control",
                                   &ctl_rules, err)))
            goto fail;
        if ((rc = ifd_endpoint_bind(g->rep, "control", c->control, c->control == c->default_control,
                                    g->bound_control, sizeof g->bound_control, err)) != IFD_OK)
            goto fail;
    }
    if ((rc = ifd_monitor_start(g->monitor, err)))
        goto fail;
    *out = g;
    return IFD_OK;
fail:
    ifd_ingest_destroy(g);
    return rc;
}

void ifd_ingest_release_session(ifd_ingest *g)
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
    ingest_shm_release_session(g);
}

void ifd_ingest_destroy(ifd_ingest *g)
{
    if (g == NULL)
        return;
    ifd_ingest_release_session(g);
    /* Batches never taken by the run: release them (no ACK is sent any more). */
    for (int i = 0; g->lanes && i < g->nlanes; i++)
        for (host_batch *hb = g->lanes[i].head; hb; hb = hb->qnext)
            ingest_host_batch_free_frames(hb);
    free(g->lanes);
    for (int i = 0; g->producers && i < g->cfg->max_producers; i++) {
        host_batch *hb = g->producers[i].head;
        while (hb) {
            host_batch *next = hb->pnext;
            ingest_host_batch_free(hb);
            hb = next;
        }
        ingest_shm_drop(g, &g->producers[i]); /* the pools producers still hold */
    }
    free(g->producers);
    ingest_producers_free(g);
    ingest_replies_free(g);
    ingest_ended_conns_free(g);
    /* libzmq waits on a monitor event nobody reads: stop the monitoring first */
    ifd_conns_destroy(g->conns);
    ifd_conns_destroy(g->ctl_conns);
    ifd_publisher_destroy(g->pub);
    ifd_monitor_destroy(g->monitor);
    if (g->router)
        zmq_close(g->router);
    if (g->rep)
        zmq_close(g->rep);
    /* CURVE: the ZAP handler goes after the sockets it answers for, before the context */
    ifd_security_stop(g->cfg->security);
    if (g->zctx)
        zmq_ctx_term(g->zctx);
    if (g->efd >= 0)
        close(g->efd);
    ifd_mutex_fini(&g->omu);
    ifd_mutex_fini(&g->pool_mu);
    ifd_cond_fini(&g->qcv);
    ifd_mutex_fini(&g->qmu);
    free(g);
}

/* ---- the I/O thread --------------------------------------------------------------------- */

/* Whether a message from a connection that is no producer's is handled: one over
 * --max-connections is answered why, once, and closed (host/conns.h), and one being closed is
 * ignored. */
static int admitted(ifd_ingest *g, const producer_rid *from)
{
    int v = ifd_conns_verdict(g->conns, g->msg_fd);
    if (v == IFD_CONN_REFUSED)
        ingest_send_error(g, from, IFD_EBUSY, NO_SEQ, 0,
                          "connection refused: the daemon is at its limit of %d connections "
                          "(--max-connections), every one with a producer or new; this "
                          "connection is closed: try again later",
                          ifd_daemon_max_connections(g->cfg));
    return v == IFD_CONN_ADMITTED;
}

#define HOARDERS_EVERY_NS 200000000LL /* the heap check's period (host/monitor.c) */
#define HOARDER_MIN_NS 100000000LL    /* a connection this young is spared (its HELLO comes) */
void ingest_close_hoarders(ifd_ingest *g)
{
    if (!ifd_monitor_heap_over(g->monitor))
        return;
    int64_t now = ifd_clock_ns();
    if (now - g->hoarders_ns < HOARDERS_EVERY_NS)
        return;
    g->hoarders_ns = now;
    ifd_conns_close_idle(g->conns, HOARDER_MIN_NS,
                         "the heap is above its bound and they have no producer (libzmq keeps "
                         "the frames of an unfinished message without limit)");
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
    if (total < 2) {
        ingest_send_error(g, &from, IFD_EPROTO, NO_SEQ, 0,
                          "message: expected a header frame, got none");
        return;
    }
    g->msg_fd = known ? known->fd : zmq_msg_get(&parts[1], ZMQ_SRCFD);
    if (known == NULL && !admitted(g, &from))
        return;
    ifd_proto_header_info h;
    char why[200];
    if (ifd_proto_parse_header(zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), &h, why,
                               sizeof why)) {
        ingest_send_error(g, &from, IFD_EPROTO, NO_SEQ, 0, "%s", why);
        return;
    }
    switch (h.type) {
    case IFD_MSG_HELLO:
        if (total != 3) {
            ingest_send_error(g, &from, IFD_EPROTO, NO_SEQ, 0,
                              "HELLO: expected 2 frames (header, JSON), got %d", total - 1);
            return;
        }
        ingest_handle_hello(g, &from, &parts[2]);
        return;
    case IFD_MSG_BATCH:
    case IFD_MSG_BATCH_SHM:
        ingest_handle_batch(g, &from, parts, total, h.type == IFD_MSG_BATCH_SHM);
        return;
    case IFD_MSG_END:
        if (total != 2) {
            ingest_send_error(g, &from, IFD_EPROTO, NO_SEQ, 0,
                              "END: expected 1 frame (header), got %d", total - 1);
            return;
        }
        ingest_handle_end(g, &from);
        return;
    default:
        ingest_send_error(
            g, &from, IFD_EPROTO, NO_SEQ, 0,
            "header: type: expected HELLO (1), BATCH (3), END (6) or BATCH_SHM (10) from a "
            "producer, got %u",
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
 * socket has been quiet for DRAIN_QUIET_NS and every kept reply is sent (or its connection
 * gone), for at most DRAIN_MAX_NS. Closing a TCP socket with unread data makes the kernel answer
 * with a reset, and a reset can destroy the last ACKs and the BYE before the producer has read
 * them (seen under load: a producer waiting for a BYE that the daemon had sent).
 */
#define DRAIN_QUIET_NS 50000000LL
#define DRAIN_MAX_NS 2000000000LL
static void drain_router(ifd_ingest *g)
{
    int64_t start = ifd_clock_ns(), quiet_since = start;
    zmq_msg_t parts[MAX_PARTS + 1];
    while (ifd_clock_ns() - start < DRAIN_MAX_NS &&
           (ifd_clock_ns() - quiet_since < DRAIN_QUIET_NS || ingest_replies_waiting(g))) {
        ingest_replies_flush(g);
        zmq_pollitem_t it = {.socket = g->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, ingest_replies_waiting(g) ? 2 : 10) <= 0)
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
    ingest_send_acks(g);
    json_t *bye = json_object();
    json_object_set_new(bye, "status", json_string(g->fin_code ? "error" : "ok"));
    json_object_set_new(bye, "reason", json_string(g->fin_reason));
    json_object_set_new(bye, "global_step", json_integer(ifd_session_global_step(g->session)));
    if (g->fin_message[0])
        json_object_set_new(bye, "message", json_string(g->fin_message));
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        if (!p->used || !p->welcomed || p->rid_len == 0)
            continue;
        json_t *b = json_copy(bye);
        json_object_set_new(b, "acked_seq", json_integer(p->acked_seq));
        producer_rid r = ingest_rid_of(p);
        ingest_send_json(g, &r, IFD_MSG_BYE, b, 1);
        IFD_LOG_DEBUG("BYE to producer '%s' (acked up to %" PRId64 ")", p->name, p->acked_seq);
    }
    ingest_bye_ended_conns(g, bye);
    json_decref(bye);
    drain_router(g);
}

#define CONNS_EVERY_NS 10000000LL
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
    /* The connection events are read every CONNS_EVERY_NS (and at least every poll timeout),
     * and before a message from a connection not yet known (host/conns.h): polling their
     * sockets too would cost each pass a system call or two. */
    int64_t conns_ns = 0;
    zmq_msg_t parts[MAX_PARTS + 1];
    for (;;) {
        int rc = zmq_poll(items, n, g->nbusy || ingest_replies_waiting(g) ? 5 : 100);
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
                ingest_handle_message(g, parts, np, total);
                for (int q = 0; q < np; q++)
                    zmq_msg_close(&parts[q]);
            }
            ingest_src_flush(g);
        }
        if (i_rep >= 0 && rc > 0 && (items[i_rep].revents & ZMQ_POLLIN))
            ingest_handle_control(g);
        if (ifd_clock_ns() - conns_ns >= CONNS_EVERY_NS) {
            ifd_conns_update(g->conns);
            ifd_conns_update(g->ctl_conns);
            conns_ns = ifd_clock_ns();
        }
        ingest_close_hoarders(g);
        ingest_replies_flush(g);
        ingest_send_acks(g);
        ingest_sample_rates(g);
        ingest_watch_infeed(g);
        ingest_check_liveness(g);
        ingest_retry_busy_hellos(g);

        int sigs = g->signals ? __atomic_load_n(g->signals, __ATOMIC_RELAXED) : 0;
        if (sigs > g->handled_signals) {
            if (g->handled_signals == 0)
                ingest_request_stop(g, "signal");
            if (sigs >= 2) {
                IFD_LOG_WARN("second signal: aborting the run");
                ifd_session_abort(g->session, "aborted by a second signal");
                ingest_close_input(g, "aborted");
            }
            g->handled_signals = sigs;
        }
        int asker;
        if (g->stop_ns == 0 && ifd_session_stop_requested(g->session, &asker)) {
            /* another host was asked (the session's stop relay): the same grace as here */
            char why[64];
            snprintf(why, sizeof why, "stop requested on host %d", asker);
            ingest_request_stop(g, why);
        }
        if (g->stop_ns && !g->input_closed && ifd_clock_ns() - g->stop_ns > STOP_GRACE_NS)
            ingest_close_input(g, "stopping, and the current loop still waits for input");

        ifd_mutex_lock(&g->omu);
        int fin = g->finishing;
        ifd_mutex_unlock(&g->omu);
        if (fin) {
            finish(g);
            return NULL;
        }
    }
}

ifd_sink *ifd_ingest_pub_sink(ifd_ingest *g)
{
    return ifd_publisher_sink(g->pub);
}

int ifd_ingest_restore(ifd_ingest *g, const ifd_checkpoint *c, ifd_error *err)
{
    for (int i = 0; i < ifd_checkpoint_producer_count(c); i++) {
        const char *name = ifd_checkpoint_producer_name(c, i);
        int64_t seq = ifd_checkpoint_producer_seq(c, i);
        if (strlen(name) > IFD_PROTO_NAME_MAX)
            return ifd_error_set(err, IFD_EINVAL, "checkpoint: producer '%s': name too long", name);
        int pos = ingest_position_index(g, name, NULL, &seq);
        if (pos < 0)
            return ifd_error_set(err, IFD_ENOMEM, "checkpoint: producer '%s'", name);
        /* Known, not connected: a HELLO under this name is told next_seq = seq + 1. An ended
         * slot may be reused for another name (the position table still knows this one). */
        producer *p = ingest_find_by_name(g, name);
        if (p == NULL && (p = ingest_new_slot(g)) != NULL) {
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
        if (g->pos[i]->seq >= 0)
            rc = ifd_checkpoint_set_producer(c, g->pos[i]->name, g->pos[i]->seq, err);
    ifd_mutex_unlock(&g->qmu);
    return rc;
}

void ingest_attach_program(ifd_ingest *g, const ifd_program *program)
{
    g->program = program;
    int idx[IFD_MAX_INPUTS];
    g->nin = ifd_infeed_mode_inputs(g->program, g->cfg->run.mode, idx);
    for (int i = 0; i < g->nin; i++)
        g->in[i] = &g->program->inputs[idx[i]];
}

int ifd_ingest_start(ifd_ingest *g, ifd_session *s, ifd_error *err)
{
    g->session = s;
    g->first_step = ifd_session_global_step(s);
    ingest_attach_program(g, ifd_session_program(s));
    ifd_session_set_watchdog_context(s, ingest_watchdog_context, g);
    int rc = ifd_thread_start(&g->thread, "ifd-ingest", io_main, g);
    if (rc)
        return ifd_error_set(err, rc, "ingest: cannot start the I/O thread");
    g->started = 1;
    if (g->pub && (rc = ifd_publisher_start(g->pub, err)) != IFD_OK)
        return rc;
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
    ingest_shm_release_session(g);
    ifd_publisher_stop(g->pub); /* after the queued summaries */
}
