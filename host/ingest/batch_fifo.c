#include "host/ingest/ingest_internal.h"

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
#include <string.h>
#include <unistd.h>

/*
 * The batch source the session reads: the ingest's own FIFOs (one, or one a replica in per-core
 * mode), which never block their writer, the I/O thread; the infeed thread pops under fifo.mu.
 * And the life of an accepted batch: its release (any thread) and its free.
 */

/* ---- the batch source ----------------------------------------------------------------------- */

void ingest_host_frames_free(ifd_ingest *g, host_frames *fr)
{
    for (int i = 0; i < IFD_MAX_INPUTS; i++)
        ingest_copy_free(g, i, fr->copies[i], fr->copy_len[i]);
    fr->free(fr);
}

/* Lets go of hb's share of its message's frames (once: when it is acknowledged, or dropped at
 * the end); the last share frees them. Not on the runtime's thread: the frames and the copies
 * were allocated on the I/O thread (or libzmq's), whose allocator arena a free from a replica
 * would contend for (bench/README.md, "4 KiB against the 0.8 target"). */
void ingest_host_batch_free_frames(host_batch *hb)
{
    host_frames *fr = hb->fr;
    hb->fr = NULL;
    if (fr == NULL)
        return;
    /* never released (dropped at the end): its slot is free; a released one freed it then, and
     * the slot may hold a newer step now */
    if (fr->slot_busy && hb->slot >= 0 && !__atomic_load_n(&hb->done, __ATOMIC_ACQUIRE))
        __atomic_store_n(&fr->slot_busy[hb->slot], -1, __ATOMIC_RELEASE);
    if (__atomic_sub_fetch(&fr->refs, 1, __ATOMIC_ACQ_REL) == 0)
        ingest_host_frames_free(hb->g, fr);
}

void ingest_prediction_free(prediction_msg *m)
{
    if (m == NULL)
        return;
    free(m->json);
    for (int i = 0; i < m->ntensors; i++)
        free(m->data[i]);
    free(m);
}

/* Frees an acknowledged or abandoned batch. */
void ingest_host_batch_free(host_batch *hb)
{
    ingest_host_batch_free_frames(hb);
    ingest_prediction_free(hb->pred);
    free(hb);
}

host_batch *ingest_host_batch_take(ifd_ingest *g)
{
    host_batch *hb = g->spare;
    if (hb == NULL)
        return calloc(1, sizeof *hb);
    g->spare = hb->pnext;
    g->nspare--;
    memset(hb, 0, sizeof *hb);
    return hb;
}

void ingest_host_batch_recycle(ifd_ingest *g, host_batch *hb)
{
    if (g->nspare >= g->pr.credit) {
        ingest_host_batch_free(hb);
        return;
    }
    ingest_host_batch_free_frames(hb);
    ingest_prediction_free(hb->pred);
    hb->pred = NULL;
    hb->pnext = g->spare;
    g->spare = hb;
    g->nspare++;
}

void ingest_host_batch_spares_free(ifd_ingest *g)
{
    while (g->spare) {
        host_batch *hb = g->spare;
        g->spare = hb->pnext;
        free(hb);
    }
    g->nspare = 0;
}

int64_t ingest_ack_wake_steps(const ifd_ingest *g)
{
    return g->pr.credit >= 4 ? g->pr.credit / 4 : 1;
}

/* Any thread: asks the I/O thread for ACKs, and wakes it (an eventfd write, and a read and a
 * pass there) only when it waits or is about to: a busy one sees acks_pending before it polls
 * (ingest_io_wait_ms). Sequentially consistent on both sides, so that the request sees it
 * waiting or it sees the request. */
static void acks_request(ifd_ingest *g)
{
    if (__atomic_exchange_n(&g->acks_pending, 1, __ATOMIC_SEQ_CST) == 0 &&
        __atomic_load_n(&g->io_waiting, __ATOMIC_SEQ_CST))
        ifd_ingest_wake(g);
}

/* The runtime's release: any thread, once. The batch is marked done, and the I/O thread frees
 * it (and its share of the frames) when it acknowledges it; hb may be gone once done is set. */
void ingest_host_batch_release(ifd_batch *b, void *arg)
{
    (void)b;
    host_batch *hb = arg;
    ifd_ingest *g = hb->g;
    host_frames *fr = hb->fr;
    if (fr->slot_busy && hb->slot >= 0) /* its slot is free (the producer waits for the ACK) */
        __atomic_store_n(&fr->slot_busy[hb->slot], -1, __ATOMIC_RELEASE);
    int last = __atomic_sub_fetch(&fr->unreleased, 1, __ATOMIC_ACQ_REL) == 0;
    int64_t left = __atomic_sub_fetch(&g->queued, 1, __ATOMIC_SEQ_CST);
    int64_t due = __atomic_add_fetch(&g->acks_due, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&hb->done, 1, __ATOMIC_RELEASE);
    /* A message of several steps is acknowledged when its last step is, with one ACK (or
     * sooner, on the I/O thread's next pass), and the thread is asked only when the input waits
     * on the ACKs (ingest_ack_wake_steps); src_pop asks when it starts to wait. */
    if (last && (left == 0 || due >= ingest_ack_wake_steps(g) ||
                 __atomic_load_n(&g->fifo.src_waiting, __ATOMIC_SEQ_CST)))
        acks_request(g);
}

int ingest_io_wait_ms(ifd_ingest *g, int ms)
{
    __atomic_store_n(&g->io_waiting, 1, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&g->acks_pending, __ATOMIC_SEQ_CST) ? 0 : ms;
}

void ingest_io_awake(ifd_ingest *g)
{
    __atomic_store_n(&g->io_waiting, 0, __ATOMIC_RELAXED);
}

static int src_pop(ifd_ingest *g, int lane, ifd_batch **out, int wait, ifd_error *err)
{
    if (lane < 0 || lane >= g->fifo.nlanes)
        return ifd_error_set(err, IFD_EINVAL, "batch source: replica %d: expected 0 to %d", lane,
                             g->fifo.nlanes - 1);
    src_lane *l = &g->fifo.lanes[lane];
    ifd_mutex_lock(&g->fifo.mu);
    if (wait && l->head == NULL && !g->fifo.closed && !g->fifo.aborted) {
        /* The input waits: the releases from now on ask for their ACKs at once, and those
         * released before are asked for now (the producers may wait for them to send). */
        __atomic_store_n(&g->fifo.src_waiting, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&g->acks_due, __ATOMIC_SEQ_CST) > 0)
            acks_request(g);
        while (l->head == NULL && !g->fifo.closed && !g->fifo.aborted)
            ifd_cond_wait(&g->fifo.cv, &g->fifo.mu);
        __atomic_store_n(&g->fifo.src_waiting, 0, __ATOMIC_SEQ_CST);
    }
    int rc;
    if (g->fifo.aborted) {
        rc = IFD_ESTOPPED;
    } else if (l->head) {
        host_batch *hb = l->head;
        l->head = hb->qnext;
        if (l->head == NULL)
            l->tail = NULL;
        l->len--;
        if (hb->b.seq > g->fifo.pos[hb->pos]->seq)
            g->fifo.pos[hb->pos]->seq = hb->b.seq;
        *out = &hb->b;
        rc = IFD_OK;
    } else {
        rc = g->fifo.closed ? IFD_EEOF : IFD_ETIMEDOUT;
    }
    ifd_mutex_unlock(&g->fifo.mu);
    return rc;
}

static int src_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    return src_pop(ctx, 0, out, 1, err);
}

static int src_try_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    return src_pop(ctx, 0, out, 0, err);
}

static int src_next_for(void *ctx, int replica, ifd_batch **out, ifd_error *err)
{
    return src_pop(ctx, replica, out, 1, err);
}

static int src_try_next_for(void *ctx, int replica, ifd_batch **out, ifd_error *err)
{
    return src_pop(ctx, replica, out, 0, err);
}

static void src_abort(void *ctx)
{
    ifd_ingest *g = ctx;
    ifd_mutex_lock(&g->fifo.mu);
    g->fifo.aborted = 1;
    ifd_cond_broadcast(&g->fifo.cv);
    ifd_mutex_unlock(&g->fifo.mu);
    ifd_eval_set_close(g->eval); /* a due eval no longer waits for its set */
}

/* I/O thread: queues hb for the next ingest_fifo_flush, in its replica's FIFO in per-core mode. */
void ingest_fifo_push(ifd_ingest *g, host_batch *hb)
{
    src_lane *l = &g->fifo.lanes[g->fifo.nlanes > 1 ? hb->b.replica : 0];
    __atomic_add_fetch(&g->queued, 1, __ATOMIC_SEQ_CST);
    hb->qnext = NULL;
    if (l->btail)
        l->btail->qnext = hb;
    else
        l->bhead = hb;
    l->btail = hb;
}

/* I/O thread: hands the batches of a receive burst to the infeed thread with one wake-up. */
void ingest_fifo_flush(ifd_ingest *g)
{
    int any = 0;
    for (int i = 0; i < g->fifo.nlanes; i++)
        any |= g->fifo.lanes[i].bhead != NULL;
    if (!any)
        return;
    ifd_mutex_lock(&g->fifo.mu);
    for (int i = 0; i < g->fifo.nlanes; i++) {
        src_lane *l = &g->fifo.lanes[i];
        if (l->bhead == NULL)
            continue;
        size_t n = 0;
        for (host_batch *hb = l->bhead; hb; hb = hb->qnext)
            n++;
        if (l->tail)
            l->tail->qnext = l->bhead;
        else
            l->head = l->bhead;
        l->tail = l->btail;
        l->len += n;
        l->bhead = l->btail = NULL;
    }
    /* One consumer (the infeed thread), waiting for one FIFO: a wake-up for another FIFO's batch
     * makes it check again and wait on. Woken only when it waits (src_waiting, written under mu),
     * and after the unlock, so that it does not wake to block on the mutex at once. */
    int wake = __atomic_load_n(&g->fifo.src_waiting, __ATOMIC_RELAXED);
    ifd_mutex_unlock(&g->fifo.mu);
    if (wake)
        ifd_cond_signal(&g->fifo.cv);
}

void ingest_close_input(ifd_ingest *g, const char *why)
{
    if (g->input_closed)
        return;
    ingest_fifo_flush(g);
    g->input_closed = 1;
    IFD_LOG_INFO("input closed: %s", why);
    ifd_mutex_lock(&g->fifo.mu);
    g->fifo.closed = 1;
    ifd_cond_broadcast(&g->fifo.cv);
    ifd_mutex_unlock(&g->fifo.mu);
}

static const ifd_batch_source_ops src_ops = {
    .next = src_next,
    .abort = src_abort,
    .try_next = src_try_next,
    .next_for = src_next_for,
    .try_next_for = src_try_next_for,
};

ifd_batch_source ifd_ingest_source(ifd_ingest *g)
{
    ifd_batch_source s = {.ops = &src_ops, .ctx = g};
    return s;
}
