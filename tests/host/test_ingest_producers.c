/*
 * The ingest's stateful rules (docs/protocol.md: HELLO's names and slots, WELCOME's credit and
 * next_seq, BATCH's order, credit, duplicates, several steps, END and the input's end), on the
 * protocol side of host/ingest/ with the socket side replaced by tests/util/fake_ingest.c: no
 * socket, every reply recorded. Programs, credits, batch sizes, names and sequence numbers are
 * random; the seed is in every failure.
 */
#include "tests/util/fake_ingest.h"
#include "tests/util/testutil.h"
#include "tests/util/wait.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct t {
    fake_ingest f;
    ifd_rng rng;
    /* one batch's tensors (random floats, labels in range), as many rows as asked */
    char *data[IFD_MAX_INPUTS];
    ingest_span frames[IFD_MAX_INPUTS];
} t;

/* An ingest with random settings: at least min_steps steps a message (up to 3) and a credit of
 * at least min_credit (up to 12). Drawn so, not drawn again until they fit: IFD_TEST_SEED makes
 * every draw the same. */
static void setup_min(t *x, int input_mode, int min_steps, int min_credit)
{
    seed_rng(&x->rng);
    ifd_daemon_config c;
    ifd_daemon_config_defaults(&c);
    c.run.program = "softmax";
    c.run.settings.features = rand_between(&x->rng, 1, 16);
    c.run.settings.classes = rand_between(&x->rng, 2, 9);
    c.run.replicas = (int)rand_between(&x->rng, 1, 3);
    c.run.input_mode = input_mode;
    c.run.batch_size = c.run.replicas * rand_between(&x->rng, 1, 6);
    c.max_steps_per_message = (int)rand_between(&x->rng, min_steps > 1 ? min_steps : 1, 3);
    c.credit = (int)rand_between(
        &x->rng, c.max_steps_per_message > min_credit ? c.max_steps_per_message : min_credit, 12);
    c.max_producers = (int)rand_between(&x->rng, 2, 6);
    fake_ingest_init(&x->f, &c);
    memset(x->data, 0, sizeof x->data);
}

static void setup(t *x, int input_mode)
{
    setup_min(x, input_mode, 1, 0);
}

static void teardown(t *x)
{
    fake_ingest_free(&x->f);
    for (int i = 0; i < IFD_MAX_INPUTS; i++)
        free(x->data[i]);
}

/* x's frames for a message of `steps` batches. */
static int frames(t *x, int steps)
{
    const ingest_proto *pr = &x->f.g->pr;
    int64_t rows = steps * pr->batch_rows;
    for (int i = 0; i < pr->nin; i++) {
        size_t n = ingest_tensor_bytes(pr, i, rows);
        free(x->data[i]);
        x->data[i] = calloc(1, n ? n : 1);
        if (pr->in[i]->dtype == IFD_I32)
            for (size_t j = 0; j < n / 4; j++)
                ((int32_t *)x->data[i])[j] =
                    (int32_t)rand_between(&x->rng, 0, x->f.cfg.run.settings.classes - 1);
        x->frames[i] = (ingest_span){x->data[i], n};
    }
    return pr->nin;
}

static void batch(t *x, const char *rid, int64_t seq, int steps)
{
    int n = frames(x, steps);
    ifd_proto_batch bh = {
        .seq = seq, .rows = steps * x->f.g->pr.batch_rows, .ntensors = (uint32_t)n};
    fake_batch(&x->f, rid, &bh, x->frames, n);
}

static json_t *welcome_of(t *x, const char *rid)
{
    const fake_reply *r = fake_last(&x->f, rid);
    RASSERT(r && r->type == IFD_MSG_WELCOME, "expected WELCOME to %s, got %s", rid,
            r ? (r->type == IFD_MSG_ERROR ? r->text : "another reply") : "nothing");
    return r->json;
}

static int64_t welcome_int(t *x, const char *rid, const char *key)
{
    return json_integer_value(json_object_get(welcome_of(x, rid), key));
}

static void expect_error(t *x, const char *rid, int code, const char *part)
{
    const fake_reply *r = fake_last(&x->f, rid);
    RASSERT(r && r->type == IFD_MSG_ERROR, "expected ERROR %s to %s", ifd_errname(code), rid);
    RASSERT(r->code == code && strstr(r->text, part), "expected %s '%s', got %s '%s'",
            ifd_errname(code), part, ifd_errname(r->code), r->text);
}

static void hello_named(t *x, const char *rid, const char *name, int64_t first_seq)
{
    char json[160];
    snprintf(json, sizeof json, "{\"name\": \"%s\", \"first_seq\": %" PRId64 "}", name, first_seq);
    fake_hello(&x->f, rid, json);
}

/* HELLO as name from rid (first_seq 0), then n one-step batches from seq 0. */
static void stream(t *x, const char *rid, const char *name, int n)
{
    hello_named(x, rid, name, 0);
    for (int i = 0; i < n; i++)
        batch(x, rid, i, 1);
}

START_TEST(batch_or_end_before_hello_is_a_protocol_error)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    int64_t seq = rand_between(&x.rng, 0, 1000);
    batch(&x, "c1", seq, 1);
    char want[64];
    snprintf(want, sizeof want, "BATCH %" PRId64 " before HELLO", seq);
    expect_error(&x, "c1", IFD_EPROTO, want);
    fake_end(&x.f, "c2");
    expect_error(&x, "c2", IFD_EPROTO, "END before HELLO");
    ck_assert_int_eq(fake_consume(&x.f, -1), 0);
    teardown(&x);
}
END_TEST

START_TEST(hello_is_welcomed_with_credit_and_next_seq)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    int64_t first = rand_between(&x.rng, 0, 1 << 30);
    hello_named(&x, "c1", "loader", first);
    ck_assert_int_eq(welcome_int(&x, "c1", "credit"), x.f.g->pr.credit);
    ck_assert_int_eq(welcome_int(&x, "c1", "next_seq"), first);
    ck_assert_int_eq(welcome_int(&x, "c1", "batch_size"), x.f.g->pr.batch_rows);
    ck_assert_int_eq(welcome_int(&x, "c1", "protocol"), IFD_PROTOCOL_VERSION);
    ck_assert_str_eq(json_string_value(json_object_get(welcome_of(&x, "c1"), "name")), "loader");
    /* no name: one is made up */
    fake_hello(&x.f, "c2", "{}");
    ck_assert_str_eq(json_string_value(json_object_get(welcome_of(&x, "c2"), "name")),
                     "producer-1");
    /* a HELLO the protocol refuses changes nothing, and says why */
    fake_hello(&x.f, "c3", "{\"first_seq\": -1}");
    expect_error(&x, "c3", IFD_EINVAL, "HELLO: first_seq");
    teardown(&x);
}
END_TEST

START_TEST(batches_queue_in_order_and_are_acked_once_consumed)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    int64_t seq = rand_between(&x.rng, 0, 1 << 20);
    hello_named(&x, "c1", "p", seq);
    int n = (int)rand_between(&x.rng, 1, x.f.g->pr.credit);
    for (int i = 0; i < n; i++)
        batch(&x, "c1", seq + i, 1);
    ck_assert_int_eq(x.f.g->fifo.lanes[0].len, (size_t)n);
    int64_t expect = seq;
    for (host_batch *hb = x.f.g->fifo.lanes[0].head; hb; hb = hb->qnext, expect++) {
        ck_assert_int_eq(hb->b.seq, expect);
        ck_assert_uint_eq(hb->b.flags & IFD_BATCH_CHECKED, IFD_BATCH_CHECKED);
        ck_assert_str_eq(hb->b.producer, "p");
    }
    ck_assert_int_eq(fake_consume(&x.f, -1), n);
    const fake_reply *ack = fake_last(&x.f, "c1");
    ck_assert_int_eq(ack->type, IFD_MSG_ACK);
    ck_assert_int_eq(ack->seq, seq + n - 1);
    ck_assert_int_eq(ack->credit, n);
    /* the credit came back: a full credit's worth is taken again */
    for (int i = 0; i < x.f.g->pr.credit; i++)
        batch(&x, "c1", seq + n + i, 1);
    ck_assert_int_eq(x.f.g->fifo.lanes[0].len, (size_t)x.f.g->pr.credit);
    teardown(&x);
}
END_TEST

START_TEST(a_batch_beyond_the_credit_is_refused_with_its_credit)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    int credit = x.f.g->pr.credit;
    stream(&x, "c1", "p", credit);
    batch(&x, "c1", credit, 1);
    expect_error(&x, "c1", IFD_EPROTO, "no credit left");
    ck_assert_int_eq(fake_last(&x.f, "c1")->credit, 1);
    ck_assert_int_eq(fake_last(&x.f, "c1")->seq, credit);
    ck_assert_int_eq(x.f.g->fifo.lanes[0].len, (size_t)credit);
    teardown(&x);
}
END_TEST

START_TEST(a_refused_message_returns_every_credit_it_cost)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    hello_named(&x, "c1", "p", 0);
    int k = (int)rand_between(&x.rng, 1, x.f.g->pr.max_steps);
    int n = frames(&x, k);
    x.frames[rand_between(&x.rng, 0, n - 1)].len++; /* a byte too many */
    ifd_proto_batch bh = {.seq = 0, .rows = k * x.f.g->pr.batch_rows, .ntensors = (uint32_t)n};
    fake_batch(&x.f, "c1", &bh, x.frames, n);
    expect_error(&x, "c1", IFD_ESHAPE, "batch 0 from producer 'p': tensor '");
    ck_assert_int_eq(fake_last(&x.f, "c1")->credit, k);
    ck_assert_int_eq(x.f.g->producers[0].credit, x.f.g->pr.credit);
    /* and the next good one is taken */
    batch(&x, "c1", 0, 1);
    ck_assert_int_eq(x.f.g->fifo.lanes[0].len, 1);
    teardown(&x);
}
END_TEST

START_TEST(a_message_of_k_steps_is_k_batches)
{
    t x;
    setup_min(&x, IFD_INPUT_PER_HOST, 2, 0);
    int64_t seq = rand_between(&x.rng, 0, 1 << 20);
    hello_named(&x, "c1", "p", seq);
    int k = (int)rand_between(&x.rng, 2, x.f.g->pr.max_steps);
    batch(&x, "c1", seq, k);
    ck_assert_int_eq(x.f.g->fifo.lanes[0].len, (size_t)k);
    ck_assert_int_eq(x.f.g->producers[0].credit, x.f.g->pr.credit - k);
    int j = 0;
    for (host_batch *hb = x.f.g->fifo.lanes[0].head; hb; hb = hb->qnext, j++) {
        ck_assert_int_eq(hb->b.seq, seq + j);
        ck_assert_int_eq(hb->b.rows, x.f.g->pr.batch_rows);
    }
    ck_assert_int_eq(fake_consume(&x.f, -1), k);
    ck_assert_int_eq(fake_last(&x.f, "c1")->seq, seq + k - 1);
    teardown(&x);
}
END_TEST

/* The runtime's release only marks a batch consumed and asks for an ACK; the frames stay until
 * the I/O thread's ACK pass (where they were allocated), and a message's frames until all its
 * steps are acknowledged. */
START_TEST(released_frames_are_freed_by_the_ack_pass)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    hello_named(&x, "c1", "p", 0);
    int msgs = 0, steps = 0;
    while (steps < x.f.g->pr.credit) {
        int k = (int)rand_between(&x.rng, 1, x.f.g->pr.max_steps);
        if (steps + k > x.f.g->pr.credit)
            k = x.f.g->pr.credit - steps;
        batch(&x, "c1", steps, k);
        steps += k;
        msgs++;
    }
    ck_assert_int_eq(fake_release(&x.f, -1), steps);
    ck_assert_int_eq(x.f.frames_freed, 0);
    ck_assert_int_eq(__atomic_load_n(&x.f.g->acks_pending, __ATOMIC_ACQUIRE), 1);
    ck_assert_int_eq(fake_last(&x.f, "c1")->type, IFD_MSG_WELCOME); /* no ACK yet */
    ingest_send_acks(x.f.g);
    ck_assert_int_eq(x.f.frames_freed, msgs);
    ck_assert_int_eq(fake_last(&x.f, "c1")->type, IFD_MSG_ACK);
    ck_assert_int_eq(fake_last(&x.f, "c1")->seq, steps - 1);
    teardown(&x);
}
END_TEST

/* A release asks for ACKs and wakes the I/O thread only when it waits (or is about to): a busy
 * one is not woken, and polls without waiting next. Once a pass, whatever the releases. */
START_TEST(a_release_wakes_the_io_thread_only_when_it_waits)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    hello_named(&x, "c1", "p", 0);
    int ms = (int)rand_between(&x.rng, 1, 1000);
    int64_t seq = 0;
    for (int round = 0; round < 6; round++) {
        int waiting = (int)rand_between(&x.rng, 0, 1);
        int n = (int)rand_between(&x.rng, 1, x.f.g->pr.credit);
        for (int i = 0; i < n; i++)
            batch(&x, "c1", seq + i, 1);
        ck_assert_int_eq(ingest_io_wait_ms(x.f.g, ms), ms); /* nothing asked: it may wait */
        if (!waiting)
            ingest_io_awake(x.f.g); /* it found messages: busy with them */
        int wakes = x.f.wakes;
        ck_assert_int_eq(fake_release(&x.f, -1), n);
        ck_assert_int_eq(x.f.wakes - wakes, waiting);
        ck_assert_int_eq(__atomic_load_n(&x.f.g->acks_pending, __ATOMIC_ACQUIRE), 1);
        /* the next wait does not wait: the ACKs are due */
        ck_assert_int_eq(ingest_io_wait_ms(x.f.g, ms), 0);
        ingest_io_awake(x.f.g);
        ingest_send_acks(x.f.g);
        ck_assert_int_eq(fake_last(&x.f, "c1")->seq, seq + n - 1);
        seq += n;
    }
    teardown(&x);
}
END_TEST

/* The next batch of the single FIFO, not released. */
static ifd_batch *take(t *x)
{
    ifd_batch_source src = ifd_ingest_source(x->f.g);
    ifd_batch *b = NULL;
    ifd_error err;
    RC_OK(src.ops->try_next(src.ctx, &b, &err), err);
    return b;
}

/* While other batches wait in the FIFO (the producers are ahead), a release asks the I/O thread
 * for ACKs only once a quarter of the credit was released since its last ACK pass, and only on
 * a message's last step; the release that empties the FIFO asks whatever the count. One wake-up
 * a request, only while the thread waits; the ACK passes between acknowledge every release. */
START_TEST(releases_ask_for_acks_by_a_quarter_credit_while_batches_wait)
{
    t x;
    setup_min(&x, IFD_INPUT_PER_HOST, 1, 8); /* a quarter of it: 2 or more */
    ifd_ingest *g = x.f.g;
    int credit = g->pr.credit;
    int64_t every = ingest_ack_wake_steps(g);
    ck_assert_int_eq(every, credit / 4);
    hello_named(&x, "c1", "p", 0);
    int ms = (int)rand_between(&x.rng, 1, 1000);
    int64_t seq = 0;
    for (int round = 0; round < 4; round++) {
        int kmsg[64], nmsg = 0, steps = 0;
        while (steps < credit) {
            int k = (int)rand_between(&x.rng, 1, g->pr.max_steps);
            k = k < credit - steps ? k : credit - steps;
            batch(&x, "c1", seq + steps, k);
            kmsg[nmsg++] = k;
            steps += k;
        }
        ck_assert_int_eq(ingest_io_wait_ms(g, ms), ms);
        int waiting = 1, pending = 0, wakes = x.f.wakes;
        int64_t due = 0, left = steps, released = seq - 1;
        for (int m = 0; m < nmsg; m++) {
            for (int j = 0; j < kmsg[m]; j++) {
                ifd_batch *b = take(&x);
                ck_assert_int_eq(b->seq, released + 1);
                b->release(b, b->release_arg);
                released++;
                left--;
                due++;
                int ask = j == kmsg[m] - 1 && (left == 0 || due >= every);
                if (ask && !pending) {
                    wakes += waiting;
                    pending = 1;
                }
                RASSERT(x.f.wakes == wakes && g->acks_pending == pending,
                        "release of %" PRId64 " (%" PRId64 " due, %" PRId64 " left, every %" PRId64
                        "): %d wakes, pending %d; expected %d, %d",
                        released, due, left, every, x.f.wakes, g->acks_pending, wakes, pending);
                if (left > 0 && rand_between(&x.rng, 0, 3) == 0) { /* an ACK pass, a wait or not */
                    ingest_io_awake(g);
                    ingest_send_acks(g);
                    ck_assert_int_eq(fake_last(&x.f, "c1")->type, IFD_MSG_ACK);
                    ck_assert_int_eq(fake_last(&x.f, "c1")->seq, released);
                    pending = 0;
                    due = 0;
                    waiting = (int)rand_between(&x.rng, 0, 1);
                    ck_assert_int_eq(ingest_io_wait_ms(g, ms), ms);
                    if (!waiting)
                        ingest_io_awake(g);
                }
            }
        }
        ck_assert_int_eq(pending, 1); /* the last release emptied the FIFO */
        ingest_io_awake(g);
        ingest_send_acks(g);
        ck_assert_int_eq(fake_last(&x.f, "c1")->seq, seq + steps - 1);
        ck_assert_int_eq(g->producers[0].credit, credit);
        seq += steps;
    }
    teardown(&x);
}
END_TEST

typedef struct src_waiter {
    ifd_batch_source src;
    ifd_batch *b;
    int rc;
    ifd_error err;
    atomic_int tid, done;
    ifd_thread th;
} src_waiter;

static void *src_wait_main(void *arg)
{
    src_waiter *w = arg;
    atomic_store(&w->tid, tu_self_tid());
    w->rc = w->src.ops->next(w->src.ctx, &w->b, &w->err);
    atomic_store(&w->done, 1);
    return NULL;
}

/* The infeed waiting for a batch (the input waits on the producers): the steps released before
 * are asked for as it starts to wait, and every release while it waits asks at once. */
START_TEST(a_waiting_infeed_asks_for_acks_at_once)
{
    t x;
    setup_min(&x, IFD_INPUT_PER_HOST, 1, 8); /* a quarter of it: 2 or more */
    ifd_ingest *g = x.f.g;
    int ms = (int)rand_between(&x.rng, 1, 1000);
    hello_named(&x, "c1", "p", 0);
    int n = (int)rand_between(&x.rng, 3, g->pr.credit - 1);
    for (int i = 0; i < n; i++)
        batch(&x, "c1", i, 1);
    ifd_batch *held[64];
    for (int i = 0; i < n; i++)
        held[i] = take(&x);
    ck_assert_int_eq(ingest_io_wait_ms(g, ms), ms);
    int wakes = x.f.wakes;
    held[0]->release(held[0], held[0]->release_arg); /* n - 1 still queued, 1 < a quarter */
    ck_assert_int_eq(x.f.wakes, wakes);
    ck_assert_int_eq(g->acks_pending, 0);
    src_waiter w = {.src = ifd_ingest_source(g), .rc = -1};
    ck_assert_int_eq(ifd_thread_start(&w.th, "ifd-waiter", src_wait_main, &w), IFD_OK);
    tu_wait_blocked(&w.tid, &w.done, "the infeed's wait for a batch");
    ifd_mutex_lock(&g->fifo.mu); /* what the waiter wrote before it slept */
    ck_assert_int_eq(x.f.wakes, wakes + 1);
    ck_assert_int_eq(g->acks_pending, 1);
    ifd_mutex_unlock(&g->fifo.mu);
    ingest_io_awake(g);
    ingest_send_acks(g);
    ck_assert_int_eq(fake_last(&x.f, "c1")->seq, 0);
    int released = 1;
    while (released < n - 1) { /* each one asks, while the infeed waits */
        ck_assert_int_eq(ingest_io_wait_ms(g, ms), ms);
        held[released]->release(held[released], held[released]->release_arg);
        ck_assert_int_eq(x.f.wakes, wakes + 1 + released);
        ck_assert_int_eq(g->acks_pending, 1);
        ingest_io_awake(g);
        ingest_send_acks(g);
        ck_assert_int_eq(fake_last(&x.f, "c1")->seq, released);
        released++;
    }
    batch(&x, "c1", n, 1); /* the waiter's */
    ifd_thread_join(&w.th);
    RC_OK(w.rc, w.err);
    ck_assert_int_eq(w.b->seq, n);
    held[n - 1]->release(held[n - 1], held[n - 1]->release_arg);
    w.b->release(w.b, w.b->release_arg);
    ingest_send_acks(g);
    ck_assert_int_eq(fake_last(&x.f, "c1")->seq, n);
    ck_assert_int_eq(g->producers[0].credit, g->pr.credit);
    teardown(&x);
}
END_TEST

/* Acknowledged batches are kept for the next ones (at most the credit of them) and start clean:
 * a reused one is not acknowledged before it is consumed, and carries its own seq. */
START_TEST(acknowledged_batches_are_reused_clean)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    hello_named(&x, "c1", "p", 0);
    int credit = x.f.g->pr.credit;
    host_batch *seen[64];
    int nseen = 0;
    int64_t seq = 0;
    for (int round = 0; round < 6; round++) {
        int n = (int)rand_between(&x.rng, 1, credit);
        int spares = x.f.g->nspare;
        for (int i = 0; i < n; i++)
            batch(&x, "c1", seq + i, 1);
        ck_assert_int_eq(x.f.g->nspare, spares > n ? spares - n : 0); /* spares went first */
        int j = 0;
        for (host_batch *hb = x.f.g->fifo.lanes[0].head; hb; hb = hb->qnext, j++) {
            ck_assert_int_eq(hb->b.seq, seq + j);
            ck_assert_int_eq(hb->done, 0);
            ck_assert_ptr_null(hb->pred);
            ck_assert_str_eq(hb->b.producer, "p");
            int known = 0;
            for (int q = 0; q < nseen; q++)
                known |= seen[q] == hb;
            if (!known && nseen < 64)
                seen[nseen++] = hb;
        }
        int replies = x.f.nreplies;
        ingest_send_acks(x.f.g); /* nothing consumed: nothing acknowledged */
        ck_assert_int_eq(x.f.nreplies, replies);
        ck_assert_int_eq(fake_consume(&x.f, -1), n);
        ck_assert_int_eq(fake_last(&x.f, "c1")->seq, seq + n - 1);
        ck_assert_int_eq(fake_last(&x.f, "c1")->credit, n);
        ck_assert_int_le(x.f.g->nspare, credit);
        ck_assert_int_ge(x.f.g->nspare, n);
        seq += n;
    }
    /* never more batches than were in flight at once: the credit */
    ck_assert_int_le(nseen, credit);
    teardown(&x);
}
END_TEST

START_TEST(a_duplicate_is_acked_when_consumed_else_credited)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    if (x.f.g->pr.credit < 2) /* a resent batch costs a credit when it is sent */
        x.f.g->pr.credit = 2;
    int n = (int)rand_between(&x.rng, 1, x.f.g->pr.credit - 1);
    stream(&x, "c1", "p", n);
    /* in flight: CREDIT 1 now, nothing queued twice */
    int64_t dup = rand_between(&x.rng, 0, n - 1);
    batch(&x, "c1", dup, 1);
    ck_assert_int_eq(fake_last(&x.f, "c1")->type, IFD_MSG_CREDIT);
    ck_assert_int_eq(fake_last(&x.f, "c1")->credit, 1);
    ck_assert_int_eq(x.f.g->fifo.lanes[0].len, (size_t)n);
    /* consumed: ACK of that seq, credit 1 */
    fake_consume(&x.f, -1);
    batch(&x, "c1", dup, 1);
    ck_assert_int_eq(fake_last(&x.f, "c1")->type, IFD_MSG_ACK);
    ck_assert_int_eq(fake_last(&x.f, "c1")->seq, dup);
    ck_assert_int_eq(fake_last(&x.f, "c1")->credit, 1);
    ck_assert_int_eq(fake_consume(&x.f, -1), 0);
    teardown(&x);
}
END_TEST

START_TEST(hello_again_keeps_the_stream_and_its_batches_in_flight)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    int n = (int)rand_between(&x.rng, 0, x.f.g->pr.credit);
    stream(&x, "c1", "p", n);
    hello_named(&x, "c1", "p", 0);
    ck_assert_int_eq(welcome_int(&x, "c1", "credit"), x.f.g->pr.credit - n);
    ck_assert_int_eq(welcome_int(&x, "c1", "next_seq"), n);
    teardown(&x);
}
END_TEST

START_TEST(end_closes_the_stream_and_then_the_input)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    int producers = (int)rand_between(&x.rng, 1, x.f.cfg.max_producers);
    char rid[16], name[16];
    for (int i = 0; i < producers; i++) {
        snprintf(rid, sizeof rid, "c%d", i);
        snprintf(name, sizeof name, "p%d", i);
        hello_named(&x, rid, name, 0);
    }
    fake_end(&x.f, "c0");
    batch(&x, "c0", 0, 1);
    /* the last producer's END ends the input too, which its sentence says first */
    expect_error(&x, "c0", IFD_ECLOSED,
                 producers == 1 ? "the input has ended; no more batches are taken"
                                : "the producer sent END; send HELLO to start again");
    ck_assert_int_eq(x.f.g->input_closed, producers == 1);
    for (int i = 1; i < producers; i++) {
        snprintf(rid, sizeof rid, "c%d", i);
        fake_end(&x.f, rid);
    }
    ck_assert_int_eq(x.f.g->input_closed, 1);
    fake_hello(&x.f, "late", "{}");
    expect_error(&x, "late", IFD_ECLOSED, "HELLO: the input has ended");
    ifd_batch_source src = ifd_ingest_source(x.f.g);
    ifd_batch *b;
    ifd_error err;
    ck_assert_int_eq(src.ops->try_next(src.ctx, &b, &err), IFD_EEOF);
    teardown(&x);
}
END_TEST

START_TEST(expect_producers_keeps_the_input_open_until_that_many_ended)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    x.f.cfg.expect_producers = (int)rand_between(&x.rng, 2, x.f.cfg.max_producers);
    char rid[16];
    for (int i = 0; i < x.f.cfg.expect_producers; i++) {
        snprintf(rid, sizeof rid, "c%d", i);
        fake_hello(&x.f, rid, "{}");
        ck_assert_int_eq(welcome_int(&x, rid, "expect_producers"), x.f.cfg.expect_producers);
        fake_end(&x.f, rid);
        ck_assert_int_eq(x.f.g->input_closed, i + 1 == x.f.cfg.expect_producers);
    }
    teardown(&x);
}
END_TEST

START_TEST(a_live_name_is_busy_and_passes_once_its_connection_is_gone)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    int n = (int)rand_between(&x.rng, 0, x.f.g->pr.credit);
    stream(&x, "old", "loader", n);
    hello_named(&x, "new", "loader", 0);
    expect_error(&x, "new", IFD_EBUSY, "HELLO: name 'loader' is in use by another live connection");
    fake_set_gone("old", 1);
    x.f.g->producers[0].probe_ns = 0; /* probed afresh (the interval is the daemon's) */
    hello_named(&x, "new", "loader", 0);
    ck_assert_int_eq(welcome_int(&x, "new", "next_seq"), n);
    ck_assert_int_eq(welcome_int(&x, "new", "credit"), x.f.g->pr.credit - n);
    teardown(&x);
}
END_TEST

START_TEST(producers_beyond_max_producers_are_refused)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    char rid[16];
    for (int i = 0; i < x.f.cfg.max_producers; i++) {
        snprintf(rid, sizeof rid, "c%d", i);
        fake_hello(&x.f, rid, "{}");
        welcome_of(&x, rid);
    }
    fake_hello(&x.f, "more", "{}");
    char want[96];
    snprintf(want, sizeof want, "HELLO: too many producers: expected at most %d",
             x.f.cfg.max_producers);
    expect_error(&x, "more", IFD_EINVAL, want);
    /* a slot whose producer ended with nothing in flight is given to the newcomer */
    fake_end(&x.f, "c0");
    fake_hello(&x.f, "more", "{}");
    welcome_of(&x, "more");
    teardown(&x);
}
END_TEST

START_TEST(a_connection_starts_at_most_8_names)
{
    t x;
    setup(&x, IFD_INPUT_PER_HOST);
    char name[16];
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "n%d", i);
        hello_named(&x, "c1", name, 0);
        welcome_of(&x, "c1");
    }
    hello_named(&x, "c1", "n8", 0);
    expect_error(&x, "c1", IFD_EINVAL, "this connection has started 8 producer names already");
    /* a name it used before is not new */
    hello_named(&x, "c1", "n3", 0);
    welcome_of(&x, "c1");
    teardown(&x);
}
END_TEST

START_TEST(per_core_batches_go_to_their_replicas_queue)
{
    t x;
    setup(&x, IFD_INPUT_PER_CORE);
    int r = (int)rand_between(&x.rng, 0, x.f.cfg.run.replicas - 1);
    char json[64];
    snprintf(json, sizeof json, "{\"replica\": %d}", r);
    fake_hello(&x.f, "c1", json);
    ck_assert_int_eq(welcome_int(&x, "c1", "replica"), r);
    int n = (int)rand_between(&x.rng, 1, x.f.g->pr.credit);
    for (int i = 0; i < n; i++)
        batch(&x, "c1", i, 1);
    for (int q = 0; q < x.f.cfg.run.replicas; q++)
        ck_assert_int_eq(x.f.g->fifo.lanes[q].len, q == r ? (size_t)n : 0);
    ck_assert_int_eq(fake_consume(&x.f, r), n);
    teardown(&x);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ingest_producers");
    TCase *tc = tu_tcase(s, "hello", 30);
    tcase_add_loop_test(tc, batch_or_end_before_hello_is_a_protocol_error, 0, 10);
    tcase_add_loop_test(tc, hello_is_welcomed_with_credit_and_next_seq, 0, 10);
    tcase_add_loop_test(tc, hello_again_keeps_the_stream_and_its_batches_in_flight, 0, 10);
    tcase_add_loop_test(tc, a_live_name_is_busy_and_passes_once_its_connection_is_gone, 0, 10);
    tcase_add_loop_test(tc, producers_beyond_max_producers_are_refused, 0, 10);
    tcase_add_loop_test(tc, a_connection_starts_at_most_8_names, 0, 3);
    tc = tu_tcase(s, "batch", 30);
    tcase_add_loop_test(tc, batches_queue_in_order_and_are_acked_once_consumed, 0, 10);
    tcase_add_loop_test(tc, a_batch_beyond_the_credit_is_refused_with_its_credit, 0, 10);
    tcase_add_loop_test(tc, a_refused_message_returns_every_credit_it_cost, 0, 10);
    tcase_add_loop_test(tc, a_message_of_k_steps_is_k_batches, 0, 10);
    tcase_add_loop_test(tc, a_duplicate_is_acked_when_consumed_else_credited, 0, 10);
    tcase_add_loop_test(tc, per_core_batches_go_to_their_replicas_queue, 0, 10);
    tcase_add_loop_test(tc, released_frames_are_freed_by_the_ack_pass, 0, 10);
    tcase_add_loop_test(tc, acknowledged_batches_are_reused_clean, 0, 10);
    tcase_add_loop_test(tc, a_release_wakes_the_io_thread_only_when_it_waits, 0, 10);
    tcase_add_loop_test(tc, releases_ask_for_acks_by_a_quarter_credit_while_batches_wait, 0, 10);
    tcase_add_loop_test(tc, a_waiting_infeed_asks_for_acks_at_once, 0, 5);
    tc = tu_tcase(s, "end", 30);
    tcase_add_loop_test(tc, end_closes_the_stream_and_then_the_input, 0, 10);
    tcase_add_loop_test(tc, expect_producers_keeps_the_input_open_until_that_many_ended, 0, 10);
    return tu_run_suite(s);
}
