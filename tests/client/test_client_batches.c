/*
 * The C client's producer streaming to a fake daemon (tests/util/fake_daemon.c): every BATCH and
 * END header and byte, by each of the three send functions; END waiting for the ACKs or the BYE
 * and its timeout; sends blocked on credit until an ACK or CREDIT, and their timeout; messages of
 * several steps, each step a credit and a seq.
 *
 * Sizes, counts and codes are random. The seed comes from IFD_TEST_SEED when set, else from the
 * clock, and every failure message names it.
 */
#include <infeed/client.h>

#include "core/rng.h"
#include "core/thread.h"
#include "tests/util/fake_daemon.h"
#include "tests/util/testutil.h"
#include "tests/util/wait.h"

#include <check.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXB 40

typedef struct batch_case {
    int nb, n;
    int64_t next_seq, credit;
    int64_t rows[MAXB];
    size_t sizes[MAXB][IFD_MAX_INPUTS];
    int ack_before_end; /* ACK as batches come, or only after END */
    int bye_after;      /* ACKs sent before the BYE (nb: all) */
    const char *bye_status;
    atomic_int client;     /* the kernel id of the test's thread, which calls end */
    atomic_int acks_going; /* the ACKs the fake has sent, each counted before it goes */
} batch_case;

static void script_batches(fake *f)
{
    batch_case *c = f->arg;
    FAKE_HELLO_WELCOME(f, c->credit, c->next_seq, 1);
    fmsg m;
    int acked = 0;
    for (int b = 0; b < c->nb; b++) {
        FCHECK(f, fake_recv(f, &m, 10000), "batch %d never came", b);
        const char *why = fake_check_batch(&m, c->next_seq + b, c->rows[b], c->n, c->sizes[b]);
        fmsg_free(&m);
        FCHECK(f, why == NULL, "%s", why);
        if (c->ack_before_end && acked < c->bye_after) {
            atomic_store(&c->acks_going, acked + 1);
            fake_ack(f, c->next_seq + acked++);
        }
    }
    FCHECK(f, fake_recv(f, &m, 10000), "END never came");
    static const unsigned char end[8] = {'I', 'F', 'D', 'P', 1, 0, 6, 0};
    FCHECK(f, m.n == 1 && m.size[0] == 8 && memcmp(m.data[0], end, 8) == 0,
           "END: %d frames, header of %zu bytes, type %d", m.n, m.size[0], hdr_type(&m));
    fmsg_free(&m);
    /* The ACKs still owed go once the client waits for them (in end, or in bye when every ACK is
     * in), one reply each. */
    FCHECK(f, tu_thread_blocked(&c->client, NULL, 10000 * MS) == 1,
           "the client never waited after END");
    while (acked < c->bye_after) {
        atomic_store(&c->acks_going, acked + 1);
        fake_ack(f, c->next_seq + acked++);
    }
    fake_bye(f, c->bye_status, c->bye_after == c->nb ? "input_ended" : "last_step",
             c->next_seq + acked - 1);
    /* Nothing else may come. */
    FCHECK(f, !fake_recv(f, &m, 100), "a message of type %d after END", hdr_type(&m));
}

static void zc_free_count(void *data, void *hint)
{
    (void)data;
    atomic_fetch_add((atomic_int *)hint, 1);
}

/* Sends the batches of c, each by a random one of the three send functions. */
/* Zero-copy buffers of send_batches, freed by the test after destroy. */
static void *g_zc_bufs[MAXB * IFD_MAX_INPUTS];
static int g_zc_n;

static void zc_bufs_free(void)
{
    for (int i = 0; i < g_zc_n; i++)
        free(g_zc_bufs[i]);
    g_zc_n = 0;
}

static void send_batches(ifd_producer *p, batch_case *c, ifd_rng *rng, atomic_int *zc_freed,
                         int *zc_frames)
{
    ifd_error err;
    for (int b = 0; b < c->nb; b++) {
        int64_t seq = ifd_producer_next_seq(p);
        RASSERT(seq == c->next_seq + b, "next_seq %" PRId64 " before batch %d", seq, b);
        ifd_frame fr[IFD_MAX_INPUTS];
        unsigned char *bufs[IFD_MAX_INPUTS];
        for (int i = 0; i < c->n; i++) {
            bufs[i] = malloc(c->sizes[b][i]);
            fake_fill_pattern(bufs[i], c->sizes[b][i], seq, i);
            fr[i].data = bufs[i];
            fr[i].size = c->sizes[b][i];
        }
        int how = (int)rand_between(rng, 0, 2);
        if (how == 0) {
            RC_OK(ifd_producer_send(p, c->rows[b], fr, c->n, 10000, &err), err);
        } else if (how == 1) {
            /* As tensors: [rows, bytes/rows] of uint8. */
            ifd_tensor t[IFD_MAX_INPUTS];
            for (int i = 0; i < c->n; i++) {
                t[i].dtype = IFD_U8;
                t[i].shape.rank = 2;
                t[i].shape.dims[0] = c->rows[b];
                t[i].shape.dims[1] = (int64_t)c->sizes[b][i] / c->rows[b];
                t[i].data = bufs[i];
            }
            RC_OK(ifd_producer_send_tensors(p, t, c->n, 10000, &err), err);
        } else {
            RC_OK(
                ifd_producer_send_zc(p, c->rows[b], fr, c->n, zc_free_count, zc_freed, 10000, &err),
                err);
            *zc_frames += c->n;
            for (int i = 0; i < c->n; i++)
                g_zc_bufs[g_zc_n++] = bufs[i];
            continue; /* freed after destroy */
        }
        for (int i = 0; i < c->n; i++)
            free(bufs[i]);
    }
}

static void batch_case_random(batch_case *c, ifd_rng *rng)
{
    memset(c, 0, sizeof *c);
    c->nb = (int)rand_between(rng, 1, MAXB);
    c->n = (int)rand_between(rng, 1, 4);
    c->next_seq = rand_between(rng, 0, 1 << 20);
    c->credit = c->nb + rand_between(rng, 0, 3);
    for (int b = 0; b < c->nb; b++) {
        c->rows[b] = rand_between(rng, 1, 64);
        for (int i = 0; i < c->n; i++)
            c->sizes[b][i] = (size_t)(c->rows[b] * rand_between(rng, 1, 3000));
    }
    c->bye_after = c->nb;
    c->bye_status = "ok";
    atomic_init(&c->client, tu_self_tid());
    atomic_init(&c->acks_going, 0);
}

/* A producer that streams a batch_case's batches to a fake daemon playing script_batches. */
typedef struct stream {
    fake f;
    ifd_producer *p;
    atomic_int zc_freed;
    int zc_frames;
} stream;

static void stream_start(stream *s, batch_case *c, ifd_rng *rng, const char *name)
{
    ifd_error err;
    atomic_init(&s->zc_freed, 0);
    s->zc_frames = 0;
    fake_start(&s->f, script_batches, c);
    RC_OK(ifd_producer_create(&s->p, s->f.endpoint, name, &err), err);
    RC_OK(ifd_producer_hello(s->p, FAKE_ONE_U8, 1, 0, 10000, &err), err);
    send_batches(s->p, c, rng, &s->zc_freed, &s->zc_frames);
}

/* Joins the fake and destroys the producer: every zero-copy frame was released once. */
static void stream_finish(stream *s)
{
    fake_join(&s->f);
    ifd_producer_destroy(s->p);
    RASSERT(atomic_load(&s->zc_freed) == s->zc_frames, "%d zero-copy frames released, expected %d",
            atomic_load(&s->zc_freed), s->zc_frames);
    zc_bufs_free();
}

START_TEST(test_batches_end_bye)
{
    ifd_rng rng;
    seed_rng(&rng);
    batch_case c;
    batch_case_random(&c, &rng);
    c.ack_before_end = (int)rand_between(&rng, 0, 1);
    stream st;
    stream_start(&st, &c, &rng, "b");
    ifd_producer *p = st.p;
    ifd_error err;
    RASSERT(ifd_producer_sent(p) == c.nb, "sent %" PRId64 ", expected %d", ifd_producer_sent(p),
            c.nb);
    RC_OK(ifd_producer_end(p, 10000, &err), err);
    int going = atomic_load(&c.acks_going);
    RASSERT(ifd_producer_in_flight(p) == 0, "%" PRId64 " in flight after end",
            ifd_producer_in_flight(p));
    RASSERT(ifd_producer_acked(p) == c.nb, "acked %" PRId64 ", expected %d", ifd_producer_acked(p),
            c.nb);
    RASSERT(ifd_producer_acked_seq(p) == c.next_seq + c.nb - 1, "acked_seq %" PRId64,
            ifd_producer_acked_seq(p));
    /* The order of the events: the last ACK went, then end returned. */
    RASSERT(going == c.nb, "end returned when %d of the %d ACKs had been sent (ACKs %s END)", going,
            c.nb, c.ack_before_end ? "before" : "after");
    const char *bye;
    RC_OK(ifd_producer_bye(p, 10000, &bye, &err), err);
    RASSERT(strstr(bye, "\"status\": \"ok\"") != NULL, "BYE JSON: %s", bye);
    ifd_frame fr = {"abcd", 4};
    RASSERT(ifd_producer_send(p, 1, &fr, 1, 0, &err) == IFD_ECLOSED, "send after END");
    stream_finish(&st);
}
END_TEST

START_TEST(test_end_bye_first)
{
    /* The run ends (BYE) before every batch is ACKed: end returns by the BYE's status. */
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 2; round++) {
        batch_case c;
        do /* two batches at least, each with its rows and sizes drawn */
            batch_case_random(&c, &rng);
        while (c.nb < 2);
        c.bye_after = (int)rand_between(&rng, 0, c.nb - 1);
        c.bye_status = round == 0 ? "ok" : "error";
        stream st;
        stream_start(&st, &c, &rng, NULL);
        ifd_producer *p = st.p;
        ifd_error err;
        int rc = ifd_producer_end(p, 10000, &err);
        if (round == 0)
            RASSERT(rc == IFD_OK, "end after BYE ok returned %s: %s", ifd_errname(rc), err.msg);
        else
            RASSERT(rc == IFD_ESTOPPED && strstr(err.msg, "status error") &&
                        strstr(err.msg, "run over"),
                    "end after BYE error returned %s: %s", ifd_errname(rc), err.msg);
        RASSERT(ifd_producer_acked(p) == c.bye_after, "acked %" PRId64 ", expected %d",
                ifd_producer_acked(p), c.bye_after);
        RASSERT(ifd_producer_in_flight(p) == c.nb - c.bye_after, "in flight %" PRId64,
                ifd_producer_in_flight(p));
        stream_finish(&st);
    }
}
END_TEST

static void script_never_ack(fake *f)
{
    FAKE_HELLO_WELCOME(f, 4, 0, 1);
    fmsg m;
    while (fake_recv(f, &m, 500))
        fmsg_free(&m);
}

START_TEST(test_end_timeout)
{
    ifd_rng rng;
    seed_rng(&rng);
    fake f;
    fake_start(&f, script_never_ack, NULL);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, NULL, &err), err);
    RC_OK(ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, 10000, &err), err);
    int k = (int)rand_between(&rng, 1, 4);
    for (int b = 0; b < k; b++) {
        ifd_frame fr = {"abcd", 4};
        RC_OK(ifd_producer_send(p, 1, &fr, 1, 1000, &err), err);
    }
    int t = (int)rand_between(&rng, 20, 100);
    int64_t t0 = ifd_clock_ns(), deadline = t0 + t * MS;
    int rc = ifd_producer_end(p, t, &err);
    int64_t back = ifd_clock_ns();
    /* The order of the events: the timeout passed, then end returned. */
    RASSERT(rc == IFD_ETIMEDOUT && back >= deadline,
            "end with no ACKs returned %s after %" PRId64 " ns (timeout %d ms)", ifd_errname(rc),
            back - t0, t);
    RASSERT(ifd_producer_wait(p, 0, &err) == IFD_ETIMEDOUT, "wait with no ACKs");
    fake_join(&f);
    ifd_producer_destroy(p);
}
END_TEST

/* ---- credit ------------------------------------------------------------------------------- */

typedef struct credit_case {
    int credit;
    int window_ms;      /* how long nothing may come once the client waits for credit */
    int use_credit_msg; /* wake the blocked send with CREDIT instead of ACK */
    atomic_int client;  /* the kernel id of the test's thread, which sends */
    atomic_int woke;    /* the fake is sending the ACK or CREDIT that frees a credit */
} credit_case;

static void script_credit(fake *f)
{
    credit_case *c = f->arg;
    FAKE_HELLO_WELCOME(f, c->credit, 0, 1);
    fmsg m;
    for (int b = 0; b < c->credit; b++) {
        FCHECK(f, fake_recv(f, &m, 10000), "batch %d never came", b);
        const char *why = fake_check_batch(&m, b, 1, 1, (size_t[]){4});
        fmsg_free(&m);
        FCHECK(f, why == NULL, "%s", why);
    }
    /* The client is out of credit: once it waits, nothing may come. */
    FCHECK(f, tu_thread_blocked(&c->client, NULL, 10000 * MS) == 1,
           "the client never waited for credit");
    FCHECK(f, !fake_recv(f, &m, c->window_ms), "a batch was sent with no credit (type %d)",
           hdr_type(&m));
    atomic_store(&c->woke, 1);
    if (c->use_credit_msg)
        fake_credit(f, 1);
    else
        fake_ack(f, 0);
    FCHECK(f, fake_recv(f, &m, 10000), "the blocked batch never came");
    const char *why = fake_check_batch(&m, c->credit, 1, 1, (size_t[]){4});
    fmsg_free(&m);
    FCHECK(f, why == NULL, "%s", why);
    /* The timed-out send must not arrive: the next message is END. */
    FCHECK(f, fake_recv(f, &m, 10000), "END never came");
    int t = hdr_type(&m);
    fmsg_free(&m);
    FCHECK(f, t == 6, "expected END after the timed-out send, got type %d", t);
    int first = c->use_credit_msg ? 0 : 1;
    for (int s = first; s <= c->credit; s++)
        fake_ack(f, s);
    fake_bye(f, "ok", "input_ended", c->credit);
}

START_TEST(test_credit_blocks)
{
    ifd_rng rng;
    seed_rng(&rng);
    credit_case c;
    memset(&c, 0, sizeof c);
    c.credit = (int)rand_between(&rng, 1, 6);
    c.window_ms = (int)rand_between(&rng, 100, 250);
    c.use_credit_msg = (int)rand_between(&rng, 0, 1);
    atomic_init(&c.client, tu_self_tid());
    atomic_init(&c.woke, 0);
    fake f;
    fake_start(&f, script_credit, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, NULL, &err), err);
    RC_OK(ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, 10000, &err), err);
    ifd_frame fr = {NULL, 4};
    for (int b = 0; b <= c.credit; b++) {
        unsigned char buf[4];
        fake_fill_pattern(buf, 4, b, 0);
        fr.data = buf;
        RC_OK(ifd_producer_send(p, 1, &fr, 1, -1, &err), err);
        /* The order of the events: sends with credit return before the fake frees a credit
         * (which it does only once the client waits), the send without after. */
        int woke = atomic_load(&c.woke);
        if (b < c.credit)
            RASSERT(!woke, "send %d of %d with credit waited for the daemon's %s", b, c.credit,
                    c.use_credit_msg ? "CREDIT" : "ACK");
        else
            RASSERT(woke, "send with no credit returned before the daemon's %s",
                    c.use_credit_msg ? "CREDIT" : "ACK");
    }
    RASSERT(ifd_producer_available(p) == 0, "available %" PRId64, ifd_producer_available(p));
    /* No credit: timeout 0 fails at once, a short timeout after it. */
    unsigned char junk[4] = {0};
    fr.data = junk;
    int rc = ifd_producer_send(p, 1, &fr, 1, 0, &err);
    RASSERT(rc == IFD_ETIMEDOUT, "send with no credit and timeout 0 returned %s", ifd_errname(rc));
    int t = (int)rand_between(&rng, 20, 80);
    int64_t t0 = ifd_clock_ns(), deadline = t0 + t * MS;
    rc = ifd_producer_send(p, 1, &fr, 1, t, &err);
    int64_t back = ifd_clock_ns();
    RASSERT(rc == IFD_ETIMEDOUT && back >= deadline && back - t0 < (t + 2000) * MS,
            "send with no credit returned %s after %" PRId64 " ns (timeout %d ms)", ifd_errname(rc),
            back - t0, t);
    RASSERT(ifd_producer_sent(p) == c.credit + 1, "a timed-out send counted as sent");
    RASSERT(ifd_producer_next_seq(p) == c.credit + 1, "a timed-out send used a seq");
    RC_OK(ifd_producer_end(p, 10000, &err), err);
    RASSERT(ifd_producer_acked_seq(p) == c.credit, "acked_seq %" PRId64, ifd_producer_acked_seq(p));
    fake_join(&f);
    ifd_producer_destroy(p);
}
END_TEST

/* ---- several steps in one message ------------------------------------------------------- */

typedef struct steps_case {
    int64_t b;     /* batch_size */
    int most;      /* max_steps_per_message */
    int k1, k2;    /* the two messages' steps */
    int64_t ack1;  /* the partial ACK: the first ack1 steps of message 1 */
    atomic_int go; /* the client checked what it could before the partial ACK */
} steps_case;

static void script_steps(fake *f)
{
    steps_case *c = f->arg;
    fmsg m;
    FCHECK(f, fake_recv(f, &m, 10000), "no HELLO");
    fmsg_free(&m);
    char json[512];
    snprintf(json, sizeof json,
             "{\"protocol\": 1, \"name\": \"p\", \"credit\": %d, \"next_seq\": 0, \"mode\": "
             "\"train\", \"batch_size\": %" PRId64 ", \"max_steps_per_message\": %d, "
             "\"replicas\": 1, \"schema\": []}",
             c->most + 1, c->b, c->most);
    fake_send(f, 2, NULL, 0, json);
    FCHECK(f, fake_recv(f, &m, 10000), "message 1 never came");
    const char *why =
        fake_check_batch(&m, 0, c->k1 * c->b, 1, (size_t[]){(size_t)(4 * c->k1 * c->b)});
    fmsg_free(&m);
    FCHECK(f, why == NULL, "%s", why);
    tu_wait_flag(&c->go, 10000 * MS);
    fake_ack_n(f, c->ack1 - 1, (uint32_t)c->ack1); /* the first steps of message 1 */
    FCHECK(f, fake_recv(f, &m, 10000), "message 2 never came");
    why = fake_check_batch(&m, c->k1, c->k2 * c->b, 1, (size_t[]){(size_t)(4 * c->k2 * c->b)});
    fmsg_free(&m);
    FCHECK(f, why == NULL, "%s", why);
    fake_error(f, "ERANGE", c->k1, c->k2, "refused");
    FCHECK(f, fake_recv(f, &m, 10000), "END never came");
    int t = hdr_type(&m);
    fmsg_free(&m);
    FCHECK(f, t == 6, "expected END, got type %d", t);
    fake_ack_n(f, c->k1 - 1, (uint32_t)(c->k1 - c->ack1)); /* the rest of message 1 */
    fake_bye(f, "ok", "input_ended", c->k1 - 1);
}

/* A batch of k x batch_size rows is k steps: k credits, k seqs, acknowledged step by step, and
 * an ERROR for it returns k. */
START_TEST(test_several_steps_in_one_message)
{
    ifd_rng rng;
    seed_rng(&rng);
    steps_case c = {.b = rand_between(&rng, 1, 5), .most = (int)rand_between(&rng, 3, 8)};
    c.k1 = (int)rand_between(&rng, 2, c.most);
    c.ack1 = rand_between(&rng, 1, c.k1 - 1);
    /* message 2 needs more credit than is left after message 1, and no more than the ACK frees */
    int64_t left = c.most + 1 - c.k1;
    c.k2 = (int)rand_between(&rng, left + 1, left + c.ack1 < c.most ? left + c.ack1 : c.most);
    fake f;
    fake_start(&f, script_steps, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, NULL, &err), err);
    RC_OK(ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, 10000, &err), err);
    unsigned char buf[4 * 8 * 5];
    fake_fill_pattern(buf, (size_t)(4 * c.k1 * c.b), 0, 0);
    ifd_frame fr = {buf, (size_t)(4 * c.k1 * c.b)};
    RC_OK(ifd_producer_send(p, c.k1 * c.b, &fr, 1, 10000, &err), err);
    RASSERT(ifd_producer_next_seq(p) == c.k1 && ifd_producer_in_flight(p) == c.k1 &&
                ifd_producer_available(p) == left,
            "after %d steps: next_seq %" PRId64 " in_flight %" PRId64 " available %" PRId64, c.k1,
            ifd_producer_next_seq(p), ifd_producer_in_flight(p), ifd_producer_available(p));
    fake_fill_pattern(buf, (size_t)(4 * c.k2 * c.b), c.k1, 0);
    fr.size = (size_t)(4 * c.k2 * c.b);
    RASSERT(ifd_producer_send(p, c.k2 * c.b, &fr, 1, 0, &err) == IFD_ETIMEDOUT,
            "a message of %d steps went with %" PRId64 " credits", c.k2, left);
    atomic_store(&c.go, 1);
    RC_OK(ifd_producer_send(p, c.k2 * c.b, &fr, 1, 10000, &err), err);
    RASSERT(ifd_producer_next_seq(p) == c.k1 + c.k2, "next_seq %" PRId64, ifd_producer_next_seq(p));
    RASSERT(ifd_producer_acked_seq(p) == c.ack1 - 1, "acked_seq %" PRId64,
            ifd_producer_acked_seq(p));
    int rc = ifd_producer_wait(p, 10000, &err);
    RASSERT(rc == IFD_ERANGE, "wait returned %s, expected the ERROR", ifd_errname(rc));
    RASSERT(ifd_producer_in_flight(p) == c.k1 - c.ack1, "in_flight %" PRId64 " after the ERROR",
            ifd_producer_in_flight(p));
    RC_OK(ifd_producer_end(p, 10000, &err), err);
    RASSERT(ifd_producer_in_flight(p) == 0 && ifd_producer_acked_seq(p) == c.k1 - 1,
            "in_flight %" PRId64 " acked_seq %" PRId64, ifd_producer_in_flight(p),
            ifd_producer_acked_seq(p));
    fake_join(&f);
    ifd_producer_destroy(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_batches");
    TCase *tc = tu_tcase(s, "producer", 60);
    tcase_add_test(tc, test_batches_end_bye);
    tcase_add_test(tc, test_end_bye_first);
    tcase_add_test(tc, test_end_timeout);
    tcase_add_test(tc, test_several_steps_in_one_message);
    tcase_add_test(tc, test_credit_blocks);
    return tu_run_suite(s);
}
