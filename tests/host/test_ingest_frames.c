/*
 * A BATCH's frames through the ZeroMQ transport (host/ingest/zmq_transport.c), with messages
 * handed to the ingest as the I/O thread would (no connection): a frame aligned for its dtype is
 * read where libzmq put it, an unaligned one is copied (aligned); the step batches carry exactly
 * the bytes sent; and the frame holders, freed when their batches are acknowledged, are reused
 * for the next messages, at most the credit's worth of them kept; the alignment copies' buffers
 * are kept for the next copy of their tensor and size (at most the credit's worth, dropped when
 * the size changes). Shapes, values, credit, alignment and sizes are random; the seed is in every
 * failure.
 */
#include "host/ingest/zmq_transport.h"
#include "tests/util/testutil.h"

#include "core/log.h"
#include "core/wire.h"
#include <infeed/program.h>

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct t {
    ifd_rng rng;
    ifd_daemon_config cfg;
    ifd_program program;
    ifd_ingest *g;
} t;

static void setup(t *x)
{
    static int n;
    static char listen[64];
    seed_rng(&x->rng);
    ifd_log_set_level(IFD_LOG_ERROR);
    ifd_daemon_config_defaults(&x->cfg);
    snprintf(listen, sizeof listen, "inproc://test-ingest-frames-%d", n++);
    x->cfg.listen = listen;
    x->cfg.publish = "";
    x->cfg.control = "";
    x->cfg.run.program = "softmax";
    x->cfg.run.settings.features = rand_between(&x->rng, 1, 40);
    x->cfg.run.settings.classes = rand_between(&x->rng, 2, 9);
    x->cfg.run.batch_size = rand_between(&x->rng, 1, 16);
    x->cfg.max_steps_per_message = 1;
    x->cfg.credit = (int)rand_between(&x->rng, 2, 24);
    ifd_error err;
    RC_OK(ifd_program_init(&x->program, "softmax", &x->cfg.run.settings, &err), err);
    RC_OK(ifd_ingest_create(&x->g, &x->cfg, NULL, &err), err);
    ingest_attach_program(x->g, &x->program);
}

static void teardown(t *x)
{
    ifd_ingest_destroy(x->g);
    ifd_program_free(&x->program);
}

/* A message from connection "c1": its frames' bytes (copied into libzmq's messages, except the
 * tensors when `at` gives their bytes: those are sent in place, as libzmq's zero-copy receive
 * leaves them). */
static void send_msg(t *x, const void **bytes, const size_t *len, int n)
{
    zmq_msg_t parts[MAX_PARTS];
    zmq_msg_init_size(&parts[0], 2);
    memcpy(zmq_msg_data(&parts[0]), "c1", 2);
    for (int i = 0; i < n; i++) {
        if (i >= 1) { /* a tensor: in place */
            zmq_msg_init_data(&parts[i + 1], (void *)bytes[i], len[i], NULL, NULL);
        } else {
            zmq_msg_init_size(&parts[i + 1], len[i]);
            memcpy(zmq_msg_data(&parts[i + 1]), bytes[i], len[i]);
        }
    }
    ingest_handle_message(x->g, parts, n + 1, n + 1);
    for (int i = 0; i < n + 1; i++)
        zmq_msg_close(&parts[i]);
    ingest_fifo_flush(x->g);
}

START_TEST(frames_are_kept_or_copied_aligned_and_their_holders_reused)
{
    t x;
    setup(&x);
    uint8_t hdr[IFD_PROTO_HDR];
    ifd_proto_header(hdr, IFD_MSG_HELLO);
    const char *hello = "{\"name\": \"p\"}";
    zmq_msg_t parts[3];
    zmq_msg_init_size(&parts[0], 2);
    memcpy(zmq_msg_data(&parts[0]), "c1", 2);
    zmq_msg_init_size(&parts[1], IFD_PROTO_HDR);
    memcpy(zmq_msg_data(&parts[1]), hdr, IFD_PROTO_HDR);
    zmq_msg_init_size(&parts[2], strlen(hello));
    memcpy(zmq_msg_data(&parts[2]), hello, strlen(hello));
    ingest_handle_message(x.g, parts, 3, 3);
    for (int i = 0; i < 3; i++)
        zmq_msg_close(&parts[i]);
    ck_assert_int_eq(x.g->producers[0].welcomed, 1);

    int64_t rows = x.cfg.run.batch_size, d = x.cfg.run.settings.features;
    size_t xbytes = (size_t)(rows * d) * sizeof(float), ybytes = (size_t)rows * sizeof(int32_t);
    int credit = x.g->pr.credit;
    /* each batch's tensors, 1 byte past an aligned start half the time */
    char **xbuf = calloc((size_t)credit, sizeof *xbuf),
         **ybuf = calloc((size_t)credit, sizeof *ybuf);
    int *off = calloc((size_t)credit, sizeof *off);
    for (int i = 0; i < credit; i++) {
        xbuf[i] = aligned_alloc(64, (xbytes + 64) / 64 * 64 + 64);
        ybuf[i] = aligned_alloc(64, (ybytes + 64) / 64 * 64 + 64);
    }
    host_frames *seen[64];
    int nseen = 0;
    int64_t seq = 0;
    for (int round = 0; round < 8; round++) {
        int n = (int)rand_between(&x.rng, 1, credit);
        for (int i = 0; i < n; i++) {
            off[i] = rand_between(&x.rng, 0, 1) ? 1 : 0;
            float *xv = (float *)(xbuf[i] + off[i]);
            int32_t *yv = (int32_t *)(ybuf[i] + off[i]);
            for (int64_t j = 0; j < rows * d; j++) {
                float v = (float)rand_between(&x.rng, -1000, 1000) / 8.0f;
                memcpy(&xv[j], &v, sizeof v); /* may be unaligned */
            }
            for (int64_t j = 0; j < rows; j++) {
                int32_t v = (int32_t)rand_between(&x.rng, 0, x.cfg.run.settings.classes - 1);
                memcpy(&yv[j], &v, sizeof v);
            }
            uint8_t bh[IFD_PROTO_BATCH_HDR];
            ifd_proto_header(bh, IFD_MSG_BATCH);
            ifd_put_u64(bh + 8, (uint64_t)(seq + i));
            ifd_put_u64(bh + 16, (uint64_t)rows);
            ifd_put_u32(bh + 24, 0);
            ifd_put_u32(bh + 28, 2);
            send_msg(&x, (const void *[]){bh, xv, yv},
                     (size_t[]){IFD_PROTO_BATCH_HDR, xbytes, ybytes}, 3);
        }
        ck_assert_int_eq(x.g->fifo.lanes[0].len, (size_t)n);
        ifd_batch_source src = ifd_ingest_source(x.g);
        ifd_batch *b;
        ifd_error err;
        for (int i = 0; i < n; i++) {
            ck_assert_int_eq(src.ops->try_next(src.ctx, &b, &err), IFD_OK);
            ck_assert_int_eq(b->seq, seq + i);
            const char *xs = xbuf[i] + off[i], *ys = ybuf[i] + off[i];
            const char *xd = b->tensors[0].data, *yd = b->tensors[1].data;
            ck_assert_int_eq(memcmp(xd, xs, xbytes), 0);
            ck_assert_int_eq(memcmp(yd, ys, ybytes), 0);
            ck_assert_uint_eq((uintptr_t)xd % sizeof(float), 0);
            ck_assert_uint_eq((uintptr_t)yd % sizeof(int32_t), 0);
            /* aligned: read in place; unaligned: a copy */
            ck_assert_int_eq(xd == xs, off[i] == 0);
            ck_assert_int_eq(yd == ys, off[i] == 0);
            host_frames *fr = ((host_batch *)b->user)->fr;
            int known = 0;
            for (int q = 0; q < nseen; q++)
                known |= seen[q] == fr;
            if (!known && nseen < 64)
                seen[nseen++] = fr;
            b->release(b, b->release_arg);
        }
        ingest_send_acks(x.g);
        ck_assert_int_eq(x.g->producers[0].acked_seq, seq + n - 1);
        ck_assert_int_le(x.g->sock.nframes_spare, credit);
        ck_assert_int_ge(x.g->sock.nframes_spare, n);
        seq += n;
    }
    /* never more holders than messages in flight at once: the credit */
    ck_assert_int_le(nseen, credit);
    teardown(&x);
    for (int i = 0; i < credit; i++) {
        free(xbuf[i]);
        free(ybuf[i]);
    }
    free(xbuf);
    free(ybuf);
    free(off);
}
END_TEST

/* A model of a tensor's spares: the buffers kept, newest last, and their size. */
typedef struct spare_model {
    void *kept[64];
    int n;
    size_t size;
} spare_model;

START_TEST(copies_reuse_the_freed_buffers_of_their_tensor_and_size)
{
    t x;
    setup(&x);
    ifd_ingest *g = x.g;
    int credit = g->pr.credit;
    ck_assert_int_le(credit, 64); /* the model's kept[] */
    enum { LIVE_MAX = 48 };
    struct {
        void *p;
        int i;
        size_t len;
        unsigned char seed;
    } live[LIVE_MAX];
    int nlive = 0;
    spare_model m[2] = {{{0}, 0, 0}, {{0}, 0, 0}};
    /* each tensor's sizes: two, one of them rarely */
    size_t sizes[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            sizes[i][j] = (size_t)rand_between(&x.rng, 1, 9000);
    unsigned char src[9000];
    for (int op = 0; op < 3000; op++) {
        int copy = nlive == 0 || (nlive < LIVE_MAX && rand_between(&x.rng, 0, 1));
        if (copy) {
            int i = (int)rand_between(&x.rng, 0, 1);
            size_t len = sizes[i][rand_between(&x.rng, 0, 15) == 0];
            unsigned char seed = (unsigned char)rand_between(&x.rng, 0, 255);
            for (size_t b = 0; b < len; b++)
                src[b] = (unsigned char)(seed + b);
            if (len != m[i].size) { /* a new size: the old one's spares go */
                m[i].n = 0;
                m[i].size = len;
            }
            void *want = m[i].n ? m[i].kept[--m[i].n] : NULL;
            void *c = ingest_copy_aligned(g, i, src, len);
            ck_assert_ptr_nonnull(c);
            if (want)
                ck_assert_ptr_eq(c, want); /* the newest spare of its size */
            ck_assert_uint_eq((uintptr_t)c % _Alignof(max_align_t), 0);
            ck_assert_int_eq(memcmp(c, src, len), 0);
            live[nlive].p = c;
            live[nlive].i = i;
            live[nlive].len = len;
            live[nlive].seed = seed;
            nlive++;
        } else {
            int q = (int)rand_between(&x.rng, 0, nlive - 1);
            const unsigned char *c = live[q].p;
            for (size_t b = 0; b < live[q].len; b += 97) /* untouched while in use */
                ck_assert_uint_eq(c[b], (unsigned char)(live[q].seed + b));
            spare_model *mi = &m[live[q].i];
            if (live[q].len == mi->size && mi->n < credit) /* credit <= 24: kept[] holds it */
                mi->kept[mi->n++] = live[q].p;
            ingest_copy_free(g, live[q].i, live[q].p, live[q].len);
            live[q] = live[--nlive];
        }
        for (int i = 0; i < 2; i++) {
            ck_assert_int_eq(g->copy_spare[i].n, m[i].n);
            ck_assert_int_le(g->copy_spare[i].n, credit);
        }
    }
    while (nlive > 0) {
        nlive--;
        ingest_copy_free(g, live[nlive].i, live[nlive].p, live[nlive].len);
    }
    teardown(&x); /* frees the spares (ASan: no leak) */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ingest_frames");
    TCase *tc = tu_tcase(s, "frames", 30);
    tcase_add_loop_test(tc, frames_are_kept_or_copied_aligned_and_their_holders_reused, 0, 10);
    tcase_add_loop_test(tc, copies_reuse_the_freed_buffers_of_their_tensor_and_size, 0, 10);
    return tu_run_suite(s);
}
