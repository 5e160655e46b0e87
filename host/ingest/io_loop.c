/*
 * The ingest's I/O thread (docs/design.md, "The daemon"): it waits on the ROUTER, the control REP
 * (their ZMQ_FD, host/ingest/zmq_wait.h) and an eventfd other threads write to wake it, and runs
 * the ingest's periodic work in named phases; at the end it sends the BYEs and drains the ROUTER.
 */
#include "host/ingest/zmq_transport.h"

#include "core/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

void ifd_ingest_wake(ifd_ingest *g)
{
    uint64_t one = 1;
    ssize_t n = write(g->sock.efd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the thread will wake */
}

#define HOARDERS_EVERY_NS 200000000LL /* the heap check's period (host/monitor.c) */
#define HOARDER_MIN_NS 100000000LL    /* a connection this young is spared (its HELLO comes) */
void ingest_close_hoarders(ifd_ingest *g)
{
    if (!ifd_monitor_heap_over(g->sock.monitor))
        return;
    int64_t now = ifd_clock_ns();
    if (now - g->sock.hoarders_ns < HOARDERS_EVERY_NS)
        return;
    g->sock.hoarders_ns = now;
    ifd_conns_close_idle(g->sock.conns, HOARDER_MIN_NS,
                         "the heap is above its bound and they have no producer (libzmq keeps "
                         "the frames of an unfinished message without limit)");
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
        zmq_pollitem_t it = {.socket = g->sock.router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, ingest_replies_waiting(g) ? 2 : 10) <= 0)
            continue;
        int np, total;
        while (ingest_recv_message(g, parts, &np, &total) == 0) {
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
    json_object_set_new(bye, "status", json_string(g->end.fin_code ? "error" : "ok"));
    json_object_set_new(bye, "reason", json_string(g->end.fin_reason));
    json_object_set_new(bye, "global_step", json_integer(ifd_session_global_step(g->session)));
    if (g->end.fin_message[0])
        json_object_set_new(bye, "message", json_string(g->end.fin_message));
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

/* Signals (main's handler counts them): the first asks for a stop, the second aborts. A stop
 * asked on another host comes through the session's stop relay, with the same grace; a stop
 * that still waits for input after STOP_GRACE_NS closes the input. */
static void handle_stops(ifd_ingest *g)
{
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
        char why[64];
        snprintf(why, sizeof why, "stop requested on host %d", asker);
        ingest_request_stop(g, why);
    }
    if (g->stop_ns && !g->input_closed && ifd_clock_ns() - g->stop_ns > STOP_GRACE_NS)
        ingest_close_input(g, "stopping, and the current loop still waits for input");
}

/* The work of every pass, whatever woke the thread. The connection events are read every
 * CONNS_EVERY_NS (and at least every poll timeout), and before a message from a connection not
 * yet known (host/conns.h): polling their sockets too would cost each pass a system call or two. */
#define CONNS_EVERY_NS 10000000LL
static void every_pass(ifd_ingest *g, int64_t *conns_ns)
{
    if (ifd_clock_ns() - *conns_ns >= CONNS_EVERY_NS) {
        ifd_conns_update(g->sock.conns);
        ifd_conns_update(g->sock.ctl_conns);
        *conns_ns = ifd_clock_ns();
    }
    ingest_close_hoarders(g);
    ingest_replies_flush(g);
    ingest_send_acks(g);
    ingest_sample_rates(g);
    ingest_watch_infeed(g);
    ingest_check_liveness(g);
    ingest_retry_busy_hellos(g);
    handle_stops(g);
}

static int finishing(ifd_ingest *g)
{
    ifd_mutex_lock(&g->end.mu);
    int fin = g->end.finishing;
    ifd_mutex_unlock(&g->end.mu);
    return fin;
}

void *ingest_io_main(void *arg)
{
    ifd_ingest *g = arg;
    ingest_wait *w = &g->sock.wait;
    int64_t conns_ns = 0;
    while (!finishing(g)) {
        int rc = ingest_wait_poll(
            w, ingest_io_wait_ms(g, g->nbusy || ingest_replies_waiting(g) ? 5 : 100));
        ingest_io_awake(g);
        if (rc < 0 && errno != EINTR) {
            IFD_LOG_ERROR("ingest: poll: %s", strerror(errno));
            ifd_sleep_ns(10000000);
        }
        if (rc > 0 && w->ready[g->sock.i_efd]) {
            uint64_t v;
            ssize_t r = read(g->sock.efd, &v, sizeof v);
            (void)r;
        }
        every_pass(g, &conns_ns);
        /* After the pass's sends (ACKs, replies): the ROUTER is read until EAGAIN, so that its
         * ZMQ_FD signals the next message without a ZMQ_EVENTS read (zmq_wait.h); a burst cut
         * short leaves it marked. Control comes after it, so that a status sees the messages
         * that arrived with the request. */
        if (!ingest_recv_burst(g))
            ingest_wait_touch(w, g->sock.i_router);
        if (rc > 0 && g->sock.i_rep >= 0 && w->ready[g->sock.i_rep]) {
            ingest_handle_control(g); /* one request: the next wait reads the REP's events */
            ingest_wait_touch(w, g->sock.i_rep);
        }
    }
    finish(g);
    return NULL;
}
