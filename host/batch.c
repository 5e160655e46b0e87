#include "host/ingest_internal.h"

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

static void reject(ifd_ingest *g, producer *p, const producer_rid *from, int code, int64_t seq,
                   const char *msg)
{
    p->credit++;
    p->rejected++;
    g->rejected++;
    ingest_send_error(g, from, code, seq, 1, "batch %" PRId64 " from producer '%s': %s", seq,
                      p->name, msg);
}

void ingest_handle_batch(ifd_ingest *g, const producer_rid *from, zmq_msg_t *parts, int nparts,
                         int total)
{
    zmq_msg_t *hdr = &parts[1];
    producer *p = ingest_find_by_rid(g, from);
    size_t hlen = zmq_msg_size(hdr);
    if (hlen < IFD_PROTO_BATCH_HDR) {
        ingest_send_error(g, from, IFD_EPROTO, NO_SEQ, 0,
                          "BATCH header: expected %d bytes (seq, rows, flags, ntensors), got %zu",
                          IFD_PROTO_BATCH_HDR, hlen);
        return;
    }
    ifd_proto_batch bh;
    ifd_proto_parse_batch(zmq_msg_data(hdr), &bh);
    if (p == NULL || !p->welcomed) {
        ingest_send_error(g, from, IFD_EPROTO, bh.seq, 0,
                          "BATCH %" PRId64 " before HELLO: send HELLO with the schema first",
                          bh.seq);
        return;
    }
    /* From here on a rejection returns the credit the producer spent on the batch. */
    if (p->ended || g->input_closed) {
        ingest_send_error(g, from, IFD_ECLOSED, bh.seq, 1,
                          "batch %" PRId64 " from producer '%s': %s", bh.seq, p->name,
                          g->input_closed ? "the input has ended; no more batches are taken"
                                          : "the producer sent END; send HELLO to start again");
        return;
    }
    if (p->credit <= 0) { /* the producer counted a credit it did not have: give it back */
        ingest_send_error(g, from, IFD_EPROTO, bh.seq, 1,
                          "batch %" PRId64
                          " from producer '%s': no credit left (%d batches in flight, "
                          "credit %d): wait for an ACK",
                          bh.seq, p->name, p->in_flight, g->credit);
        return;
    }
    p->credit--;
    char msg[IFD_ERROR_MSG_MAX];
    const ifd_program *prog = g->program;
    int nframes = total - 2;
    if (bh.ntensors != (uint32_t)nframes) {
        snprintf(msg, sizeof msg, "header ntensors says %" PRIu32 ", but %d frames follow",
                 bh.ntensors, nframes);
        reject(g, p, from, IFD_EPROTO, bh.seq, msg);
        return;
    }
    if (nframes != g->nin) {
        snprintf(msg, sizeof msg, "expected %d tensor frames (the schema's tensors), got %d",
                 g->nin, nframes);
        reject(g, p, from, IFD_ESHAPE, bh.seq, msg);
        return;
    }
    if (bh.flags != 0) {
        snprintf(msg, sizeof msg, "flags: expected 0 in %s mode, got 0x%" PRIx32,
                 ifd_mode_name(g->cfg->run.mode), bh.flags);
        reject(g, p, from, IFD_EINVAL, bh.seq, msg);
        return;
    }
    int predict = g->cfg->run.mode == IFD_MODE_PREDICT;
    if (predict ? bh.rows < 1 || bh.rows > g->batch_rows : bh.rows != g->batch_rows) {
        char per[96] = "the batch size";
        if (g->cfg->run.input_mode != IFD_INPUT_PER_HOST)
            snprintf(per, sizeof per, "%s input: batch_size %" PRId64 " / %d replicas",
                     ifd_input_mode_name(g->cfg->run.input_mode), g->cfg->run.batch_size,
                     g->cfg->run.replicas);
        snprintf(msg, sizeof msg, "rows: expected %s%" PRId64 " (%s%s), got %" PRId64,
                 predict ? "1 to " : "", g->batch_rows, per,
                 predict ? "; predict mode pads a partial batch" : "", bh.rows);
        reject(g, p, from, IFD_ESHAPE, bh.seq, msg);
        return;
    }
    for (int i = 0; i < nframes; i++) {
        const ifd_input_spec *in = g->in[i];
        size_t row = ifd_dtype_size(in->dtype);
        for (int d = 0; d < in->rank; d++)
            row *= (size_t)in->dims[d];
        size_t want = row * (size_t)bh.rows, got = zmq_msg_size(&parts[2 + i]);
        if (got != want) {
            char shape[96];
            snprintf(msg, sizeof msg,
                     "tensor '%s' is %zu bytes, expected %zu (%" PRId64 " rows of %s %s)", in->name,
                     got, want, bh.rows,
                     ingest_dims_format(in->rank, in->dims, shape, sizeof shape),
                     ifd_dtype_name(in->dtype));
            reject(g, p, from, IFD_ESHAPE, bh.seq, msg);
            return;
        }
    }
    if (bh.seq < 0) {
        snprintf(msg, sizeof msg, "seq: expected an integer >= 0, got %" PRId64, bh.seq);
        reject(g, p, from, IFD_EINVAL, bh.seq, msg);
        return;
    }
    if (bh.seq <= p->last_seq) { /* a resent batch: drop it, give the credit back */
        p->credit++;
        if (bh.seq <= p->acked_seq)
            ingest_send_credit_msg(g, from, IFD_MSG_ACK, bh.seq);
        else
            ingest_send_credit_msg(g, from, IFD_MSG_CREDIT, 0);
        IFD_LOG_DEBUG("producer '%s': dropped duplicate batch %" PRId64, p->name, bh.seq);
        return;
    }

    host_batch *hb = calloc(1, sizeof *hb);
    if (hb == NULL) {
        reject(g, p, from, IFD_ENOMEM, bh.seq, "out of memory");
        return;
    }
    ifd_batch_init(&hb->b);
    hb->g = g;
    hb->p = p;
    hb->pos = p->pos;
    snprintf(hb->name, sizeof hb->name, "%s", p->name);
    hb->b.seq = bh.seq;
    hb->b.rows = bh.rows;
    hb->b.flags = bh.flags;
    hb->b.replica = p->replica >= 0 ? p->replica : 0;
    hb->b.ntensors = nframes;
    hb->b.producer = hb->name;
    hb->b.release = ingest_host_batch_release;
    hb->b.release_arg = hb;
    hb->b.user = hb;
    int rc = IFD_OK;
    for (int i = 0; i < nframes && rc == IFD_OK; i++) {
        const ifd_input_spec *in = g->in[i];
        zmq_msg_init(&hb->frames[i]);
        zmq_msg_move(&hb->frames[i], &parts[2 + i]);
        hb->nframes = i + 1;
        void *data = zmq_msg_data(&hb->frames[i]);
        size_t size = zmq_msg_size(&hb->frames[i]);
        size_t align = ifd_dtype_size(in->dtype);
        if ((uintptr_t)data % align != 0) { /* libzmq packed a small frame unaligned */
            hb->copies[i] = aligned_alloc(64, (size + 63) / 64 * 64);
            if (hb->copies[i] == NULL) {
                rc = IFD_ENOMEM;
                break;
            }
            memcpy(hb->copies[i], data, size);
            data = hb->copies[i];
            g->copied_bytes += (int64_t)size;
        }
        int64_t dims[IFD_MAX_RANK + 1];
        dims[0] = bh.rows;
        for (int d = 0; d < in->rank; d++)
            dims[d + 1] = in->dims[d];
        rc = ifd_tensor_init(&hb->b.tensors[i], in->dtype, in->rank + 1, dims, data);
    }
    ifd_error e;
    ifd_error_clear(&e);
    if (rc)
        ifd_error_set(&e, rc, "cannot take the batch: %s", ifd_strerror(rc));
    else
        rc = ifd_infeed_check_batch(prog, &hb->b, g->batch_rows, g->cfg->run.mode, &e);
    if (rc == IFD_OK && g->cfg->check_finite)
        rc = ifd_infeed_check_values(prog, &hb->b, g->cfg->run.mode, g->cfg->max_abs_input, &e);
    (void)nparts;
    if (rc) {
        ingest_host_batch_free(hb);
        reject(g, p, from, rc, bh.seq, ifd_error_text(&e));
        return;
    }
    p->last_seq = bh.seq;
    p->in_flight++;
    p->accepted++;
    g->accepted++;
    if (p->tail)
        p->tail->pnext = hb;
    else
        p->head = hb;
    p->tail = hb;
    ingest_src_push(g, hb);
}

/* ---- ACKs, summaries, control --------------------------------------------------------------- */

/* PREDICTION: header, the tensors' description, one raw frame per tensor. */
static void send_prediction(ifd_ingest *g, producer *p, const prediction_msg *m)
{
    producer_rid r = ingest_rid_of(p);
    int rc = zmq_send(g->router, r.rid, r.len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (rc >= 0)
        rc = zmq_send(g->router, m->hdr, sizeof m->hdr, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (rc >= 0)
        rc = zmq_send(g->router, m->json, strlen(m->json), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    for (int i = 0; rc >= 0 && i < m->ntensors; i++)
        rc = zmq_send(g->router, m->data[i], m->len[i],
                      (i + 1 < m->ntensors ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
    if (rc < 0)
        IFD_LOG_WARN("ingest: a PREDICTION for producer '%s' was not sent: %s", p->name,
                     zmq_strerror(zmq_errno()));
}

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
            if (hb->pred && p->rid_len)
                send_prediction(g, p, hb->pred);
            ingest_host_batch_free(hb);
        }
        if (n && p->rid_len) {
            producer_rid r = ingest_rid_of(p);
            p->credit += (int)n;
            uint8_t hdr[IFD_PROTO_ACK_HDR];
            ingest_send_parts(g, &r, hdr, ifd_proto_ack(hdr, p->acked_seq, n), NULL);
        }
    }
}
