/*
 * The daemon's replies to the C client's producer: ERROR replies returned once by the next call,
 * zero-copy buffers released exactly once on every path, PREDICTION replies handed to the
 * callback or refused when malformed (also decoded without a socket, clients/c/
 * producer_internal.h), and credit that saturates.
 *
 * Sizes, counts and codes are random. The seed comes from IFD_TEST_SEED when set, else from the
 * clock, and every failure message names it.
 */
#include <infeed/client.h>

#include "clients/c/producer_impl.h" /* ifdp_recv_one */
#include "core/rng.h"
#include "core/thread.h"
#include "tests/util/fake_daemon.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define MAXB 40

/* Reads the daemon's replies, without returning their errors, until the producer counts n
 * rejected batches: the handshake that an ERROR reply is in (the next call returns it), instead of
 * a guess of how long loopback takes. */
static void wait_rejected(ifd_producer *p, int64_t n)
{
    int64_t deadline = ifd_clock_ns() + 10000 * MS;
    ifd_error err;
    ifd_error_clear(&err);
    while (ifd_producer_rejected(p) < n && ifd_clock_ns() < deadline) {
        int rc = ifdp_recv_one(p, 100, &err);
        RASSERT(rc == IFD_OK || rc == IFD_ETIMEDOUT, "receiving replies: %s", err.msg);
    }
    RASSERT(ifd_producer_rejected(p) >= n,
            "%" PRId64 " rejections came within 10 s, expected %" PRId64, ifd_producer_rejected(p),
            n);
}

static const char *const CODES[] = {"EPROTO", "EINVAL", "ESHAPE", "EDTYPE", "ERANGE", "ECLOSED"};
static const int CODE_VALUES[] = {IFD_EPROTO, IFD_EINVAL, IFD_ESHAPE,
                                  IFD_EDTYPE, IFD_ERANGE, IFD_ECLOSED};

typedef struct error_case {
    int k;     /* phase 1 batches */
    int bad;   /* the one rejected in phase 1 */
    int code;  /* index into CODES, or -1 for an unknown code */
    int code2; /* phase 2's */
    char msg[160], msg2[160];
} error_case;

static void script_errors(fake *f)
{
    error_case *c = f->arg;
    FAKE_HELLO_WELCOME(f, 64, 100, 1);
    fmsg m;
    for (int b = 0; b < c->k; b++) {
        FCHECK(f, fake_recv(f, &m, 10000), "batch %d never came", b);
        FCHECK(f, hdr_type(&m) == 3, "expected BATCH");
        int64_t seq = (int64_t)fake_get_le(m.data[0] + 8, 8);
        fmsg_free(&m);
        FCHECK(f, seq == 100 + b, "seq %" PRId64 ", expected %d", seq, 100 + b);
        if (b == c->bad)
            fake_error(f, c->code >= 0 ? CODES[c->code] : "EWHATEVER", seq, 1, c->msg);
        else
            fake_ack(f, seq);
    }
    /* Phase 2: batch B rejected; the next send must return that and not go; it then goes. */
    FCHECK(f, fake_recv(f, &m, 10000), "batch B never came");
    int64_t seq = (int64_t)fake_get_le(m.data[0] + 8, 8);
    fmsg_free(&m);
    FCHECK(f, seq == 100 + c->k, "batch B seq %" PRId64, seq);
    fake_error(f, CODES[c->code2], seq, 1, c->msg2);
    FCHECK(f, fake_recv(f, &m, 10000), "batch C never came");
    int64_t seq2 = (int64_t)fake_get_le(m.data[0] + 8, 8);
    fmsg_free(&m);
    FCHECK(f, seq2 == seq + 1, "batch C seq %" PRId64 ", expected %" PRId64, seq2, seq + 1);
    fake_ack(f, seq2);
    FCHECK(f, fake_recv(f, &m, 10000) && hdr_type(&m) == 6, "END never came");
    fmsg_free(&m);
    fake_bye(f, "ok", "input_ended", seq2);
}

START_TEST(test_async_error)
{
    ifd_rng rng;
    seed_rng(&rng);
    error_case c;
    c.k = (int)rand_between(&rng, 1, 8);
    c.bad = (int)rand_between(&rng, 0, c.k - 1);
    c.code = (int)rand_between(&rng, -1, 5);
    c.code2 = (int)rand_between(&rng, 0, 5);
    snprintf(c.msg, sizeof c.msg,
             "batch %d from producer 'e': tensor 'x' is %d bytes, expected 4 (1 rows of [4] "
             "uint8)",
             100 + c.bad, (int)rand_between(&rng, 5, 9999));
    snprintf(c.msg2, sizeof c.msg2, "second rejection %d", (int)rand_between(&rng, 0, 99999));
    fake f;
    fake_start(&f, script_errors, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, "e", &err), err);
    RC_OK(ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, 10000, &err), err);
    ifd_frame fr = {"abcd", 4};
    int seen = 0;
    int want = c.code >= 0 ? CODE_VALUES[c.code] : IFD_EPROTO;
    ifd_error got;
    for (int b = 0; b < c.k; b++) {
        int rc = ifd_producer_send(p, 1, &fr, 1, 10000, &err);
        if (rc != IFD_OK) {
            /* The rejection came back before this batch went: it is returned, once. */
            RASSERT(!seen, "the ERROR was returned twice");
            RASSERT(rc == want, "send returned %s, expected %s", ifd_errname(rc),
                    ifd_errname(want));
            seen = 1;
            got = err;
            b--;
        }
    }
    if (!seen) {
        int rc = ifd_producer_wait(p, 10000, &err);
        RASSERT(rc == want, "wait returned %s (%s), expected %s", ifd_errname(rc), err.msg,
                ifd_errname(want));
        got = err;
    }
    RASSERT(strstr(got.msg, c.msg) == got.msg, "ERROR message '%s', expected '%s'", got.msg, c.msg);
    if (c.code < 0)
        RASSERT(strstr(got.msg, "EWHATEVER") != NULL, "unknown code not named: %s", got.msg);
    RC_OK(ifd_producer_wait(p, 10000, &err), err);
    RASSERT(ifd_producer_rejected(p) == 1 && ifd_producer_acked(p) == c.k - 1,
            "rejected %" PRId64 " acked %" PRId64, ifd_producer_rejected(p), ifd_producer_acked(p));
    RASSERT(ifd_producer_available(p) == 64, "credit not returned: %" PRId64,
            ifd_producer_available(p));

    /* Phase 2. */
    RC_OK(ifd_producer_send(p, 1, &fr, 1, 10000, &err), err);
    wait_rejected(p, 2); /* the ERROR for B is in */
    int64_t seq_c = ifd_producer_next_seq(p);
    int rc = ifd_producer_send(p, 1, &fr, 1, 10000, &err);
    RASSERT(rc == CODE_VALUES[c.code2] && strcmp(err.msg, c.msg2) == 0,
            "the send after a rejection returned %s '%s', expected %s '%s'", ifd_errname(rc),
            err.msg, CODES[c.code2], c.msg2);
    RASSERT(ifd_producer_next_seq(p) == seq_c, "a refused send used a seq");
    RC_OK(ifd_producer_send(p, 1, &fr, 1, 10000, &err), err);
    RC_OK(ifd_producer_end(p, 10000, &err), err);
    fake_join(&f);
    ifd_producer_destroy(p);
}
END_TEST

/* A producer that keeps sending after a rejected batch: a send reads the replies waiting only
 * now and then while it has credit (IFDP_DRAIN_EVERY_NS), but one that lacks credit reads them
 * at once, so the ERROR is returned by a send, once, before the producer has sent a credit's
 * worth past the batch it rejects. Random credit, rejected batch and extra batches. */
typedef struct stream_case {
    int credit, n, bad;
} stream_case;

static void script_stream(fake *f)
{
    stream_case *c = f->arg;
    FAKE_HELLO_WELCOME(f, c->credit, 0, 1);
    fmsg m;
    for (int b = 0; b < c->n; b++) {
        FCHECK(f, fake_recv(f, &m, 10000), "batch %d never came", b);
        int64_t seq = (int64_t)fake_get_le(m.data[0] + 8, 8);
        fmsg_free(&m);
        FCHECK(f, seq == b, "seq %" PRId64 ", expected %d", seq, b);
        if (b == c->bad)
            fake_error(f, "ESHAPE", seq, 1, "rejected in the stream");
        else
            fake_ack(f, seq);
    }
    FCHECK(f, fake_recv(f, &m, 10000) && hdr_type(&m) == 6, "END never came");
    fmsg_free(&m);
    fake_bye(f, "ok", "input_ended", c->n - 1);
}

START_TEST(test_error_within_credit)
{
    ifd_rng rng;
    seed_rng(&rng);
    stream_case c;
    c.credit = (int)rand_between(&rng, 2, 40);
    c.bad = (int)rand_between(&rng, 0, c.credit - 1);
    c.n = c.bad + c.credit + 1 + (int)rand_between(&rng, 0, 20); /* the ERROR's send included */
    fake f;
    fake_start(&f, script_stream, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, "s", &err), err);
    RC_OK(ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, 10000, &err), err);
    ifd_frame fr = {"abcd", 4};
    int returned_at = -1, sent = 0;
    for (int call = 0; sent < c.n; call++) {
        int rc = ifd_producer_send(p, 1, &fr, 1, 10000, &err);
        if (rc == IFD_OK) {
            sent++;
            continue;
        }
        RASSERT(returned_at < 0, "the ERROR was returned twice (calls %d and %d)", returned_at,
                call);
        RASSERT(rc == IFD_ESHAPE && strcmp(err.msg, "rejected in the stream") == 0,
                "send returned %s '%s'", ifd_errname(rc), err.msg);
        returned_at = sent;
    }
    RASSERT(returned_at > c.bad && returned_at <= c.bad + c.credit,
            "the ERROR for batch %d came back with %d batches sent (credit %d): expected after "
            "%d and by %d",
            c.bad, returned_at, c.credit, c.bad + 1, c.bad + c.credit);
    RC_OK(ifd_producer_end(p, 10000, &err), err);
    RASSERT(ifd_producer_rejected(p) == 1 && ifd_producer_acked(p) == c.n - 1,
            "rejected %" PRId64 " acked %" PRId64 " of %d", ifd_producer_rejected(p),
            ifd_producer_acked(p), c.n);
    fake_join(&f);
    ifd_producer_destroy(p);
}
END_TEST

/* ---- zero copy ---------------------------------------------------------------------------- */

/* A buffer that counts its releases; the bytes live on after release so the test can count. */
typedef struct zbuf {
    atomic_int freed;
    int64_t pad;
    unsigned char data[];
} zbuf;

static void zbuf_release(void *data, void *hint)
{
    (void)hint;
    zbuf *z = (zbuf *)((unsigned char *)data - offsetof(zbuf, data));
    atomic_fetch_add(&z->freed, 1);
}

typedef struct zc_case {
    int nb;
    size_t size[MAXB];
} zc_case;

static void script_zc(fake *f)
{
    zc_case *c = f->arg;
    FAKE_HELLO_WELCOME(f, 2, 0, 1);
    fmsg m;
    /* Batch 0 is rejected, so the next zero-copy send is refused and must release its frames. */
    int64_t seq = 0;
    for (int b = 0; b < c->nb; b++) {
        FCHECK(f, fake_recv(f, &m, 10000), "batch %d never came", b);
        const char *why = fake_check_batch(&m, seq, 1, 2, (size_t[]){c->size[b], 8});
        fmsg_free(&m);
        FCHECK(f, why == NULL, "%s", why);
        if (b == 0) {
            fake_error(f, "ERANGE", seq, 1, "label out of range");
        } else if (b < c->nb - 1)
            fake_ack(f, seq);
        seq++;
    }
    /* The last batch stays unacknowledged: destroy releases it. */
    while (fake_recv(f, &m, 300))
        fmsg_free(&m);
}

static zbuf *zbuf_new(size_t n, int64_t seq, int i)
{
    zbuf *z = malloc(sizeof *z + n);
    atomic_init(&z->freed, 0);
    fake_fill_pattern(z->data, n, seq, i);
    return z;
}

START_TEST(test_zero_copy)
{
    ifd_rng rng;
    seed_rng(&rng);
    zc_case c;
    c.nb = (int)rand_between(&rng, 2, 12);
    for (int b = 0; b < c.nb; b++)
        c.size[b] = (size_t)rand_between(&rng, 1, 1 << 20);
    fake f;
    fake_start(&f, script_zc, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, NULL, &err), err);
    RC_OK(ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, 10000, &err), err);
    zbuf *all[4 * MAXB];
    int nall = 0;
    int refused = 0;
    for (int b = 0; b < c.nb; b++) {
        int64_t seq = ifd_producer_next_seq(p);
        zbuf *z0 = zbuf_new(c.size[b], seq, 0), *z1 = zbuf_new(8, seq, 1);
        all[nall++] = z0;
        all[nall++] = z1;
        ifd_frame fr[2] = {{z0->data, c.size[b]}, {z1->data, 8}};
        if (b == 1 && !refused)
            wait_rejected(p, 1); /* batch 0's ERROR is in */
        int rc = ifd_producer_send_zc(p, 1, fr, 2, zbuf_release, NULL, 10000, &err);
        if (b == 1 && !refused) {
            RASSERT(rc == IFD_ERANGE, "zero-copy send after a rejection returned %s",
                    ifd_errname(rc));
            RASSERT(atomic_load(&z0->freed) == 1 && atomic_load(&z1->freed) == 1,
                    "a refused zero-copy send did not release its frames (%d, %d)",
                    atomic_load(&z0->freed), atomic_load(&z1->freed));
            refused = 1;
            b--;
            continue;
        }
        RC_OK(rc, err);
    }
    RASSERT(refused, "no refused send");
    /* Bad arguments release too. */
    zbuf *bad = zbuf_new(4, 0, 0);
    all[nall++] = bad;
    ifd_frame bf = {bad->data, 4};
    RASSERT(ifd_producer_send_zc(p, -1, &bf, 1, zbuf_release, NULL, 0, &err) == IFD_EINVAL,
            "rows -1 accepted");
    RASSERT(atomic_load(&bad->freed) == 1, "bad-argument send did not release its frame");
    /* No credit (window 2, one still in flight + one now): timeout 0 releases. */
    zbuf *nc = zbuf_new(4, 0, 0);
    all[nall++] = nc;
    ifd_frame nf = {nc->data, 4};
    /* Every ACK in: only the last batch is in flight. */
    while (ifd_producer_in_flight(p) > 1) {
        int wrc = ifd_producer_wait(p, 10, &err);
        RASSERT(wrc == IFD_ETIMEDOUT, "wait returned %s: %s", ifd_errname(wrc), err.msg);
    }
    int rc = IFD_OK;
    int64_t extra = ifd_producer_available(p);
    for (int64_t i = 0; i < extra; i++) {
        zbuf *e0 = zbuf_new(4, 0, 0), *e1 = zbuf_new(8, 0, 1);
        all[nall++] = e0;
        all[nall++] = e1;
        ifd_frame ef[2] = {{e0->data, 4}, {e1->data, 8}};
        RC_OK(ifd_producer_send_zc(p, 1, ef, 2, zbuf_release, NULL, 1000, &err), err);
    }
    rc = ifd_producer_send_zc(p, 1, &nf, 1, zbuf_release, NULL, 0, &err);
    RASSERT(rc == IFD_ETIMEDOUT, "zero-copy send with no credit returned %s", ifd_errname(rc));
    RASSERT(atomic_load(&nc->freed) == 1, "a timed-out zero-copy send did not release");
    fake_join(&f);
    ifd_producer_destroy(p);
    for (int i = 0; i < nall; i++) {
        RASSERT(atomic_load(&all[i]->freed) == 1, "buffer %d of %d released %d times", i, nall,
                atomic_load(&all[i]->freed));
        free(all[i]);
    }
}
END_TEST

/* ---- PREDICTION ---------------------------------------------------------------------------- */

#define PRED_MAXB 12
typedef struct pred_case {
    int nb, k, bad_at; /* bad_at: the batch whose PREDICTION is malformed, -1 none */
    int64_t rows[PRED_MAXB];
    float *probs[PRED_MAXB];
    int32_t *classes[PRED_MAXB];
    /* what the producer's callback saw */
    int got;
    int64_t got_seq[PRED_MAXB], got_rows[PRED_MAXB];
    int ok[PRED_MAXB];
} pred_case;

static void script_predict(fake *f)
{
    pred_case *c = f->arg;
    FAKE_HELLO_WELCOME(f, 64, 0, 16);
    for (int b = 0; b < c->nb; b++) {
        fmsg m;
        FCHECK(f, fake_recv(f, &m, 10000), "batch %d never came", b);
        fmsg_free(&m);
        unsigned char h[32] = {'I', 'F', 'D', 'P', 1, 0, 8, 0};
        fake_put_le(h + 8, (uint64_t)b, 8);
        fake_put_le(h + 16, (uint64_t)c->rows[b], 8);
        fake_put_le(h + 28, 2, 4);
        char desc[160];
        snprintf(desc, sizeof desc,
                 "[{\"name\":\"probabilities\",\"dtype\":\"float32\",\"shape\":[%d]},"
                 "{\"name\":\"classes\",\"dtype\":\"int32\",\"shape\":[]}]",
                 c->k);
        size_t pbytes = sizeof(float) * (size_t)(c->rows[b] * c->k);
        zmq_send(f->router, f->id, f->id_len, ZMQ_SNDMORE);
        zmq_send(f->router, h, 32, ZMQ_SNDMORE);
        zmq_send(f->router, desc, strlen(desc), ZMQ_SNDMORE);
        zmq_send(f->router, c->probs[b], pbytes - (b == c->bad_at ? 4 : 0), ZMQ_SNDMORE);
        zmq_send(f->router, c->classes[b], sizeof(int32_t) * (size_t)c->rows[b], 0);
        fake_ack(f, b);
    }
    fmsg m;
    FCHECK(f, fake_recv(f, &m, 10000), "END never came");
    fmsg_free(&m);
    fake_bye(f, "ok", "input_ended", c->nb - 1);
}

static void on_pred(void *arg, int64_t seq, int64_t rows, int ntensors, const char *const *names,
                    const ifd_tensor *t)
{
    pred_case *c = arg;
    int i = c->got++;
    c->got_seq[i] = seq;
    c->got_rows[i] = rows;
    c->ok[i] = ntensors == 2 && strcmp(names[0], "probabilities") == 0 &&
               strcmp(names[1], "classes") == 0 && t[0].dtype == IFD_F32 && t[0].shape.rank == 2 &&
               t[0].shape.dims[0] == rows && t[0].shape.dims[1] == c->k && t[1].dtype == IFD_I32 &&
               t[1].shape.rank == 1 && seq >= 0 && seq < c->nb &&
               memcmp(t[0].data, c->probs[seq], sizeof(float) * (size_t)(rows * c->k)) == 0 &&
               memcmp(t[1].data, c->classes[seq], sizeof(int32_t) * (size_t)rows) == 0;
}

START_TEST(test_predictions)
{
    ifd_rng rng;
    seed_rng(&rng);
    pred_case c = {.nb = (int)rand_between(&rng, 1, PRED_MAXB), .k = (int)rand_between(&rng, 1, 9)};
    c.bad_at = _i == 1 ? (int)rand_between(&rng, 0, c.nb - 1) : -1;
    for (int b = 0; b < c.nb; b++) {
        c.rows[b] = rand_between(&rng, 1, 16);
        c.probs[b] = malloc(sizeof(float) * (size_t)(c.rows[b] * c.k));
        c.classes[b] = malloc(sizeof(int32_t) * (size_t)c.rows[b]);
        for (int64_t j = 0; j < c.rows[b] * c.k; j++)
            c.probs[b][j] = (float)ifd_rng_uniform(&rng);
        for (int64_t j = 0; j < c.rows[b]; j++)
            c.classes[b][j] = (int32_t)ifd_rng_below(&rng, (uint64_t)c.k);
    }
    fake f;
    fake_start(&f, script_predict, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, "pred", &err), err);
    ifd_producer_on_prediction(p, on_pred, &c);
    RC_OK(ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, 10000, &err), err);
    unsigned char x[16 * 4] = {0};
    int failed = 0;
    for (int b = 0; b < c.nb; b++) {
        ifd_frame fr = {x, (size_t)(c.rows[b] * 4)};
        int rc = ifd_producer_send(p, c.rows[b], &fr, 1, 10000, &err);
        if (rc) { /* the malformed PREDICTION's error, from the next call */
            RASSERT(rc == IFD_EPROTO && strstr(err.msg, "PREDICTION"), "send %d: %s %s", b,
                    ifd_errname(rc), err.msg);
            failed = 1;
            b--;
        }
    }
    int rc = ifd_producer_end(p, 10000, &err);
    if (rc == IFD_EPROTO && !failed) {
        failed = 1;
        rc = ifd_producer_end(p, 10000, &err);
    }
    RC_OK(rc, err);
    fake_join(&f);
    RASSERT(f.fail[0] == '\0', "%s", f.fail);
    int want = c.nb - (c.bad_at >= 0);
    RASSERT(c.got == want && ifd_producer_predictions(p) == want, "%d predictions, expected %d",
            c.got, want);
    RASSERT(failed == (c.bad_at >= 0), "malformed PREDICTION: error %d", failed);
    for (int i = 0, b = 0; i < c.got; i++, b++) {
        if (b == c.bad_at)
            b++;
        RASSERT(c.got_seq[i] == b && c.got_rows[i] == c.rows[b] && c.ok[i],
                "prediction %d: seq %lld rows %lld, contents %s", i, (long long)c.got_seq[i],
                (long long)c.got_rows[i], c.ok[i] ? "equal" : "differ");
    }
    ifd_producer_destroy(p);
    for (int b = 0; b < c.nb; b++) {
        free(c.probs[b]);
        free(c.classes[b]);
    }
}
END_TEST

/* PREDICTIONs decoded without a socket (clients/c/producer_internal.h). Found while writing
 * fuzz_wire's invariant (fuzz/README.md): rows x shape x 4 bytes that wrap around 2^64 to the
 * frame's size handed the callback a tensor of 2^62 + m rows over a buffer of 4km bytes. */
typedef struct pred_spy {
    int calls;
    int64_t rows;
    float first;
} pred_spy;

static void spy_pred(void *arg, int64_t seq, int64_t rows, int ntensors, const char *const *names,
                     const ifd_tensor *t)
{
    (void)seq;
    (void)names;
    pred_spy *s = arg;
    s->calls++;
    s->rows = rows;
    s->first = ntensors > 0 && rows > 0 ? ((const float *)t[0].data)[0] : 0.0f;
}

static void prediction_reply(ifd_producer *p, int64_t rows, int k, uint32_t ntensors,
                             const float *data, size_t bytes)
{
    unsigned char h[32] = {'I', 'F', 'D', 'P', 1, 0, 8, 0};
    fake_put_le(h + 8, 3, 8);
    fake_put_le(h + 16, (uint64_t)rows, 8);
    fake_put_le(h + 28, ntensors, 4);
    char desc[96];
    snprintf(desc, sizeof desc, "[{\"name\":\"outputs\",\"dtype\":\"float32\",\"shape\":[%d]}]", k);
    ifd_frame f[3] = {{h, sizeof h}, {desc, strlen(desc)}, {data, bytes}};
    ifdp_on_reply(p, f, ntensors == 1 ? 3 : 2);
}

START_TEST(test_prediction_overflow)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifdp_alloc(&p, "tcp://127.0.0.1:1", "pred", &err), err);
    pred_spy spy = {0};
    ifd_producer_on_prediction(p, spy_pred, &spy);
    int k = 1 << rand_between(&rng, 0, 3);
    int64_t m = rand_between(&rng, 1, 16);
    size_t bytes = sizeof(float) * (size_t)(k * m);
    float *data = malloc(bytes);
    for (int64_t i = 0; i < k * m; i++)
        data[i] = (float)ifd_rng_uniform(&rng);

    /* 4 x k x (2^62 + m) == 4km (mod 2^64) */
    prediction_reply(p, ((int64_t)1 << 62) + m, k, 1, data, bytes);
    RASSERT(spy.calls == 0 && ifd_producer_predictions(p) == 0,
            "a PREDICTION of 2^62 + %lld rows of [%d] float32 over %zu bytes reached the callback",
            (long long)m, k, bytes);
    int rc = ifdp_pop_error(p, &err);
    RASSERT(rc == IFD_EPROTO && strstr(err.msg, "PREDICTION for batch 3: tensor 0 'outputs'") &&
                strstr(err.msg, "overflows"),
            "the overflowing PREDICTION's error: %s %s", ifd_errname(rc), err.msg);

    /* One byte short, and no tensors: refused with a sentence. */
    prediction_reply(p, m, k, 1, data, bytes - 1);
    rc = ifdp_pop_error(p, &err);
    char want[96];
    snprintf(want, sizeof want, "expected %zu bytes (%lld rows of its shape), got a frame of %zu",
             bytes, (long long)m, bytes - 1);
    RASSERT(rc == IFD_EPROTO && strstr(err.msg, want), "a short frame: %s %s (wanted '%s')",
            ifd_errname(rc), err.msg, want);
    prediction_reply(p, m, k, 0, data, bytes);
    rc = ifdp_pop_error(p, &err);
    RASSERT(rc == IFD_EPROTO && strstr(err.msg, "ntensors"), "0 tensors: %s %s", ifd_errname(rc),
            err.msg);
    RASSERT(spy.calls == 0, "a refused PREDICTION reached the callback");

    /* The same tensor with m rows is decoded. */
    prediction_reply(p, m, k, 1, data, bytes);
    RASSERT(ifdp_pop_error(p, &err) == IFD_OK, "a valid PREDICTION refused: %s", err.msg);
    RASSERT(spy.calls == 1 && spy.rows == m && spy.first == data[0] &&
                ifd_producer_predictions(p) == 1,
            "the valid PREDICTION: %d calls, %lld rows", spy.calls, (long long)spy.rows);
    free(data);
    ifd_producer_destroy(p);
}
END_TEST

/* Found with fuzz_wire (fuzz/README.md): ERROR replies whose credit adds up past 2^63 overflowed
 * the producer's credit count (undefined behaviour; wrapped, it went negative and the producer
 * waited forever). The count saturates. */
START_TEST(test_error_credit_saturates)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifdp_alloc(&p, "tcp://127.0.0.1:1", "credit", &err), err);
    int n = (int)rand_between(&rng, 2, 6);
    for (int i = 0; i < n; i++) {
        unsigned char h[8] = {'I', 'F', 'D', 'P', 1, 0, 7, 0};
        char json[160];
        int64_t credit = INT64_MAX - rand_between(&rng, 0, 1 << 20);
        snprintf(json, sizeof json,
                 "{\"code\":\"ESHAPE\",\"seq\":%d,\"credit\":%lld,\"message\":\"batch %d\"}", i,
                 (long long)credit, i);
        ifd_frame f[2] = {{h, sizeof h}, {json, strlen(json)}};
        ifdp_on_reply(p, f, 2);
        int64_t want = i == 0 ? credit : INT64_MAX;
        RASSERT(ifd_producer_available(p) == want,
                "after %d ERRORs of credit near 2^63: %lld available, expected %lld", i + 1,
                (long long)ifd_producer_available(p), (long long)want);
    }
    for (int i = 0; i < n; i++) {
        char want[32];
        snprintf(want, sizeof want, "batch %d", i);
        RASSERT(ifdp_pop_error(p, &err) == IFD_ESHAPE && strcmp(err.msg, want) == 0, "ERROR %d: %s",
                i, err.msg);
    }
    ifd_producer_destroy(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_replies");
    TCase *tc = tu_tcase(s, "producer", 60);
    tcase_add_test(tc, test_async_error);
    tcase_add_loop_test(tc, test_error_within_credit, 0, 8);
    tcase_add_test(tc, test_zero_copy);
    tcase_add_loop_test(tc, test_predictions, 0, 2);
    tcase_add_test(tc, test_prediction_overflow);
    tcase_add_test(tc, test_error_credit_saturates);
    return tu_run_suite(s);
}
