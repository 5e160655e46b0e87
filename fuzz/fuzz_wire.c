/*
 * fuzz_wire: the fixed binary headers of core/wire.h and the C client's decoding of daemon
 * replies (clients/c/reply.c: WELCOME, ACK, CREDIT, ERROR, BYE, PREDICTION), without a socket.
 *
 * The input is a script run against one unconnected producer (ifdp_alloc), so that a sequence of
 * replies reaches the states a real stream does:
 *   op byte, op % 4 == 0: ifd_producer_hello starts waiting (ifdp_expect_hello(p, 1));
 *            op % 4 == 1: it stops waiting (ifdp_expect_hello(p, 0));
 *            otherwise:   a reply of 1 + (op / 4) % 8 frames follows, each a 16-bit
 *                         little-endian length and that many bytes (fewer at the input's end).
 * Every frame 0 also goes through ifd_proto_parse_header (and ifd_proto_parse_batch when it is
 * long enough), and the header builders are checked to parse back to what they wrote.
 * Beyond the sanitizers, it aborts when a queued error or a HELLO answer has no sentence, when
 * the producer's counters go negative, or when a PREDICTION hands the callback a tensor whose
 * shape claims more bytes than it holds (the callback reads all of them).
 */
#include "clients/c/producer_internal.h"
#include "core/wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES 8

static size_t dtype_bytes(ifd_dtype dt)
{
#define FUZZ_DTYPE_SIZE_(e, str, size)                                                             \
    if (dt == IFD_##e)                                                                             \
        return size;
    IFD_DTYPE_MAP(FUZZ_DTYPE_SIZE_)
#undef FUZZ_DTYPE_SIZE_
    return 0;
}

/* Reads every byte the tensors' shapes claim. */
static void on_prediction(void *arg, int64_t seq, int64_t rows, int ntensors,
                          const char *const *names, const ifd_tensor *tensors)
{
    (void)arg;
    (void)seq;
    if (rows < 0 || ntensors < 1 || ntensors > IFD_MAX_INPUTS)
        abort();
    volatile uint8_t sink = 0;
    for (int i = 0; i < ntensors; i++) {
        const ifd_tensor *t = &tensors[i];
        if (strlen(names[i]) > 4096 || t->shape.rank < 1 || t->shape.rank > IFD_MAX_RANK ||
            t->shape.dims[0] != rows)
            abort();
        size_t bytes = dtype_bytes(t->dtype);
        for (int d = 0; d < t->shape.rank; d++) {
            if (t->shape.dims[d] < 0 ||
                __builtin_mul_overflow(bytes, (size_t)t->shape.dims[d], &bytes))
                abort(); /* a shape no buffer can hold */
        }
        const uint8_t *p = t->data;
        for (size_t b = 0; b < bytes; b++)
            sink ^= p[b];
    }
    (void)sink;
}

static void check_error(int rc, const ifd_error *err)
{
    if (err->code != rc || err->msg[0] == '\0' || memchr(err->msg, '\0', sizeof err->msg) == NULL)
        abort();
}

static void headers(const ifd_frame *f0)
{
    ifd_proto_header_info h;
    char why[256];
    why[0] = '\0';
    if (ifd_proto_parse_header(f0->data, f0->size, &h, why, sizeof why) != 0) {
        if (why[0] == '\0')
            abort();
    } else if (h.version != IFD_PROTOCOL_VERSION) {
        abort();
    }
    if (f0->size >= IFD_PROTO_BATCH_HDR) {
        ifd_proto_batch b;
        ifd_proto_parse_batch(f0->data, &b);
        /* What ifd_proto_prediction writes parses back the same. */
        uint8_t buf[IFD_PROTO_BATCH_HDR];
        ifd_proto_batch again;
        ifd_proto_prediction(buf, b.seq, b.rows, b.ntensors);
        ifd_proto_parse_batch(buf, &again);
        if (ifd_proto_parse_header(buf, sizeof buf, &h, why, sizeof why) != 0 ||
            h.type != IFD_MSG_PREDICTION || again.seq != b.seq || again.rows != b.rows ||
            again.ntensors != b.ntensors || again.flags != 0)
            abort();
    }
    if (f0->size >= IFD_PROTO_ACK_HDR) {
        const uint8_t *p = f0->data;
        uint8_t buf[IFD_PROTO_ACK_HDR];
        int64_t seq = (int64_t)ifd_get_u64(p + 8);
        uint32_t credit = ifd_get_u32(p + 16);
        if (ifd_proto_ack(buf, seq, credit) != IFD_PROTO_ACK_HDR ||
            (int64_t)ifd_get_u64(buf + 8) != seq || ifd_get_u32(buf + 16) != credit ||
            ifd_proto_credit(buf, credit) != IFD_PROTO_CREDIT_HDR ||
            ifd_get_u32(buf + 8) != credit || ifd_get_u16(buf + 6) != IFD_MSG_CREDIT)
            abort();
        int c = ifd_proto_auto_credit((size_t)ifd_get_u64(p + 8));
        if (c < 8 || c > 256)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ifd_producer *p;
    ifd_error err;
    if (ifdp_alloc(&p, "tcp://127.0.0.1:1", "fuzz", &err) != IFD_OK)
        abort();
    ifd_producer_on_prediction(p, on_prediction, NULL);
    static const uint8_t empty[1];
    size_t at = 0;
    while (at < size) {
        uint8_t op = data[at++];
        if (op % 4 == 0) {
            ifdp_expect_hello(p, 1);
            continue;
        }
        if (op % 4 == 1) {
            ifdp_expect_hello(p, 0);
            continue;
        }
        ifd_frame frames[MAX_FRAMES];
        int n = 1 + (op / 4) % MAX_FRAMES;
        for (int i = 0; i < n; i++) {
            size_t len = 0;
            if (at + 2 <= size)
                len = ifd_get_u16(data + at);
            at = at + 2 <= size ? at + 2 : size;
            if (len > size - at)
                len = size - at;
            /* Each frame in its own block of exactly len bytes, so ASan sees a read past it. */
            uint8_t *copy = malloc(len ? len : 1);
            if (copy == NULL)
                abort();
            memcpy(copy, len ? data + at : empty, len);
            frames[i].data = copy;
            frames[i].size = len;
            at += len;
        }
        headers(&frames[0]);
        ifdp_on_reply(p, frames, n);
        for (int i = 0; i < n; i++)
            free((void *)frames[i].data);

        ifd_error_clear(&err);
        int rc = ifdp_hello_answer(p, &err);
        if (rc > 0)
            check_error(rc, &err);
        if (ifd_producer_in_flight(p) < 0 || ifd_producer_available(p) < 0 ||
            ifd_producer_acked(p) < 0 || ifd_producer_rejected(p) < 0 ||
            ifd_producer_predictions(p) < 0)
            abort();
    }
    for (;;) {
        ifd_error_clear(&err);
        int rc = ifdp_pop_error(p, &err);
        if (rc == IFD_OK)
            break;
        check_error(rc, &err);
    }
    const char *w = ifd_producer_welcome(p);
    if (w && strlen(w) > size)
        abort();
    ifd_producer_destroy(p);
    return 0;
}
