/*
 * A BATCH or BATCH_SHM that its transport turned into tensors (host_frames): the producer's
 * credit and sequence, the program's checks, the step batches handed to the FIFO; the ACKs of
 * consumed batches and the PREDICTIONs that go with them. I/O thread, except the prediction
 * sink (outfeed thread).
 */
#include "host/ingest/ingest_internal.h"

#include "core/log.h"
#include "core/thread.h"
#include "core/wire.h"
#include "intake/inputs.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- BATCH and BATCH_SHM, whatever brought them ------------------------------------------- */

void ingest_batch_reject(ifd_ingest *g, producer *p, const producer_rid *from, int k, int code,
                         int64_t seq, const char *msg)
{
    p->credit += k;
    p->rejected++;
    g->stats.rejected++;
    ingest_send_error(g, from, code, seq, k, "batch %" PRId64 " from producer '%s': %s", seq,
                      p->name, msg);
}

/* The credit check's sentence (the producer counted credit it did not have). */
static void no_credit(ifd_ingest *g, const producer *p, const producer_rid *from, int64_t seq,
                      int k)
{
    if (k == 1)
        ingest_send_error(g, from, IFD_EPROTO, seq, 1,
                          "batch %" PRId64 " from producer '%s': no credit left (%d batches in "
                          "flight, credit %d): wait for an ACK",
                          seq, p->name, p->in_flight, g->pr.credit);
    else
        ingest_send_error(g, from, IFD_EPROTO, seq, k,
                          "batch %" PRId64 " from producer '%s': its %d steps need %d "
                          "credits, %d are left (%d steps in flight, credit %d): wait for "
                          "an ACK",
                          seq, p->name, k, k, p->credit, p->in_flight, g->pr.credit);
}

producer *ingest_batch_begin(ifd_ingest *g, const producer_rid *from, const ifd_proto_batch *bh,
                             const char *what, int *k)
{
    producer *p = ingest_find_by_rid(g, from);
    if (p == NULL || !p->welcomed) {
        ingest_send_error(g, from, IFD_EPROTO, bh->seq, 0,
                          "%s %" PRId64 " before HELLO: send HELLO with the schema first", what,
                          bh->seq);
        return NULL;
    }
    /* From here on a rejection returns the credit the producer spent on the batch: a credit a
     * step it carries. */
    *k = ingest_batch_steps(&g->pr, bh->rows);
    /* eval producers are not the train input: they may send after it ended */
    if (p->ended || (g->input_closed && !p->eval)) {
        ingest_send_error(g, from, IFD_ECLOSED, bh->seq, *k,
                          "batch %" PRId64 " from producer '%s': %s", bh->seq, p->name,
                          g->input_closed ? "the input has ended; no more batches are taken"
                          : p->timed_out
                              ? "the producer timed out (silent with credit for producer_timeout); "
                                "send HELLO to go on at WELCOME's next_seq"
                              : "the producer sent END; send HELLO to start again");
        return NULL;
    }
    if (p->credit < *k) {
        no_credit(g, p, from, bh->seq, *k);
        return NULL;
    }
    p->credit -= *k;
    return p;
}

int ingest_batch_sequence(ifd_ingest *g, producer *p, const producer_rid *from,
                          const ifd_proto_batch *bh, int k, int *skip)
{
    int64_t last = bh->seq + (k - 1);
    switch (ingest_seq_classify(p->last_seq, p->acked_seq, bh->seq, k, skip)) {
    case INGEST_SEQ_DUP_ACKED:
        p->credit += k;
        ingest_reply_ack(g, from, last, (uint32_t)k);
        break;
    case INGEST_SEQ_DUP_INFLIGHT:
        p->credit += k;
        ingest_reply_credit(g, from, (uint32_t)k);
        break;
    case INGEST_SEQ_NEW:
        return 0;
    }
    IFD_LOG_DEBUG("producer '%s': dropped duplicate batch %" PRId64, p->name, bh->seq);
    return -1;
}

/* Step batch j of n (the message's step skip + j). */
static host_batch *make_step(ifd_ingest *g, producer *p, const ifd_proto_batch *bh, host_frames *fr,
                             int64_t step, int64_t step_rows, int slot)
{
    host_batch *b = ingest_host_batch_take(g); /* zeroed, its ifd_batch too */
    if (b == NULL)
        return NULL;
    b->g = g;
    b->p = p;
    b->pos = p->pos;
    b->slot = slot;
    memcpy(b->name, p->name, sizeof b->name); /* both IFD_PROTO_NAME_MAX + 1, terminated */
    b->b.seq = bh->seq + step;
    b->b.rows = step_rows;
    /* checked as part of its message (ingest_batch_check_values): the infeed need not again */
    b->b.flags = bh->flags | IFD_BATCH_CHECKED | (fr->pinned ? IFD_BATCH_PINNED : 0);
    b->b.replica = p->replica >= 0 ? p->replica : 0;
    b->b.ntensors = g->pr.nin;
    b->b.producer = b->name;
    b->b.release = ingest_host_batch_release;
    b->b.release_arg = b;
    b->b.user = b;
    if (ingest_view_tensors(&g->pr, fr->data, step * step_rows, step_rows, b->b.tensors)) {
        ingest_host_batch_recycle(g, b);
        return NULL;
    }
    return b;
}

/* The accepted steps join the producer's list (until acknowledged) and the FIFO. */
static void enqueue_steps(ifd_ingest *g, producer *p, const producer_rid *from, host_frames *fr,
                          host_batch **hb, int n, int skip, int64_t last)
{
    fr->refs = fr->unreleased = n;
    if (skip) { /* the steps taken before cost no credit now */
        p->credit += skip;
        ingest_reply_credit(g, from, (uint32_t)skip);
    }
    p->last_seq = last;
    p->in_flight += n;
    p->accepted += n;
    g->stats.accepted += n;
    for (int j = 0; j < n; j++) {
        hb[j]->fr = fr;
        if (fr->slot_busy)
            __atomic_store_n(&fr->slot_busy[hb[j]->slot], hb[j]->b.seq, __ATOMIC_RELEASE);
        if (p->tail)
            p->tail->pnext = hb[j];
        else
            p->head = hb[j];
        p->tail = hb[j];
        ingest_fifo_push(g, hb[j]);
    }
}

/* An eval producer's checked message: its steps are copied into the eval set and acknowledged
 * at once (they are never trained on); fr is let go. */
static void accept_eval(ifd_ingest *g, producer *p, const producer_rid *from,
                        const ifd_proto_batch *bh, int k, int skip, host_frames *fr,
                        int64_t step_rows)
{
    ifd_error e;
    ifd_error_clear(&e);
    int rc = IFD_OK;
    for (int j = skip; rc == IFD_OK && j < k; j++) {
        ifd_tensor t[IFD_MAX_INPUTS];
        rc = ingest_view_tensors(&g->pr, fr->data, j * step_rows, step_rows, t);
        if (rc)
            ifd_error_set(&e, rc, "cannot take the batch: %s", ifd_strerror(rc));
        else
            rc = ifd_eval_set_add(g->eval, t, g->pr.nin, step_rows, p->name, bh->seq + j, &e);
    }
    ingest_host_frames_free(g, fr);
    if (rc) {
        char n[4 * IFD_PROTO_NAME_MAX + 1];
        IFD_LOG_LIMITED(&g->lim_reject, IFD_LOG_WARN, "eval producer '%s': batch %" PRId64 ": %s",
                        ifd_log_escape(p->name, n, sizeof n), bh->seq, ifd_error_text(&e));
        ingest_batch_reject(g, p, from, k, rc, bh->seq, ifd_error_text(&e));
        return;
    }
    int64_t last = bh->seq + (k - 1);
    int n = k - skip;
    if (skip) {
        p->credit += skip;
        ingest_reply_credit(g, from, (uint32_t)skip);
    }
    p->last_seq = p->acked_seq = last;
    p->accepted += n;
    g->stats.accepted += n;
    p->credit += n;
    ingest_reply_ack(g, from, last, (uint32_t)n);
}

void ingest_batch_accept(ifd_ingest *g, producer *p, const producer_rid *from,
                         const ifd_proto_batch *bh, int k, int skip, host_frames *fr, int rc,
                         int first_slot)
{
    host_batch *one = NULL, **hb = &one; /* the step batches (calloc: all NULL) */
    int n = k - skip;
    if (fr == NULL || (n > 1 && (hb = calloc((size_t)n, sizeof *hb)) == NULL)) {
        if (fr)
            ingest_host_frames_free(g, fr);
        ingest_batch_reject(g, p, from, k, IFD_ENOMEM, bh->seq, "out of memory");
        return;
    }
    ifd_error e;
    ifd_error_clear(&e);
    /* the whole message is checked as one batch (rows count from its first): the I/O thread's
     * own, zeroed once, since the checks read only its rows and tensors (zeroing a batch's
     * 792 bytes was 2 % of the daemon's CPU at 4 KiB) */
    ifd_batch *whole = &g->whole;
    whole->seq = bh->seq;
    whole->rows = bh->rows;
    whole->ntensors = g->pr.nin;
    if (rc == IFD_OK)
        rc = ingest_view_tensors(&g->pr, fr->data, 0, bh->rows, whole->tensors);
    if (rc)
        ifd_error_set(&e, rc, "cannot take the batch: %s", ifd_strerror(rc));
    else
        rc = ingest_batch_check_values(&g->pr, whole, &e);
    int64_t step_rows = k > 1 ? g->pr.batch_rows : bh->rows;
    if (rc == IFD_OK && p->eval) {
        accept_eval(g, p, from, bh, k, skip, fr, step_rows);
        if (hb != &one)
            free(hb);
        return;
    }
    for (int j = 0; rc == IFD_OK && j < n; j++) {
        int slot = first_slot >= 0 ? first_slot + skip + j : -1;
        if ((hb[j] = make_step(g, p, bh, fr, skip + j, step_rows, slot)) == NULL)
            rc = ifd_error_set(&e, IFD_ENOMEM, "out of memory");
    }
    if (rc) {
        for (int j = 0; j < n; j++)
            if (hb[j])
                ingest_host_batch_recycle(g, hb[j]);
        ingest_host_frames_free(g, fr);
        ingest_batch_reject(g, p, from, k, rc, bh->seq, ifd_error_text(&e));
    } else {
        enqueue_steps(g, p, from, fr, hb, n, skip, bh->seq + (k - 1));
    }
    if (hb != &one)
        free(hb);
}

/* ---- ACKs, summaries, control --------------------------------------------------------------- */

/* The prediction sink (outfeed thread): the message is built here and attached to the batch;
 * the I/O thread sends it just before the ACK that covers the batch. */
static int ingest_predictions(void *ctx, const ifd_batch *b, const ifd_predictions *pr,
                              ifd_error *err)
{
    (void)ctx;
    host_batch *hb = b->user;
    if (hb == NULL)
        return IFD_OK; /* not a producer's batch */
    prediction_msg *m = calloc(1, sizeof *m);
    json_t *desc = json_array();
    if (m == NULL || desc == NULL)
        goto nomem;
    ifd_proto_prediction(m->hdr, hb->b.seq, pr->rows, (uint32_t)pr->ntensors);
    for (int i = 0; i < pr->ntensors; i++) {
        const ifd_tensor *t = &pr->tensors[i];
        json_t *shape = json_array();
        for (int d = 1; d < t->shape.rank; d++)
            json_array_append_new(shape, json_integer(t->shape.dims[d]));
        json_array_append_new(desc, json_pack("{s:s, s:s, s:o}", "name", pr->names[i], "dtype",
                                              ifd_dtype_name(t->dtype), "shape", shape));
        m->len[i] = ifd_tensor_nbytes(t);
        m->data[i] = malloc(m->len[i] ? m->len[i] : 1);
        m->ntensors = i + 1;
        if (m->data[i] == NULL)
            goto nomem;
        memcpy(m->data[i], t->data, m->len[i]);
    }
    m->json = json_dumps(desc, JSON_COMPACT);
    if (m->json == NULL)
        goto nomem;
    json_decref(desc);
    hb->pred = m;
    return IFD_OK;

nomem:
    json_decref(desc);
    ingest_prediction_free(m);
    return ifd_error_set(err, IFD_ENOMEM, "the PREDICTION of batch %lld from producer '%s'",
                         (long long)b->seq, hb->name);
}

ifd_prediction_sink ifd_ingest_prediction_sink(ifd_ingest *g)
{
    return (ifd_prediction_sink){.write = ingest_predictions, .ctx = g};
}

/* One cumulative ACK per producer for the batches consumed since the last pass: they are
 * acknowledged in the producer's order, so "up to seq, n batches" names them all. */
void ingest_send_acks(ifd_ingest *g)
{
    __atomic_store_n(&g->acks_pending, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&g->acks_due, 0, __ATOMIC_SEQ_CST);
    for (int i = 0; i < g->cfg->max_producers; i++) {
        producer *p = &g->producers[i];
        uint32_t n = 0;
        while (p->head && __atomic_load_n(&p->head->done, __ATOMIC_ACQUIRE)) {
            host_batch *hb = p->head;
            p->head = hb->pnext;
            if (p->head == NULL)
                p->tail = NULL;
            p->in_flight--;
            p->acked_seq = hb->b.seq;
            n++;
            if (hb->pred && p->rid_len) { /* the reply's now */
                producer_rid r = ingest_rid_of(p);
                ingest_reply_prediction(g, &r, hb->pred);
                hb->pred = NULL;
            }
            ingest_host_batch_recycle(g, hb);
        }
        if (n && p->rid_len) {
            producer_rid r = ingest_rid_of(p);
            p->credit += (int)n;
            ingest_reply_ack(g, &r, p->acked_seq, n);
        }
    }
}

static void copy_spares_drop(copy_spares *s)
{
    while (s->head) {
        void *c = s->head;
        s->head = *(void **)c;
        free(c);
    }
    s->n = 0;
}

void *ingest_copy_aligned(ifd_ingest *g, int i, const void *src, size_t len)
{
    copy_spares *s = &g->copy_spare[i];
    if (len != s->size) { /* a new size: the old one's spares go */
        copy_spares_drop(s);
        s->size = len;
    }
    void *c = s->head;
    if (c) {
        s->head = *(void **)c;
        s->n--;
    } else {
        /* malloc's alignment (max_align_t) suffices for every dtype; aligned_alloc's memalign
         * path cost 2 % of the daemon's time at 4 KiB */
        c = malloc(len > sizeof(void *) ? len : sizeof(void *));
    }
    if (c) {
        memcpy(c, src, len);
        g->stats.copied_bytes += (int64_t)len;
    }
    return c;
}

void ingest_copy_free(ifd_ingest *g, int i, void *copy, size_t len)
{
    copy_spares *s = &g->copy_spare[i];
    if (copy == NULL)
        return;
    if (len != s->size || s->n >= g->pr.credit) {
        free(copy);
        return;
    }
    *(void **)copy = s->head;
    s->head = copy;
    s->n++;
}

void ingest_copy_spares_free(ifd_ingest *g)
{
    for (int i = 0; i < IFD_MAX_INPUTS; i++)
        copy_spares_drop(&g->copy_spare[i]);
}
