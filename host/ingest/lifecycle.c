/*
 * The ingest's life: create (the run's sizes, the monitor, the sockets), start (the program and
 * the I/O thread), finish, destroy; and the producers' positions for checkpoints. Main thread.
 */
#include "host/ingest/ingest_internal.h"
#include "host/limits.h"
#include "host/security.h"

#include "core/log.h"
#include <infeed/checkpoint.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

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
    ifd_program_free(&p);
    return most;
}

/* The protocol's view of the run (pr) and the bounds that follow from the batch: the credit,
 * the steps a message may carry, the largest frame. */
static void size_the_run(ifd_ingest *g, size_t *batch_bytes, int *tensors)
{
    const ifd_daemon_config *c = g->cfg;
    ingest_proto *pr = &g->pr;
    pr->mode = c->run.mode;
    pr->input_mode = c->run.input_mode;
    pr->replicas = c->run.replicas;
    pr->batch_size = c->run.batch_size;
    pr->batch_rows = ifd_input_batch_rows(c->run.input_mode, c->run.batch_size, c->run.replicas);
    pr->check_finite = c->check_finite;
    pr->max_abs_input = c->max_abs_input;
    size_t largest = batch_sizes(c, batch_bytes, tensors);
    /* a message may carry max_steps_per_message steps (predict: one batch at most) */
    pr->max_steps = c->run.mode == IFD_MODE_PREDICT ? 1 : c->max_steps_per_message;
    g->sock.max_frame = ifd_router_max_frame(largest * (size_t)pr->max_steps);
    pr->credit = c->credit > 0 ? c->credit : ifd_proto_auto_credit(*batch_bytes);
    if (pr->credit < pr->max_steps) /* a credit a step: a message of max_steps must fit */
        pr->credit = pr->max_steps;
    /* per-host-v2: a step holds one batch a replica until all are in; one producer alone must
     * be able to send them all (config validation refuses a smaller explicit credit) */
    if (c->run.input_mode == IFD_INPUT_PER_HOST_V2 && pr->credit < c->run.replicas)
        pr->credit = c->run.replicas;
}

/* The heap monitor, with the memory bound of docs/protocol.md for this run. */
static int start_monitor(ifd_ingest *g, size_t batch_bytes, int tensors, ifd_error *err)
{
    const ifd_daemon_config *c = g->cfg;
    int conns = ifd_daemon_max_connections(c);
    /* the ingest's: its connections and the refused ones held for their answer */
    ifd_memory_terms mt = {c->max_producers, g->pr.credit,           batch_bytes, g->sock.max_frame,
                           tensors,          conns + IFD_CONNS_HELD, conns,       conns};
    /* --eval-every: the eval set, at most eval_memory bytes of tensors, is on the heap too */
    size_t eval = c->eval_every > 0 ? (size_t)c->eval_memory : 0;
    int rc = ifd_monitor_create(&g->sock.monitor, conns, ifd_memory_bound(&mt) + eval, err);
    if (rc == IFD_OK && c->shm)
        IFD_LOG_INFO("shared-memory pools (--shm on): at most %zu MiB besides the heap "
                     "(docs/protocol.md)",
                     (ifd_shm_bound(&mt, g->pr.max_steps) + (1u << 20) - 1) >> 20);
    return rc;
}

int ifd_ingest_create(ifd_ingest **out, const ifd_daemon_config *c, int *signals, ifd_error *err)
{
    *out = NULL;
    ifd_ingest *g = calloc(1, sizeof *g);
    if (g == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "ingest");
    g->cfg = c;
    g->signals = signals;
    g->sock.efd = -1;
    g->sock.msg_fd = -1;
    ifd_mutex_init(&g->fifo.mu);
    ifd_cond_init(&g->fifo.cv);
    ifd_mutex_init(&g->end.mu);
    ifd_mutex_init(&g->pools.mu);
    int rc;
    g->producers = calloc((size_t)c->max_producers, sizeof *g->producers);
    g->fifo.nlanes = c->run.input_mode == IFD_INPUT_PER_CORE ? c->run.replicas : 1;
    g->fifo.lanes = calloc((size_t)g->fifo.nlanes, sizeof *g->fifo.lanes);
    if (c->eval_every > 0 && ifd_eval_set_create(&g->eval, c->eval_memory) != IFD_OK)
        g->eval = NULL;
    if (g->producers == NULL || g->fifo.lanes == NULL || (c->eval_every > 0 && !g->eval)) {
        rc = ifd_error_set(err, IFD_ENOMEM, "ingest: producer table");
        goto fail;
    }
    g->fifo.max_pos = 4 * c->max_producers > 1024 ? 4 * c->max_producers : 1024;
    g->lim_hello = (ifd_log_limit)IFD_LOG_LIMIT_INIT(20, 1000000000LL);
    g->lim_reject = (ifd_log_limit)IFD_LOG_LIMIT_INIT(10, 1000000000LL);
    g->lim_gone = (ifd_log_limit)IFD_LOG_LIMIT_INIT(20, 1000000000LL);
    g->sock.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->sock.efd < 0) {
        rc = ifd_error_set(err, IFD_EIO, "ingest: eventfd: %s", strerror(errno));
        goto fail;
    }
    g->sock.zctx = zmq_ctx_new();
    if (g->sock.zctx == NULL) {
        rc = ifd_error_set(err, IFD_EIO, "ingest: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* CURVE: the ZAP handler is bound before any socket and stopped after they are closed */
    if ((rc = ifd_security_start(c->security, g->sock.zctx, err)) != IFD_OK)
        goto fail;
    size_t batch_bytes;
    int tensors;
    size_the_run(g, &batch_bytes, &tensors);
    if ((rc = start_monitor(g, batch_bytes, tensors, err)) != IFD_OK ||
        (rc = ingest_sockets_open(g, err)) != IFD_OK ||
        (rc = ifd_monitor_start(g->sock.monitor, err)) != IFD_OK)
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
    if (g->sock.started) {
        ifd_mutex_lock(&g->end.mu);
        g->end.finishing = 1;
        ifd_mutex_unlock(&g->end.mu);
        ifd_ingest_wake(g);
        ifd_thread_join(&g->sock.thread);
        g->sock.started = 0;
    }
    ingest_shm_release_session(g);
}

void ifd_ingest_destroy(ifd_ingest *g)
{
    if (g == NULL)
        return;
    ifd_ingest_release_session(g);
    /* Batches never taken by the run: release them (no ACK is sent any more). */
    for (int i = 0; g->fifo.lanes && i < g->fifo.nlanes; i++)
        for (host_batch *hb = g->fifo.lanes[i].head; hb; hb = hb->qnext)
            ingest_host_batch_free_frames(hb);
    free(g->fifo.lanes);
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
    ingest_host_batch_spares_free(g);
    ingest_zmq_spares_free(g);
    ingest_copy_spares_free(g);
    ifd_eval_set_destroy(g->eval);
    ingest_producers_free(g);
    ingest_replies_free(g);
    ingest_ended_conns_free(g);
    /* libzmq waits on a monitor event nobody reads: stop the monitoring first */
    ifd_conns_destroy(g->sock.conns);
    ifd_conns_destroy(g->sock.ctl_conns);
    ifd_publisher_destroy(g->sock.pub);
    ifd_monitor_destroy(g->sock.monitor);
    if (g->sock.router)
        zmq_close(g->sock.router);
    if (g->sock.rep)
        zmq_close(g->sock.rep);
    /* CURVE: the ZAP handler goes after the sockets it answers for, before the context */
    ifd_security_stop(g->cfg->security);
    if (g->sock.zctx)
        zmq_ctx_term(g->sock.zctx);
    if (g->sock.efd >= 0)
        close(g->sock.efd);
    ifd_mutex_fini(&g->end.mu);
    ifd_mutex_fini(&g->pools.mu);
    ifd_cond_fini(&g->fifo.cv);
    ifd_mutex_fini(&g->fifo.mu);
    free(g);
}

ifd_sink *ifd_ingest_pub_sink(ifd_ingest *g)
{
    return ifd_publisher_sink(g->sock.pub);
}

const ifd_tensor_sink *ifd_ingest_tensor_sink(ifd_ingest *g)
{
    return ifd_publisher_tensor_sink(g->sock.pub);
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
    ifd_mutex_lock(&g->fifo.mu);
    for (int i = 0; i < g->fifo.npos && rc == IFD_OK; i++)
        if (g->fifo.pos[i]->seq >= 0)
            rc = ifd_checkpoint_set_producer(c, g->fifo.pos[i]->name, g->fifo.pos[i]->seq, err);
    ifd_mutex_unlock(&g->fifo.mu);
    return rc;
}

ifd_eval_set *ifd_ingest_eval_set(ifd_ingest *g)
{
    return g->eval;
}

void ingest_attach_program(ifd_ingest *g, const ifd_program *program)
{
    ingest_proto_attach(&g->pr, program);
}

int ifd_ingest_start(ifd_ingest *g, ifd_session *s, ifd_error *err)
{
    g->session = s;
    g->stats.first_step = ifd_session_global_step(s);
    ingest_attach_program(g, ifd_session_program(s));
    ifd_session_set_watchdog_context(s, ingest_watchdog_context, g);
    int rc = ifd_thread_start(&g->sock.thread, "ifd-ingest", ingest_io_main, g);
    if (rc)
        return ifd_error_set(err, rc, "ingest: cannot start the I/O thread");
    g->sock.started = 1;
    if (g->sock.pub && (rc = ifd_publisher_start(g->sock.pub, err)) != IFD_OK)
        return rc;
    return IFD_OK;
}

void ifd_ingest_finish(ifd_ingest *g, int code, const char *reason, const char *message)
{
    ifd_mutex_lock(&g->end.mu);
    g->end.fin_code = code;
    snprintf(g->end.fin_reason, sizeof g->end.fin_reason, "%s", reason ? reason : "");
    snprintf(g->end.fin_message, sizeof g->end.fin_message, "%s", message ? message : "");
    g->end.finishing = 1;
    ifd_mutex_unlock(&g->end.mu);
    ifd_eval_set_close(g->eval);
    ifd_ingest_wake(g);
    if (g->sock.started) {
        ifd_thread_join(&g->sock.thread);
        g->sock.started = 0;
    }
    ingest_shm_release_session(g);
    ifd_publisher_stop(g->sock.pub); /* after the queued summaries */
}
