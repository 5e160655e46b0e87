#include "host/ingest/ingest_internal.h"

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

/* ---- BATCH ------------------------------------------------------------------------------ */

/* A refused batch: the credits it cost (its steps) go back with the ERROR. */
static void reject(ifd_ingest *g, producer *p, const producer_rid *from, int k, int code,
                   int64_t seq, const char *msg)
{
    p->credit += k;
    p->rejected++;
    g->rejected++;
    ingest_send_error(g, from, code, seq, k, "batch %" PRId64 " from producer '%s': %s", seq,
                      p->name, msg);
}

/* The steps a BATCH of `rows` carries, which is what it costs in credit: k when rows is
 * k x batch_rows with 1 < k <= max_steps (train, eval), else 1 (one batch, or rows that the
 * checks refuse). */
static int message_steps(const ifd_ingest *g, int64_t rows)
{
    if (g->max_steps > 1 && rows > g->batch_rows && rows % g->batch_rows == 0 &&
        rows / g->batch_rows <= g->max_steps)
        return (int)(rows / g->batch_rows);
    return 1;
}

/* The rows check's sentence, or NULL when rows is right. */
static const char *check_rows(const ifd_ingest *g, int64_t rows, char *msg, size_t len)
{
    int predict = g->cfg->run.mode == IFD_MODE_PREDICT;
    if (predict ? rows >= 1 && rows <= g->batch_rows
                : rows >= g->batch_rows && rows % g->batch_rows == 0 &&
                      rows / g->batch_rows <= g->max_steps)
        return NULL;
    char per[96] = "the batch size";
    if (g->cfg->run.input_mode != IFD_INPUT_PER_HOST)
        snprintf(per, sizeof per, "%s input: batch_size %" PRId64 " / %d replicas",
                 ifd_input_mode_name(g->cfg->run.input_mode), g->cfg->run.batch_size,
                 g->cfg->run.replicas);
    if (g->max_steps > 1)
        snprintf(msg, len,
                 "rows: expected %" PRId64 " (%s) or a multiple of it up to %d x %" PRId64
                 " (max_steps_per_message: that many steps in one message), got %" PRId64,
                 g->batch_rows, per, g->max_steps, g->batch_rows, rows);
    else
        snprintf(msg, len, "rows: expected %s%" PRId64 " (%s%s), got %" PRId64,
                 predict ? "1 to " : "", g->batch_rows, per,
                 predict ? "; predict mode pads a partial batch" : "", rows);
    return msg;
}

/* The tensors of rows [row0, row0 + rows) of the message's frames. */
static int view_tensors(ifd_ingest *g, host_frames *fr, int64_t row0, int64_t rows, ifd_tensor *out)
{
    for (int i = 0; i < g->nin; i++) {
        const ifd_input_spec *in = g->in[i];
        size_t row = ifd_dtype_size(in->dtype);
        int64_t dims[IFD_MAX_RANK + 1];
        dims[0] = rows;
        for (int d = 0; d < in->rank; d++) {
            dims[d + 1] = in->dims[d];
            row *= (size_t)in->dims[d];
        }
        int rc = ifd_tensor_init(&out[i], in->dtype, in->rank + 1, dims,
                                 fr->data[i] + (size_t)row0 * row);
        if (rc)
            return rc;
    }
    return IFD_OK;
}

/* Tensor i's bytes in a message of `rows`. */
static size_t tensor_bytes(const ifd_ingest *g, int i, int64_t rows)
{
    const ifd_input_spec *in = g->in[i];
    size_t row = ifd_dtype_size(in->dtype);
    for (int d = 0; d < in->rank; d++)
        row *= (size_t)in->dims[d];
    return row * (size_t)rows;
}

/* An aligned copy of len bytes at src (for frames libzmq left unaligned, and a pool's integer
 * tensors), or NULL. */
static void *copy_aligned(ifd_ingest *g, const void *src, size_t len)
{
    void *c = aligned_alloc(64, (len + 63) / 64 * 64);
    if (c) {
        memcpy(c, src, len);
        g->copied_bytes += (int64_t)len;
    }
    return c;
}

/* BATCH: the tensor frames move into fr (the device reads them where libzmq put them). */
static int take_frames(ifd_ingest *g, host_frames *fr, zmq_msg_t *frames)
{
    for (int i = 0; i < g->nin; i++) {
        zmq_msg_init(&fr->frames[i]);
        zmq_msg_move(&fr->frames[i], &frames[i]);
        fr->nframes = i + 1;
        fr->data[i] = zmq_msg_data(&fr->frames[i]);
        if ((uintptr_t)fr->data[i] % ifd_dtype_size(g->in[i]->dtype) != 0) { /* unaligned */
            fr->data[i] = fr->copies[i] =
                copy_aligned(g, fr->data[i], zmq_msg_size(&fr->frames[i]));
            if (fr->copies[i] == NULL)
                return IFD_ENOMEM;
        }
    }
    return IFD_OK;
}

/* BATCH_SHM: the tensors are the pool's slots from `slot` on; float32 ones are read in place,
 * the others (labels, ids: values a program may index with) copied now, so that a producer
 * writing the slot later cannot change what was checked. */
static int take_slots(ifd_ingest *g, host_frames *fr, shm_pool *pool, uint32_t slot, int64_t rows)
{
    ingest_shm_ref(pool);
    fr->pool = pool;
    for (int i = 0; i < g->nin; i++) {
        char *at = (char *)pool->base + pool->offsets[i] + (size_t)slot * pool->step_bytes[i];
        fr->data[i] = at;
        if (g->in[i]->dtype != IFD_F32) {
            fr->data[i] = fr->copies[i] = copy_aligned(g, at, tensor_bytes(g, i, rows));
            if (fr->copies[i] == NULL)
                return IFD_ENOMEM;
        }
    }
    return IFD_OK;
}

/* BATCH_SHM's own checks: no frames, a pool, slots [slot, slot + k) in it, and those of the
 * steps taken (from skip on) free. The sentence, or NULL. */
static const char *check_slots(const producer *p, int nframes, uint32_t slot, int k, int skip,
                               char *msg, size_t len)
{
    const shm_pool *pool = p->pool;
    if (nframes != 0) {
        snprintf(msg, len,
                 "BATCH_SHM: expected no frames after the header (the tensors are in "
                 "the shared-memory pool), got %d",
                 nframes);
        return msg;
    }
    if (pool == NULL) {
        snprintf(msg, len,
                 "BATCH_SHM: the producer has no shared-memory pool (a HELLO with "
                 "\"shm\": true gets one when the WELCOME's shm is not null)");
        return msg;
    }
    if ((uint64_t)slot + (uint64_t)k > (uint64_t)pool->slots) {
        snprintf(msg, len,
                 "slot: a message of %d step%s from slot %" PRIu32 " needs slots up to %" PRIu64
                 ", the pool has %d (0 to %d)",
                 k, k == 1 ? "" : "s", slot, (uint64_t)slot + (uint64_t)k - 1, pool->slots,
                 pool->slots - 1);
        return msg;
    }
    for (int j = skip; j < k; j++) {
        int64_t in = __atomic_load_n(&pool->busy[slot + (uint32_t)j], __ATOMIC_ACQUIRE);
        if (in >= 0) {
            snprintf(msg, len,
                     "slot %" PRIu32 " holds step %" PRId64
                     ", which is in flight: a slot is written again once its step is "
                     "acknowledged",
                     slot + (uint32_t)j, in);
            return msg;
        }
    }
    return NULL;
}

void ingest_handle_batch(ifd_ingest *g, const producer_rid *from, zmq_msg_t *parts, int total,
                         int shm)
{
    const char *what = shm ? "BATCH_SHM" : "BATCH";
    zmq_msg_t *hdr = &parts[1];
    producer *p = ingest_find_by_rid(g, from);
    size_t hlen = zmq_msg_size(hdr);
    if (hlen < IFD_PROTO_BATCH_HDR) {
        ingest_send_error(g, from, IFD_EPROTO, NO_SEQ, 0,
                          "%s header: expected %d bytes (seq, rows, flags, %s), got %zu", what,
                          IFD_PROTO_BATCH_HDR, shm ? "slot" : "ntensors", hlen);
        return;
    }
    ifd_proto_batch bh;
    ifd_proto_parse_batch(zmq_msg_data(hdr), &bh);
    if (p == NULL || !p->welcomed) {
        ingest_send_error(g, from, IFD_EPROTO, bh.seq, 0,
                          "%s %" PRId64 " before HELLO: send HELLO with the schema first", what,
                          bh.seq);
        return;
    }
    /* From here on a rejection returns the credit the producer spent on the batch: a credit a
     * step it carries. */
    int k = message_steps(g, bh.rows);
    if (p->ended || g->input_closed) {
        ingest_send_error(g, from, IFD_ECLOSED, bh.seq, k,
                          "batch %" PRId64 " from producer '%s': %s", bh.seq, p->name,
                          g->input_closed ? "the input has ended; no more batches are taken"
                          : p->timed_out
                              ? "the producer timed out (silent with credit for producer_timeout); "
                                "send HELLO to go on at WELCOME's next_seq"
                              : "the producer sent END; send HELLO to start again");
        return;
    }
    if (p->credit < k) { /* the producer counted credit it did not have: give it back */
        if (k == 1)
            ingest_send_error(g, from, IFD_EPROTO, bh.seq, 1,
                              "batch %" PRId64
                              " from producer '%s': no credit left (%d batches in flight, "
                              "credit %d): wait for an ACK",
                              bh.seq, p->name, p->in_flight, g->credit);
        else
            ingest_send_error(g, from, IFD_EPROTO, bh.seq, k,
                              "batch %" PRId64 " from producer '%s': its %d steps need %d "
                              "credits, %d are left (%d steps in flight, credit %d): wait for "
                              "an ACK",
                              bh.seq, p->name, k, k, p->credit, p->in_flight, g->credit);
        return;
    }
    p->credit -= k;
    char msg[IFD_ERROR_MSG_MAX];
    const ifd_program *prog = g->program;
    int nframes = total - 2;
    if (shm && p->pool)
        ingest_shm_mapped(p->pool); /* the producer has it: nobody else opens it */
    if (shm && (nframes != 0 || p->pool == NULL)) {
        reject(g, p, from, k, IFD_EPROTO, bh.seq,
               check_slots(p, nframes, 0, 0, 0, msg, sizeof msg));
        return;
    }
    if (!shm && bh.ntensors != (uint32_t)nframes) {
        snprintf(msg, sizeof msg, "header ntensors says %" PRIu32 ", but %d frames follow",
                 bh.ntensors, nframes);
        reject(g, p, from, k, IFD_EPROTO, bh.seq, msg);
        return;
    }
    if (!shm && nframes != g->nin) {
        snprintf(msg, sizeof msg, "expected %d tensor frames (the schema's tensors), got %d",
                 g->nin, nframes);
        reject(g, p, from, k, IFD_ESHAPE, bh.seq, msg);
        return;
    }
    if (bh.flags != 0) {
        snprintf(msg, sizeof msg, "flags: expected 0 in %s mode, got 0x%" PRIx32,
                 ifd_mode_name(g->cfg->run.mode), bh.flags);
        reject(g, p, from, k, IFD_EINVAL, bh.seq, msg);
        return;
    }
    if (check_rows(g, bh.rows, msg, sizeof msg)) {
        reject(g, p, from, k, IFD_ESHAPE, bh.seq, msg);
        return;
    }
    for (int i = 0; i < nframes; i++) {
        const ifd_input_spec *in = g->in[i];
        size_t want = tensor_bytes(g, i, bh.rows), got = zmq_msg_size(&parts[2 + i]);
        if (got != want) {
            char shape[96];
            snprintf(msg, sizeof msg,
                     "tensor '%s' is %zu bytes, expected %zu (%" PRId64 " rows of %s %s)", in->name,
                     got, want, bh.rows,
                     ingest_dims_format(in->rank, in->dims, shape, sizeof shape),
                     ifd_dtype_name(in->dtype));
            reject(g, p, from, k, IFD_ESHAPE, bh.seq, msg);
            return;
        }
    }
    if (bh.seq < 0 || bh.seq > INT64_MAX - (k - 1)) {
        if (k == 1)
            snprintf(msg, sizeof msg, "seq: expected an integer >= 0, got %" PRId64, bh.seq);
        else
            snprintf(msg, sizeof msg,
                     "seq: a message of %d steps takes seq to seq + %d: expected 0 to %" PRId64
                     ", got %" PRId64,
                     k, k - 1, INT64_MAX - (k - 1), bh.seq);
        reject(g, p, from, k, IFD_EINVAL, bh.seq, msg);
        return;
    }
    /* Step j of the message is the stream's batch seq + j. */
    int64_t last = bh.seq + (k - 1);
    int skip = 0;
    if (bh.seq <= p->last_seq) {
        if (last <= p->last_seq) { /* a resent batch: drop it, give the credit back */
            p->credit += k;
            if (last <= p->acked_seq)
                ingest_reply_ack(g, from, last, (uint32_t)k);
            else
                ingest_reply_credit(g, from, (uint32_t)k);
            IFD_LOG_DEBUG("producer '%s': dropped duplicate batch %" PRId64, p->name, bh.seq);
            return;
        }
        /* a resent message whose first steps were taken before (a resume from a checkpoint
         * written between its steps): the rest are taken, those are not */
        skip = (int)(p->last_seq - bh.seq + 1);
    }
    uint32_t slot = bh.ntensors;
    if (shm && check_slots(p, 0, slot, k, skip, msg, sizeof msg)) {
        reject(g, p, from, k, IFD_EINVAL, bh.seq, msg);
        return;
    }

    host_frames *fr = calloc(1, sizeof *fr);
    host_batch *one = NULL, **hb = &one; /* the step batches (calloc: all NULL) */
    int n = k - skip, made = 0;
    if (fr == NULL || (n > 1 && (hb = calloc((size_t)n, sizeof *hb)) == NULL)) {
        free(fr);
        reject(g, p, from, k, IFD_ENOMEM, bh.seq, "out of memory");
        return;
    }
    int rc = shm ? take_slots(g, fr, p->pool, slot, bh.rows) : take_frames(g, fr, &parts[2]);
    ifd_error e;
    ifd_error_clear(&e);
    /* the whole message is checked as one batch (rows count from its first) */
    ifd_batch whole;
    ifd_batch_init(&whole);
    whole.seq = bh.seq;
    whole.rows = bh.rows;
    whole.ntensors = g->nin;
    if (rc == IFD_OK)
        rc = view_tensors(g, fr, 0, bh.rows, whole.tensors);
    if (rc)
        ifd_error_set(&e, rc, "cannot take the batch: %s", ifd_strerror(rc));
    else
        rc = ifd_infeed_check_batch(prog, &whole,
                                    g->cfg->run.mode == IFD_MODE_PREDICT ? g->batch_rows : bh.rows,
                                    g->cfg->run.mode, &e);
    if (rc == IFD_OK && g->cfg->check_finite)
        rc = ifd_infeed_check_values(prog, &whole, g->cfg->run.mode, g->cfg->max_abs_input, &e);
    int64_t step_rows = k > 1 ? g->batch_rows : bh.rows;
    for (; rc == IFD_OK && made < n; made++) {
        host_batch *b = hb[made] = calloc(1, sizeof *b);
        if (b == NULL) {
            rc = ifd_error_set(&e, IFD_ENOMEM, "out of memory");
            break;
        }
        ifd_batch_init(&b->b);
        b->g = g;
        b->p = p;
        b->pos = p->pos;
        b->slot = shm ? (int)slot + skip + made : -1;
        memcpy(b->name, p->name, sizeof b->name); /* both IFD_PROTO_NAME_MAX + 1, terminated */
        b->b.seq = bh.seq + skip + made;
        b->b.rows = step_rows;
        b->b.flags = bh.flags | (shm && fr->pool->session ? IFD_BATCH_PINNED : 0);
        b->b.replica = p->replica >= 0 ? p->replica : 0;
        b->b.ntensors = g->nin;
        b->b.producer = b->name;
        b->b.release = ingest_host_batch_release;
        b->b.release_arg = b;
        b->b.user = b;
        rc = view_tensors(g, fr, (int64_t)(skip + made) * step_rows, step_rows, b->b.tensors);
        if (rc)
            ifd_error_set(&e, rc, "cannot take the batch: %s", ifd_strerror(rc));
    }
    if (rc) {
        for (int j = 0; j < n; j++)
            free(hb[j]);
        ingest_host_frames_free(fr);
        if (hb != &one)
            free(hb);
        reject(g, p, from, k, rc, bh.seq, ifd_error_text(&e));
        return;
    }
    fr->refs = n;
    if (skip) { /* the steps taken before cost no credit now */
        p->credit += skip;
        ingest_reply_credit(g, from, (uint32_t)skip);
    }
    p->last_seq = last;
    p->in_flight += n;
    p->accepted += n;
    g->accepted += n;
    for (int j = 0; j < n; j++) {
        hb[j]->fr = fr;
        if (shm)
            __atomic_store_n(&fr->pool->busy[hb[j]->slot], hb[j]->b.seq, __ATOMIC_RELEASE);
        if (p->tail)
            p->tail->pnext = hb[j];
        else
            p->head = hb[j];
        p->tail = hb[j];
        ingest_src_push(g, hb[j]);
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
            ingest_host_batch_free(hb);
        }
        if (n && p->rid_len) {
            producer_rid r = ingest_rid_of(p);
            p->credit += (int)n;
            ingest_reply_ack(g, &r, p->acked_seq, n);
        }
    }
}
