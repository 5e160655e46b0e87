/*
 * Sending: BATCH with credit, and the calls that wait for ACKs, END and BYE. Replies are drained
 * without waiting after every send, so the credit count stays current.
 */
#include <infeed/client.h>

#include "clients/c/producer_impl.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ---- BATCH -------------------------------------------------------------------------------- */

/* The steps a batch of `rows` carries (train, eval: k x batch_size rows, k up to WELCOME's
 * max_steps_per_message), which is the credit it costs; 1 for other rows, which the daemon
 * refuses or takes as one batch. */
int64_t ifdp_batch_steps(const ifd_producer *p, int64_t rows)
{
    if (p->max_steps > 1 && p->batch_size > 0 && strcmp(p->mode, "predict") != 0 &&
        rows > p->batch_size && rows % p->batch_size == 0 && rows / p->batch_size <= p->max_steps)
        return rows / p->batch_size;
    return 1;
}

static int check_send(const ifd_producer *p, int64_t rows, const ifd_frame *frames, int n,
                      ifd_error *err)
{
    if (n < 1 || n > IFD_MAX_INPUTS || frames == NULL)
        return ifd_error_set(err, IFD_EINVAL, "send: expected 1 to %d frames, got %d",
                             IFD_MAX_INPUTS, n);
    if (rows < 0)
        return ifd_error_set(err, IFD_EINVAL, "send: rows: expected >= 0, got %lld",
                             (long long)rows);
    for (int i = 0; i < n; i++)
        if (frames[i].data == NULL && frames[i].size > 0)
            return ifd_error_set(err, IFD_EINVAL, "send: frame %d: NULL data of %zu bytes", i,
                                 frames[i].size);
    if (!p->welcomed)
        return ifd_error_set(err, IFD_EINVAL, "send: no WELCOME yet: call ifd_producer_hello");
    return IFD_OK;
}

int ifdp_wait_send(ifd_producer *p, int64_t steps, int need_slots, int *slot, int timeout_ms,
                   ifd_error *err)
{
    int64_t now = ifdw_now_ns();
    int rc;
    if (now - p->drained_ns >= IFDP_DRAIN_EVERY_NS || p->available < steps) {
        if ((rc = ifdp_drain(p, err)))
            return rc;
        p->drained_ns = now;
    }
    int64_t deadline = ifdw_deadline(timeout_ms);
    for (;;) {
        if ((rc = ifdp_pop_error(p, err)))
            return rc;
        if (p->bye_json)
            return ifd_error_set(err, IFD_ECLOSED, "send: %s", p->bye_text);
        if (p->end_sent)
            return ifd_error_set(err, IFD_ECLOSED, "send: the stream was ended (END sent)");
        int has_credit = p->available >= steps;
        if (has_credit && need_slots == 0)
            return IFD_OK;
        if (has_credit && (*slot = ifdp_slots_find(&p->pool.slots, need_slots)) >= 0)
            return IFD_OK;
        long left = ifdw_left_ms(deadline);
        if (left == 0 && !has_credit)
            return ifd_error_set(err, IFD_ETIMEDOUT,
                                 "send: no credit within %d ms (%lld batches in flight)",
                                 timeout_ms, (long long)p->in_flight);
        if (left == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT,
                                 "send: no %d free slots in a row in the shared-memory pool "
                                 "within %d ms (%d of its %d slots in flight or reserved)",
                                 need_slots, timeout_ms, ifdp_slots_busy(&p->pool.slots),
                                 p->pool.slots.n);
        rc = ifdp_recv_one(p, left, err);
        if (rc && rc != IFD_ETIMEDOUT)
            return rc;
    }
}

/* Checks that a batch may go and waits for credit. IFD_OK when it may be sent now. */
static int before_send(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n,
                       int timeout_ms, ifd_error *err)
{
    int rc = check_send(p, rows, frames, n, err);
    if (rc)
        return rc;
    return ifdp_wait_send(p, ifdp_batch_steps(p, rows), 0, NULL, timeout_ms, err);
}

static void batch_header(ifd_producer *p, unsigned char *h, int64_t rows, int n)
{
    ifd_proto_header(h, IFD_MSG_BATCH);
    ifd_put_u64(h + 8, (uint64_t)p->next_seq);
    ifd_put_u64(h + 16, (uint64_t)rows);
    ifd_put_u32(h + 24, 0);
    ifd_put_u32(h + 28, (uint32_t)n);
}

int ifdp_send_header(ifd_producer *p, const unsigned char *h, int more, int timeout_ms,
                     ifd_error *err)
{
    int64_t deadline = ifdw_deadline(timeout_ms);
    while (zmq_send(p->sock, h, IFD_PROTO_BATCH_HDR, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
        if (errno != EAGAIN && errno != EINTR)
            return ifdw_zmq_error(err, "send: BATCH header");
        long left = ifdw_left_ms(deadline);
        if (left == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT,
                                 "send: the socket took no message within %d ms (is the daemon "
                                 "at %s up?)",
                                 timeout_ms, p->endpoint);
        zmq_pollitem_t it = {p->sock, 0, ZMQ_POLLOUT, 0};
        if (zmq_poll(&it, 1, left) < 0 && errno != EINTR)
            return ifdw_zmq_error(err, "send: zmq_poll");
    }
    return IFD_OK;
}

int ifdp_after_send(ifd_producer *p, int64_t rows, ifd_error *err)
{
    int64_t k = ifdp_batch_steps(p, rows); /* step j of it is batch next_seq + j */
    p->next_seq += k;
    p->available -= k;
    p->in_flight += k;
    p->sent += k;
    /* Replies are read by the next call, which drains them before anything else (a send's
     * ifdp_wait_send, a wait): draining here too cost a second receive that ends on EAGAIN, one
     * more poll of libzmq's mailbox a batch (bench_ingest at 4 KiB: 2.08 -> 1.0 a batch). */
    (void)err;
    return IFD_OK;
}

int ifd_producer_send(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n, int timeout_ms,
                      ifd_error *err)
{
    int rc = check_send(p, rows, frames, n, err);
    if (rc || ifdp_shm_send(p, rows, frames, n, timeout_ms, &rc, err))
        return rc;
    if ((rc = ifdp_wait_send(p, ifdp_batch_steps(p, rows), 0, NULL, timeout_ms, err)))
        return rc;
    unsigned char h[IFD_PROTO_BATCH_HDR];
    batch_header(p, h, rows, n);
    if ((rc = ifdp_send_header(p, h, 1, timeout_ms, err)))
        return rc;
    for (int i = 0; i < n; i++)
        if (zmq_send(p->sock, frames[i].data, frames[i].size, i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return ifdw_zmq_error(err, "send: tensor frame");
    return ifdp_after_send(p, rows, err);
}

int ifd_producer_send_tensors(ifd_producer *p, const ifd_tensor *tensors, int n, int timeout_ms,
                              ifd_error *err)
{
    ifd_frame frames[IFD_MAX_INPUTS];
    if (n < 1 || n > IFD_MAX_INPUTS || tensors == NULL)
        return ifd_error_set(err, IFD_EINVAL, "send: expected 1 to %d tensors, got %d",
                             IFD_MAX_INPUTS, n);
    int64_t rows = -1;
    for (int i = 0; i < n; i++) {
        const ifd_tensor *t = &tensors[i];
        size_t esize = 0;
#define IFDP_SIZE_CASE_(e, str, size)                                                              \
    if (t->dtype == IFD_##e)                                                                       \
        esize = size;
        IFD_DTYPE_MAP(IFDP_SIZE_CASE_)
#undef IFDP_SIZE_CASE_
        if (esize == 0 || t->shape.rank < 1 || t->shape.rank > IFD_MAX_RANK)
            return ifd_error_set(err, IFD_EINVAL,
                                 "send: tensor %d: expected a known dtype and rank >= 1", i);
        if (i == 0)
            rows = t->shape.dims[0];
        else if (t->shape.dims[0] != rows)
            return ifd_error_set(err, IFD_ESHAPE,
                                 "send: tensor %d has %lld rows, tensor 0 has %lld", i,
                                 (long long)t->shape.dims[0], (long long)rows);
        size_t bytes = esize;
        for (int d = 0; d < t->shape.rank; d++)
            bytes *= (size_t)t->shape.dims[d];
        frames[i].data = t->data;
        frames[i].size = bytes;
    }
    return ifd_producer_send(p, rows, frames, n, timeout_ms, err);
}

int ifd_producer_send_zc(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n,
                         ifd_free_fn free_fn, void *hint, int timeout_ms, ifd_error *err)
{
    zmq_msg_t msgs[IFD_MAX_INPUTS];
    int made = 0, sent = 0, rc;
    if (p->pool.base) {
        /* The bytes are copied into the pool (or by libzmq, for a batch the pool cannot hold),
         * so the caller's buffers are free as soon as this returns. */
        rc = ifd_producer_send(p, rows, frames, n, timeout_ms, err);
        goto release;
    }
    rc = before_send(p, rows, frames, n, timeout_ms, err);
    if (rc)
        goto release;
    for (; made < n; made++)
        if (zmq_msg_init_data(&msgs[made], (void *)frames[made].data, frames[made].size, free_fn,
                              hint) != 0) {
            rc = ifdw_zmq_error(err, "send: zmq_msg_init_data");
            goto release;
        }
    unsigned char h[IFD_PROTO_BATCH_HDR];
    batch_header(p, h, rows, n);
    if ((rc = ifdp_send_header(p, h, 1, timeout_ms, err)))
        goto release;
    for (; sent < n; sent++)
        if (zmq_msg_send(&msgs[sent], p->sock, sent + 1 < n ? ZMQ_SNDMORE : 0) < 0) {
            rc = ifdw_zmq_error(err, "send: tensor frame");
            goto release;
        }
    return ifdp_after_send(p, rows, err);

release:
    /* Every frame's free_fn runs exactly once: libzmq's for messages it holds, here for the
     * rest. */
    for (int i = sent; i < made; i++)
        zmq_msg_close(&msgs[i]);
    if (free_fn)
        for (int i = made; i < n && frames; i++)
            free_fn((void *)frames[i].data, hint);
    return rc;
}

/* ---- waiting, END, BYE -------------------------------------------------------------------- */

/* Waits until every batch is ACKed or rejected, BYE comes, or an ERROR comes. */
static int wait_acks(ifd_producer *p, const char *what, int timeout_ms, ifd_error *err)
{
    int64_t deadline = ifdw_deadline(timeout_ms);
    int rc;
    for (;;) {
        if ((rc = ifdp_pop_error(p, err)))
            return rc;
        if (p->in_flight == 0)
            return IFD_OK;
        if (p->bye_json)
            return ifd_error_set(err, IFD_ECLOSED, "%s: %s (%lld batches not acknowledged)", what,
                                 p->bye_text, (long long)p->in_flight);
        long left = ifdw_left_ms(deadline);
        if (left == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT,
                                 "%s: %lld batches still unacknowledged after %d ms", what,
                                 (long long)p->in_flight, timeout_ms);
        rc = ifdp_recv_one(p, left, err);
        if (rc && rc != IFD_ETIMEDOUT)
            return rc;
    }
}

int ifd_producer_wait(ifd_producer *p, int timeout_ms, ifd_error *err)
{
    int rc = ifdp_drain(p, err);
    if (rc)
        return rc;
    return wait_acks(p, "wait", timeout_ms, err);
}

int ifd_producer_end(ifd_producer *p, int timeout_ms, ifd_error *err)
{
    if (!p->welcomed)
        return ifd_error_set(err, IFD_EINVAL, "end: no WELCOME yet: call ifd_producer_hello");
    int rc = ifdp_drain(p, err);
    if (rc)
        return rc;
    if (!p->end_sent) {
        if ((rc = ifdp_pop_error(p, err)))
            return rc;
        if (p->bye_json == NULL) {
            unsigned char h[IFD_PROTO_HDR];
            ifd_proto_header(h, IFD_MSG_END);
            if (zmq_send(p->sock, h, sizeof h, 0) < 0)
                return ifdw_zmq_error(err, "end: sending END");
        }
        p->end_sent = 1;
    }
    rc = wait_acks(p, "end", timeout_ms, err);
    if (rc == IFD_ECLOSED && p->bye_json)
        rc = IFD_OK; /* the run ended first: the BYE decides */
    if (rc == IFD_OK && p->bye_json && !p->bye_ok)
        rc = ifd_error_set(err, IFD_ESTOPPED, "end: %s", p->bye_text);
    return rc;
}

int ifd_producer_bye(ifd_producer *p, int timeout_ms, const char **json, ifd_error *err)
{
    int64_t deadline = ifdw_deadline(timeout_ms);
    while (p->bye_json == NULL) {
        long left = ifdw_left_ms(deadline);
        if (left == 0)
            return ifd_error_set(err, IFD_ETIMEDOUT, "bye: no BYE from %s within %d ms",
                                 p->endpoint, timeout_ms);
        int rc = ifdp_recv_one(p, left, err);
        if (rc && rc != IFD_ETIMEDOUT)
            return rc;
    }
    if (json)
        *json = p->bye_json;
    return IFD_OK;
}
