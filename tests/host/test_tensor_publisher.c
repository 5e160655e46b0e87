/*
 * Tensor messages on the PUB socket (host/publisher.c, docs/summaries.md "Tensor messages"): a
 * subscription to "tensor:NAME" asks for NAME; what is asked for arrives in order as three frames
 * (topic, JSON header, data), several consecutive steps of a loop to a message, each step's
 * rows and data as written, and before the summary that follows them; what is not asked for is
 * never sent; an unsubscription ends it; the byte rate drops, never waits; a subscription to
 * "tensor-shm:NAME" gets the same steps as notices of data in the shared-memory ring (or as data
 * messages without a ring), and a subscriber that reads late loses what the ring wrote over.
 * Tests wait for the subscription to be seen, never for a fixed time.
 */
#include "core/thread.h"
#include "host/limits.h"
#include "host/publisher.h"
#include "host/tensor_ring.h"
#include "tests/util/testutil.h"

#include <jansson.h>
#include <string.h>
#include <zmq.h>

typedef struct pub_fixture {
    void *zctx, *sub;
    ifd_publisher *pub;
    const ifd_tensor_sink *ts;
} pub_fixture;

static void fixture_open(pub_fixture *f, int64_t rate)
{
    ifd_error err;
    f->zctx = zmq_ctx_new();
    RC_OK(ifd_publisher_create(&f->pub, f->zctx, "tcp://127.0.0.1:*", NULL, NULL, 16,
                               IFD_MODE_TRAIN, rate, &err),
          err);
    RC_OK(ifd_publisher_start(f->pub, &err), err);
    f->ts = ifd_publisher_tensor_sink(f->pub);
    f->sub = zmq_socket(f->zctx, ZMQ_SUB);
    int linger = 0;
    zmq_setsockopt(f->sub, ZMQ_LINGER, &linger, sizeof linger);
    ck_assert_int_eq(zmq_connect(f->sub, ifd_publisher_endpoint(f->pub)), 0);
}

static void fixture_close(pub_fixture *f)
{
    zmq_close(f->sub);
    ifd_publisher_destroy(f->pub);
    zmq_ctx_term(f->zctx);
}

static void subscribe(pub_fixture *f, const char *topic, int on)
{
    ck_assert_int_eq(
        zmq_setsockopt(f->sub, on ? ZMQ_SUBSCRIBE : ZMQ_UNSUBSCRIBE, topic, strlen(topic)), 0);
}

/* Waits (the event: the publisher thread read the subscription) until the sink's answer for name
 * is want. */
static void wait_wants(pub_fixture *f, const char *name, int want)
{
    int64_t deadline = ifd_clock_ns() + INT64_C(10000000000);
    while ((ifd_publisher_tensor_wanted(f->pub, name) != 0) != want) {
        RASSERT(ifd_clock_ns() < deadline, "the publisher never saw the %s of tensor '%s'",
                want ? "subscription" : "unsubscription", name);
        ifd_sleep_ns(1000000);
    }
}

/* Subscribes to the summaries and to tensors names[0..n), and waits until the publisher saw
 * the tensors' subscriptions. */
static void subscribe_all(pub_fixture *f, const char *const *names, int n)
{
    subscribe(f, "{", 1);
    for (int i = 0; i < n; i++) {
        char topic[80];
        snprintf(topic, sizeof topic, "tensor:%s", names[i]);
        subscribe(f, topic, 1);
    }
    for (int i = 0; i < n; i++)
        wait_wants(f, names[i], 1);
}

/* Receives one frame (10 s at most) into a zmq message. */
static void recv_frame(void *sock, zmq_msg_t *m, int *more)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    RASSERT(zmq_poll(&it, 1, 10000) == 1, "no message within 10 s");
    zmq_msg_init(m);
    ck_assert_int_ge(zmq_msg_recv(m, sock, 0), 0);
    *more = zmq_msg_more(m);
}

/* Hands one step's tensors to the sink, as the outfeed thread does. */
static void write_step(pub_fixture *f, int64_t step, int n, const char *const *names,
                       const ifd_tensor *ts)
{
    ifd_step_tensors st = {.global_step = step, .ntensors = n, .names = names, .tensors = ts};
    ifd_error err;
    RC_OK(f->ts->write(f->ts->ctx, &st, &err), err);
}

/* The end of a device loop, as the outfeed thread says it. */
static void flush_loop(pub_fixture *f)
{
    ifd_error err;
    RC_OK(f->ts->flush(f->ts->ctx, &err), err);
}

/* A tensor of rows rows of row shape row[0..rank-1) (random data). */
static void random_rows(ifd_rng *rng, ifd_tensor *t, ifd_dtype dt, int rank, const int64_t *row,
                        int64_t rows)
{
    int64_t dims[IFD_MAX_RANK] = {rows};
    for (int i = 1; i < rank; i++)
        dims[i] = row[i - 1];
    ck_assert_int_eq(ifd_tensor_init(t, dt, rank, dims, NULL), IFD_OK);
    t->data = malloc(ifd_tensor_nbytes(t) + 1);
    uint32_t *w = t->data;
    for (int64_t i = 0; i < ifd_tensor_numel(t); i++)
        w[i] = (uint32_t)ifd_rng_next(rng);
}

static void random_tensor(ifd_rng *rng, ifd_tensor *t)
{
    int64_t row[2] = {rand_between(rng, 1, 7), rand_between(rng, 1, 7)};
    random_rows(rng, t, rand_between(rng, 0, 1) ? IFD_F32 : IFD_I32, (int)rand_between(rng, 1, 3),
                row, rand_between(rng, 1, 7));
}

/* One tensor message as received: its header's fields and its data. */
typedef struct tensor_msg {
    char name[64];
    ifd_dtype dtype;
    int rank; /* of a step's tensor: row_shape's and the rows */
    int64_t row[IFD_MAX_RANK];
    int nsteps;
    int64_t *steps, *rows;
    zmq_msg_t data;
} tensor_msg;

static void tensor_msg_free(tensor_msg *m)
{
    free(m->steps);
    free(m->rows);
    zmq_msg_close(&m->data);
}

static void int_list(json_t *a, int64_t **out, int *n)
{
    RASSERT(json_is_array(a), "expected a list of integers");
    *n = (int)json_array_size(a);
    *out = calloc((size_t)*n + 1, sizeof **out);
    for (int i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        RASSERT(json_is_integer(v), "expected an integer at %d", i);
        (*out)[i] = json_integer_value(v);
    }
}

/* Receives a tensor message: the topic "tensor:NAME", the header (checked against the data
 * frame's size) and the data. */
static void recv_tensor(void *sock, tensor_msg *t)
{
    zmq_msg_t m;
    int more;
    recv_frame(sock, &m, &more);
    const char *topic = zmq_msg_data(&m);
    size_t tn = zmq_msg_size(&m);
    RASSERT(more && tn > 7 && tn < 7 + sizeof t->name && memcmp(topic, "tensor:", 7) == 0,
            "expected a tensor topic, got %zu bytes '%.*s'", tn, (int)tn, topic);
    memcpy(t->name, topic + 7, tn - 7);
    t->name[tn - 7] = '\0';
    zmq_msg_close(&m);
    recv_frame(sock, &m, &more);
    ck_assert(more);
    json_error_t je;
    json_t *h = json_loadb(zmq_msg_data(&m), zmq_msg_size(&m), 0, &je);
    zmq_msg_close(&m);
    RASSERT(h != NULL, "the header is not JSON: %s", je.text);
    ck_assert_str_eq(json_string_value(json_object_get(h, "event")), "tensor");
    ck_assert_str_eq(json_string_value(json_object_get(h, "mode")), "train");
    ck_assert_str_eq(json_string_value(json_object_get(h, "name")), t->name);
    ck_assert_int_eq(ifd_dtype_parse(json_string_value(json_object_get(h, "dtype")), &t->dtype),
                     IFD_OK);
    int64_t *row;
    int nrow, nrows;
    int_list(json_object_get(h, "row_shape"), &row, &nrow);
    t->rank = nrow + 1;
    for (int i = 0; i < nrow; i++)
        t->row[i] = row[i];
    free(row);
    int_list(json_object_get(h, "global_steps"), &t->steps, &t->nsteps);
    int_list(json_object_get(h, "rows"), &t->rows, &nrows);
    ck_assert_int_eq(nrows, t->nsteps);
    ck_assert_int_ge(t->nsteps, 1);
    json_decref(h);
    recv_frame(sock, &t->data, &more);
    ck_assert(!more);
    size_t rowbytes = ifd_dtype_size(t->dtype), want = 0;
    for (int i = 0; i < nrow; i++)
        rowbytes *= (size_t)t->row[i];
    for (int i = 0; i < t->nsteps; i++)
        want += (size_t)t->rows[i] * rowbytes;
    RASSERT(zmq_msg_size(&t->data) == want, "tensor '%s': %d steps of %zu bytes, the data is %zu",
            t->name, t->nsteps, want, zmq_msg_size(&t->data));
}

/* Receives the tensor messages for name until the steps step[0..n) with the tensors want[0..n)
 * came, in order; every message's steps are consecutive and lie within one loop (loop_of: a
 * step's loop), and a message holds at most IFD_PUB_TENSOR_STEPS_MAX steps and
 * IFD_PUB_TENSOR_MESSAGE_BYTES unless it is one step. Returns the most steps one message held. */
static int expect_steps(void *sock, const char *name, const int64_t *step, const ifd_tensor *want,
                        int64_t n, const int64_t *loop_of)
{
    int64_t k = 0;
    int most = 0;
    while (k < n) {
        tensor_msg t;
        recv_tensor(sock, &t);
        ck_assert_str_eq(t.name, name);
        RASSERT(t.nsteps <= IFD_PUB_TENSOR_STEPS_MAX, "%d steps in a message", t.nsteps);
        RASSERT(t.nsteps == 1 || zmq_msg_size(&t.data) <= IFD_PUB_TENSOR_MESSAGE_BYTES,
                "%d steps and %zu bytes in one message", t.nsteps, zmq_msg_size(&t.data));
        const char *at = zmq_msg_data(&t.data);
        int64_t first = k;
        for (int i = 0; i < t.nsteps; i++, k++) {
            RASSERT(k < n, "more steps than were written (%lld)", (long long)n);
            const ifd_tensor *w = &want[k];
            ck_assert_int_eq(t.steps[i], step[k]);
            RASSERT(i == 0 || t.steps[i] == t.steps[i - 1] + 1,
                    "a message holds step %lld after step %lld", (long long)t.steps[i],
                    (long long)t.steps[i - 1]);
            RASSERT(loop_of[k] == loop_of[first],
                    "a message holds step %lld of loop %lld and step %lld of loop %lld",
                    (long long)step[first], (long long)loop_of[first], (long long)step[k],
                    (long long)loop_of[k]);
            ck_assert_int_eq(t.rows[i], w->shape.dims[0]);
            ck_assert_int_eq(t.dtype, w->dtype);
            ck_assert_int_eq(t.rank, w->shape.rank);
            for (int d = 1; d < w->shape.rank; d++)
                ck_assert_int_eq(t.row[d - 1], w->shape.dims[d]);
            size_t nb = ifd_tensor_nbytes(w);
            RASSERT(memcmp(at, w->data, nb) == 0, "step %lld's data differ", (long long)step[k]);
            at += nb;
        }
        if (t.nsteps > most)
            most = t.nsteps;
        tensor_msg_free(&t);
    }
    return most;
}

/* Frees n steps' tensors and the arrays of a test's steps. */
static void free_steps(ifd_tensor *ts, int64_t n, int64_t *step, int64_t *loop)
{
    for (int64_t s = 0; s < n; s++)
        free(ts[s].data);
    free(ts);
    free(step);
    free(loop);
}

/* What a subscriber asks for arrives, what it does not is never sent: random steps (rows that
 * differ from step to step, sizes on both sides of IFD_PUB_TENSOR_MESSAGE_BYTES) in loops of
 * random length; a message gathers consecutive steps of one loop, and everything gathered goes
 * before a summary. */
START_TEST(asked_tensors_arrive_in_order_and_others_are_not_sent)
{
    ifd_rng rng;
    seed_rng(&rng);
    pub_fixture f;
    fixture_open(&f, INT64_C(1) << 40);
    subscribe_all(&f, (const char *const[]){"wanted"}, 1);
    ck_assert(!ifd_publisher_tensor_wanted(f.pub, "other"));
    ck_assert(!ifd_publisher_tensor_wanted(f.pub, "want")); /* a name, not a prefix */
    /* at most half the subscriber's queue (IFD_PUB_SNDHWM) of messages (a message holds a step
     * at least), read after they are all written: ZeroMQ drops what goes beyond a queue that
     * libzmq's I/O threads have not emptied meanwhile (slow under TSan; seed 54065675831498 sent
     * 261 messages there, and some never came) */
    int64_t steps = rand_between(&rng, 1, IFD_PUB_SNDHWM / 2), step0 = rand_between(&rng, 0, 1000);
    int64_t ipl = rand_between(&rng, 1, 40);
    /* a row of 4 to 4096 bytes, up to 8 or 64 rows a step: a step of up to 256 KiB */
    int rank = (int)rand_between(&rng, 1, 3);
    int64_t row[2] = {rand_between(&rng, 1, 32), rand_between(&rng, 1, 32)};
    ifd_dtype dt = rand_between(&rng, 0, 1) ? IFD_F32 : IFD_I32;
    int64_t most_rows = rand_between(&rng, 0, 1) ? 8 : 64;
    ifd_tensor *ts = calloc((size_t)steps, sizeof *ts);
    int64_t *step = calloc((size_t)steps, sizeof *step),
            *loop = calloc((size_t)steps, sizeof *loop);
    ifd_error err;
    const char *const names[2] = {"other", "wanted"};
    for (int64_t s = 0; s < steps; s++) {
        random_rows(&rng, &ts[s], dt, rank, row, rand_between(&rng, 0, most_rows));
        /* now and then steps nobody took (no subscriber then) come between */
        step[s] = s == 0 ? step0 : step[s - 1] + 1 + (rand_between(&rng, 0, 9) ? 0 : 2);
        loop[s] = s / ipl;
        ifd_tensor pair[2] = {ts[s], ts[s]};
        write_step(&f, step[s], 2, names, pair);
        if ((s + 1) % ipl == 0)
            flush_loop(&f);
    }
    ifd_sink *sink = ifd_publisher_sink(f.pub);
    RC_OK(ifd_sink_write(sink, "{\"event\":\"end\"}", 15, &err), err);
    int most = expect_steps(f.sub, "wanted", step, ts, steps, loop);
    zmq_msg_t m;
    int more;
    recv_frame(f.sub, &m, &more); /* the summary: one frame, after the tensors */
    ck_assert(!more);
    ck_assert_uint_eq(zmq_msg_size(&m), 15);
    zmq_msg_close(&m);
    /* two steps of a loop that fit in one message went together */
    if (ipl > 1 && steps > 1 && step[1] == step[0] + 1 &&
        ifd_tensor_nbytes(&ts[0]) + ifd_tensor_nbytes(&ts[1]) <= IFD_PUB_TENSOR_MESSAGE_BYTES)
        RASSERT(most > 1, "every message held one step (loops of %lld)", (long long)ipl);
    ifd_publisher_tensors st;
    ifd_publisher_tensor_stats(f.pub, &st);
    ck_assert_int_eq(st.sent_steps, steps);
    ck_assert_int_ge(st.sent, (steps + ipl - 1) / ipl);
    ck_assert_int_eq(st.pending_bytes, 0);
    ck_assert_int_eq(st.subscribed, 1);
    /* unsubscribed: the tensor is no longer asked for */
    subscribe(&f, "tensor:wanted", 0);
    wait_wants(&f, "wanted", 0);
    free_steps(ts, steps, step, loop);
    fixture_close(&f);
}
END_TEST

/* A summary in the middle of a loop: what was gathered goes before it, the rest after it. */
START_TEST(a_summary_goes_after_the_steps_before_it)
{
    ifd_rng rng;
    seed_rng(&rng);
    pub_fixture f;
    fixture_open(&f, INT64_C(1) << 40);
    const char *const names[2] = {"a", "b"};
    subscribe_all(&f, names, 2);
    int64_t before = rand_between(&rng, 1, 30), after = rand_between(&rng, 1, 30);
    int64_t n = before + after;
    ifd_tensor *ta = calloc((size_t)n, sizeof *ta), *tb = calloc((size_t)n, sizeof *tb);
    int64_t *step = calloc((size_t)n, sizeof *step), *loop = calloc((size_t)n, sizeof *loop);
    ifd_error err;
    /* each tensor's dtype and row shape stay (a change starts a new message) */
    int64_t ra[1] = {rand_between(&rng, 1, 5)}, rb[1] = {rand_between(&rng, 1, 5)};
    for (int64_t s = 0; s < n; s++) {
        random_rows(&rng, &ta[s], IFD_F32, 2, ra, rand_between(&rng, 0, 9));
        random_rows(&rng, &tb[s], IFD_I32, 1, rb, rand_between(&rng, 0, 9));
        step[s] = s + 1;
        loop[s] = s < before ? 0 : 1;
        ifd_tensor pair[2] = {ta[s], tb[s]};
        write_step(&f, step[s], 2, names, pair);
        if (s + 1 == before)
            RC_OK(ifd_sink_write(ifd_publisher_sink(f.pub), "{\"global_step\":1}", 17, &err), err);
    }
    flush_loop(&f);
    /* a's and b's steps before the summary, in the order of the step's tensors */
    expect_steps(f.sub, "a", step, ta, before, loop);
    expect_steps(f.sub, "b", step, tb, before, loop);
    zmq_msg_t m;
    int more;
    recv_frame(f.sub, &m, &more);
    RASSERT(!more && zmq_msg_size(&m) == 17, "expected the summary, got %zu bytes",
            zmq_msg_size(&m));
    zmq_msg_close(&m);
    expect_steps(f.sub, "a", step + before, ta + before, after, loop + before);
    expect_steps(f.sub, "b", step + before, tb + before, after, loop + before);
    for (int64_t s = 0; s < n; s++) {
        free(ta[s].data);
        free(tb[s].data);
    }
    free(ta);
    free(tb);
    free(step);
    free(loop);
    fixture_close(&f);
}
END_TEST

/* A byte rate of r with messages of b bytes: what went out is bounded by a second's worth plus
 * what the elapsed time refilled, and the rest was dropped, not waited for. */
START_TEST(the_byte_rate_drops_what_exceeds_it)
{
    ifd_rng rng;
    seed_rng(&rng);
    pub_fixture f;
    int64_t rate = rand_between(&rng, 200, 2000);
    fixture_open(&f, rate);
    subscribe_all(&f, (const char *const[]){"x"}, 1);
    ifd_tensor t;
    random_tensor(&rng, &t);
    int64_t n = rand_between(&rng, 20, 60);
    const char *const names[1] = {"x"};
    int64_t t0 = ifd_clock_ns();
    for (int64_t s = 0; s < n; s++) {
        write_step(&f, s, 1, names, &t);
        flush_loop(&f); /* loops of one step: a message a step */
    }
    double elapsed = (double)(ifd_clock_ns() - t0) / 1e9;
    ifd_publisher_tensors st;
    ifd_publisher_tensor_stats(f.pub, &st);
    /* the message's bytes: the topic, the header (at least 100 bytes) and the data */
    double bytes = (double)(strlen("tensor:x") + 100 + ifd_tensor_nbytes(&t));
    int64_t most = (int64_t)((double)rate * (1.0 + elapsed) / bytes) + 1;
    ck_assert_int_eq(st.rate, rate);
    RASSERT(n - st.limited <= most,
            "%lld of %lld messages of about %.0f bytes passed a rate of %lld bytes/s in %.3f s",
            (long long)(n - st.limited), (long long)n, bytes, (long long)rate, elapsed);
    ck_assert_int_ge(st.limited, n - most);
    ck_assert_int_eq(st.limited_steps, st.limited); /* a step a message */
    ck_assert_int_le(st.sent_steps, n - st.limited_steps);
    free(t.data);
    fixture_close(&f);
}
END_TEST

/* Steps of one tensor x, rows rows of 256 floats each, written from step *at on (one loop,
 * no flush); their tensors in ts[0..n). */
static void write_loop(pub_fixture *f, ifd_rng *rng, int64_t *at, ifd_tensor *ts, int64_t n,
                       int64_t min_rows, int64_t max_rows)
{
    const char *const names[1] = {"x"};
    int64_t row[1] = {256};
    for (int64_t s = 0; s < n; s++) {
        random_rows(rng, &ts[s], IFD_F32, 2, row, rand_between(rng, min_rows, max_rows));
        write_step(f, (*at)++, 1, names, &ts[s]);
    }
}

/* A publisher without a byte rate to speak of and a subscriber to tensor x; the wake-ups so
 * far. */
static int64_t open_for_x(pub_fixture *f)
{
    fixture_open(f, INT64_C(1) << 40);
    subscribe_all(f, (const char *const[]){"x"}, 1);
    ifd_publisher_tensors st;
    ifd_publisher_tensor_stats(f->pub, &st);
    return st.wakes;
}

/* The messages of a loop that fill before its end wait for it: the publisher thread is woken
 * once a loop, not once a message (each wake-up is one of libzmq's I/O thread and of every
 * subscriber too). Loops of up to 960 KiB, under IFD_PUB_TENSOR_WAKE_BYTES; each loop's steps
 * arrive, in order, before the next loop is written. */
START_TEST(a_loop_s_messages_wake_the_publisher_once)
{
    ifd_rng rng;
    seed_rng(&rng);
    pub_fixture f;
    int64_t wakes0 = open_for_x(&f), at = rand_between(&rng, 0, 1000);
    ifd_publisher_tensors st;
    int loops = (int)rand_between(&rng, 1, 5);
    for (int l = 0; l < loops; l++) {
        /* 12 to 40 steps of 8 to 24 KiB: two messages a loop at least; the first loop's steps
         * 16 KiB each, 4 to a message, so that its last message fills at its last step and
         * nothing is left gathering when it ends */
        int64_t n = l == 0 ? 4 * rand_between(&rng, 3, 10) : rand_between(&rng, 12, 40);
        int64_t step[40], loop[40] = {0};
        ifd_tensor ts[40];
        for (int64_t s = 0; s < n; s++)
            step[s] = at + s;
        write_loop(&f, &rng, &at, ts, n, l == 0 ? 16 : 8, l == 0 ? 16 : 24);
        ck_assert_int_lt(n * 24 * 1024, IFD_PUB_TENSOR_WAKE_BYTES);
        flush_loop(&f);
        expect_steps(f.sub, "x", step, ts, n, loop);
        for (int64_t s = 0; s < n; s++)
            free(ts[s].data);
    }
    ifd_publisher_tensor_stats(f.pub, &st);
    RASSERT(st.sent >= 2 * loops, "%lld messages in %d loops", (long long)st.sent, loops);
    RASSERT(st.wakes - wakes0 == loops,
            "the publisher thread was woken %lld times for %lld messages in %d loops",
            (long long)(st.wakes - wakes0), (long long)st.sent, loops);
    fixture_close(&f);
}
END_TEST

/* A long loop does not wait for its end once IFD_PUB_TENSOR_WAKE_BYTES of its messages, or
 * IFD_PUB_TENSOR_WAKE_MESSAGES of them (steps with gaps between them: a message each), wait in
 * the outbox: the publisher thread is woken before the loop ends (its own poll's timeout, a
 * tenth of a second, could take some of them meanwhile: written until the wake, up to 8 times
 * the bytes' mark, 3 times the messages' mark, under a subscriber's queue), and every step
 * arrives in order. */
START_TEST(a_long_loop_wakes_the_publisher_at_the_mark)
{
    ifd_rng rng;
    seed_rng(&rng);
    pub_fixture f;
    int64_t wakes0 = open_for_x(&f), at = rand_between(&rng, 0, 1000), first = at;
    ifd_publisher_tensors st = {.wakes = wakes0};
    int by_count = (int)(_i % 2); /* the loop's index: each mark */
    int64_t max_steps =
        by_count ? 3 * IFD_PUB_TENSOR_WAKE_MESSAGES : 8 * IFD_PUB_TENSOR_WAKE_BYTES / (8 * 1024);
    ifd_tensor *ts = calloc((size_t)max_steps, sizeof *ts);
    int64_t *step = calloc((size_t)max_steps, sizeof *step),
            *loop = calloc((size_t)max_steps, sizeof *loop);
    int64_t n = 0;
    while (n < max_steps && st.wakes == wakes0) {
        if (by_count && n)
            at += rand_between(&rng, 1, 3); /* a gap: the next step starts a message */
        step[n] = at;
        write_loop(&f, &rng, &at, &ts[n], 1, by_count ? 0 : 8, by_count ? 2 : 64);
        n++;
        ifd_publisher_tensor_stats(f.pub, &st);
    }
    RASSERT(st.wakes > wakes0, "%lld steps of a loop from step %lld, no wake-up (%s)", (long long)n,
            (long long)first, by_count ? "a message each" : "8 to 64 KiB each");
    flush_loop(&f);
    expect_steps(f.sub, "x", step, ts, n, loop);
    free_steps(ts, n, step, loop);
    fixture_close(&f);
}
END_TEST

/* The data frames' buffers come back from libzmq once sent and the next loop's messages take them
 * (host/tensor_pool.h): loops of 64 KiB messages (4 steps of 16 KiB each), each received whole;
 * once libzmq has given every buffer back (the event waited for), the next loop's messages, a
 * buffer each, reuse at least as many of the 64 KiB buffers kept as there are (every buffer
 * made is kept: the first message's grew through one of 16 and one of 32 KiB; more when the
 * publisher thread's poll timeout sent some of the loop's messages before its end), and every
 * step still arrives as written. */
START_TEST(sent_messages_give_their_buffers_back_for_the_next_loop)
{
    ifd_rng rng;
    seed_rng(&rng);
    pub_fixture f;
    open_for_x(&f);
    int64_t at = rand_between(&rng, 0, 1000), kept = 0; /* 64 KiB buffers kept */
    ifd_publisher_tensors st;
    int loops = (int)rand_between(&rng, 2, 5);
    for (int l = 0; l < loops; l++) {
        int64_t msgs = rand_between(&rng, 1, 10), n = 4 * msgs;
        int64_t step[40], loop[40] = {0};
        ifd_tensor ts[40];
        for (int64_t s = 0; s < n; s++)
            step[s] = at + s;
        ifd_publisher_tensor_stats(f.pub, &st);
        int64_t reused0 = st.buffers_reused, taken0 = st.buffers;
        write_loop(&f, &rng, &at, ts, n, 16, 16);
        flush_loop(&f);
        expect_steps(f.sub, "x", step, ts, n, loop);
        for (int64_t s = 0; s < n; s++)
            free(ts[s].data);
        ifd_publisher_tensor_stats(f.pub, &st);
        if (l > 0)
            ck_assert_int_eq(st.buffers - taken0, msgs);
        RASSERT(st.buffers_reused - reused0 >= (kept < msgs ? kept : msgs) &&
                    st.buffers_reused - reused0 <= msgs,
                "loop %d: %lld of %lld messages reused a buffer, %lld were kept", l,
                (long long)(st.buffers_reused - reused0), (long long)msgs, (long long)kept);
        int64_t deadline = ifd_clock_ns() + INT64_C(10000000000);
        while (st.buffers_out > 0) { /* libzmq gives them back once it has sent them */
            RASSERT(ifd_clock_ns() < deadline, "%lld buffers never came back from libzmq",
                    (long long)st.buffers_out);
            ifd_sleep_ns(1000000);
            ifd_publisher_tensor_stats(f.pub, &st);
        }
        /* every buffer made is kept (the first message's 16 and 32 KiB ones too) */
        RASSERT(st.buffers_kept == st.buffers - st.buffers_reused,
                "loop %d: %lld buffers kept, %lld taken, %lld of them reused", l,
                (long long)st.buffers_kept, (long long)st.buffers, (long long)st.buffers_reused);
        kept = st.buffers_kept - 2;
    }
    fixture_close(&f);
}
END_TEST

/* ---- tensor messages in shared memory ---- */

/* A "tensor-shm:" message's steps into t (its header's lists) and its data into *data (malloc'd;
 * NULL when the ring wrote over it before it was read): from the ring for a notice (rd: opened
 * at the first), from the data frame otherwise (*notice 0). */
static void recv_shm(void *sock, ifd_tensor_ring_reader *rd, tensor_msg *t, char **data,
                     int *notice)
{
    zmq_msg_t m;
    int more;
    recv_frame(sock, &m, &more);
    size_t tn = zmq_msg_size(&m), pn = strlen(IFD_PUB_TENSOR_SHM_PREFIX);
    RASSERT(more && tn > pn && memcmp(zmq_msg_data(&m), IFD_PUB_TENSOR_SHM_PREFIX, pn) == 0,
            "expected a tensor-shm topic, got %zu bytes", tn);
    zmq_msg_close(&m);
    recv_frame(sock, &m, &more);
    json_error_t je;
    json_t *h = json_loadb(zmq_msg_data(&m), zmq_msg_size(&m), 0, &je), *shm;
    zmq_msg_close(&m);
    RASSERT(h != NULL, "the header is not JSON: %s", je.text);
    int nrows;
    int_list(json_object_get(h, "global_steps"), &t->steps, &t->nsteps);
    int_list(json_object_get(h, "rows"), &t->rows, &nrows);
    *notice = (shm = json_object_get(h, "shm")) != NULL;
    ck_assert_int_eq(*notice, !more);
    if (*notice) {
        const char *path = json_string_value(json_object_get(shm, "path"));
        const char *token = json_string_value(json_object_get(shm, "token"));
        size_t size = (size_t)json_integer_value(json_object_get(shm, "size"));
        uint64_t seq = (uint64_t)json_integer_value(json_object_get(shm, "seq"));
        size_t n = (size_t)json_integer_value(json_object_get(shm, "bytes"));
        ifd_error err;
        if (rd->base == NULL)
            RC_OK(ifd_tensor_ring_open(rd, path, size, token, &err), err);
        ck_assert_str_eq(path, rd->path);
        *data = malloc(n + 1);
        int rc = ifd_tensor_ring_read(rd, seq, n, *data, &err);
        RASSERT(rc == IFD_OK || rc == IFD_ERANGE, "%s", ifd_error_text(&err));
        if (rc != IFD_OK) {
            free(*data);
            *data = NULL;
        }
    } else {
        recv_frame(sock, &m, &more);
        *data = malloc(zmq_msg_size(&m) + 1);
        memcpy(*data, zmq_msg_data(&m), zmq_msg_size(&m));
        zmq_msg_close(&m);
    }
    json_decref(h);
}

/* A tcp subscriber ("tensor:x") and a shared-memory one ("tensor-shm:x") of the same tensor get
 * the same steps, in order, with the same data (a first loop of steps without rows included);
 * without a ring (tensor_shm_bytes 0) the second gets data messages. A subscriber that reads only
 * after the ring went round several times loses the messages written over (never reads other
 * bytes), keeps the newest, and the writer never waited for it. */
START_TEST(shared_memory_subscribers_get_the_steps_tcp_ones_get)
{
    ifd_rng rng;
    seed_rng(&rng);
    int ring = _i % 3 != 2, late = _i % 3 == 1;
    pub_fixture f;
    fixture_open(&f, INT64_C(1) << 40);
    int64_t ring_bytes = late ? IFD_TENSOR_RING_MIN : rand_between(&rng, 8 << 20, 32 << 20);
    ifd_publisher_set_tensor_shm(f.pub, ring ? ring_bytes : 0);
    void *shm_sub = zmq_socket(f.zctx, ZMQ_SUB);
    ck_assert_int_eq(zmq_connect(shm_sub, ifd_publisher_endpoint(f.pub)), 0);
    /* a last name on each connection says its other subscriptions were read (in order) */
    ck_assert_int_eq(zmq_setsockopt(shm_sub, ZMQ_SUBSCRIBE, "tensor-shm:x", 12), 0);
    ck_assert_int_eq(zmq_setsockopt(shm_sub, ZMQ_SUBSCRIBE, "tensor-shm:last", 15), 0);
    subscribe_all(&f, (const char *const[]){"x", "tcp_last"}, 2);
    wait_wants(&f, "last", 1);
    int64_t steps = rand_between(&rng, 1, IFD_PUB_SNDHWM / 2), ipl = rand_between(&rng, 1, 40);
    int64_t row[2] = {rand_between(&rng, 1, 16), rand_between(&rng, 1, 16)};
    int rank = (int)rand_between(&rng, 1, 3);
    ifd_dtype dt = rand_between(&rng, 0, 1) ? IFD_F32 : IFD_I32;
    if (late) /* steps of 8 KiB to 16 KiB: a run of at least 4 rings */
        steps = IFD_PUB_SNDHWM / 2, rank = 2, row[0] = 1024, ipl = 1;
    ifd_tensor *ts = calloc((size_t)steps, sizeof *ts);
    int64_t *step = calloc((size_t)steps, sizeof *step), *loop = calloc((size_t)steps, 8);
    const char *const names[1] = {"x"};
    for (int64_t s = 0; s < steps; s++) {
        /* the first loop's steps have no rows (its message no data), but in the late run */
        int64_t rows = !late && s < ipl ? 0 : rand_between(&rng, late ? 2 : 0, 4);
        random_rows(&rng, &ts[s], dt, rank, row, rows);
        step[s] = s + 7;
        loop[s] = s / ipl;
        write_step(&f, step[s], 1, names, &ts[s]);
        if ((s + 1) % ipl == 0)
            flush_loop(&f);
    }
    flush_loop(&f);
    expect_steps(f.sub, "x", step, ts, steps, loop);
    ifd_tensor_ring_reader rd = {0};
    int64_t k = 0, kept = 0, notices = 0;
    int last_kept = 0;
    while (k < steps) {
        tensor_msg t;
        char *data;
        int notice;
        recv_shm(shm_sub, &rd, &t, &data, &notice);
        ck_assert_int_eq(notice, ring);
        notices += notice;
        const char *at = data;
        for (int i = 0; i < t.nsteps; i++, k++) {
            RASSERT(k < steps && t.steps[i] == step[k], "step %lld where %lld was due",
                    (long long)t.steps[i], (long long)(k < steps ? step[k] : -1));
            ck_assert_int_eq(t.rows[i], ts[k].shape.dims[0]);
            size_t nb = ifd_tensor_nbytes(&ts[k]);
            if (data)
                RASSERT(memcmp(at, ts[k].data, nb) == 0, "step %lld's data differ",
                        (long long)step[k]);
            at += nb;
        }
        kept += data != NULL;
        last_kept = data != NULL;
        RASSERT(late || data, "a message was lost from a ring that holds the whole run");
        free(data);
        free(t.steps);
        free(t.rows);
    }
    ck_assert(last_kept);
    if (late)
        RASSERT(kept < notices, "all %lld messages kept through a ring of %lld bytes",
                (long long)notices, (long long)ring_bytes);
    ifd_publisher_stop(f.pub); /* its counts are final */
    ifd_publisher_tensors st;
    ifd_publisher_tensor_stats(f.pub, &st);
    ck_assert_int_eq(st.shm_notices, notices);
    ck_assert_int_eq(st.shm_data, ring ? 0 : st.sent / 2);
    ck_assert_int_eq(st.shm_ring_bytes > 0, ring);
    ifd_tensor_ring_close(&rd);
    zmq_close(shm_sub);
    free_steps(ts, steps, step, loop);
    fixture_close(&f);
}
END_TEST

/* A loop that writes more than a quarter of the ring sends its notices before it ends (else
 * the ring would write over them before a reader heard of them); a shorter one waits for its
 * end, as data messages do. */
START_TEST(a_loop_over_a_quarter_of_the_ring_sends_its_notices_at_once)
{
    ifd_rng rng;
    seed_rng(&rng);
    pub_fixture f;
    fixture_open(&f, INT64_C(1) << 40);
    int64_t ring = rand_between(&rng, 1 << 20, 2 << 20);
    ifd_publisher_set_tensor_shm(f.pub, ring);
    subscribe(&f, "tensor-shm:x", 1);
    wait_wants(&f, "x", 1);
    /* steps of 4 to 8 KiB: messages of 64 KiB at most, far from the wake marks of the outbox */
    int64_t row[1] = {1024};
    size_t written = 0, quarter = (size_t)ring / 4;
    const char *const names[1] = {"x"};
    ifd_tensor_ring_reader rd = {0};
    ifd_publisher_tensors st;
    ifd_publisher_tensor_stats(f.pub, &st);
    int64_t s = 0, wakes = st.wakes;
    for (; written <= quarter + IFD_PUB_TENSOR_MESSAGE_BYTES; s++) {
        ifd_tensor t;
        random_rows(&rng, &t, IFD_F32, 2, row, rand_between(&rng, 1, 2));
        write_step(&f, s + 1, 1, names, &t);
        written += ifd_tensor_nbytes(&t);
        free(t.data);
        ifd_publisher_tensor_stats(f.pub, &st);
        if (written < quarter) /* the thread is not woken before a quarter was written */
            RASSERT(st.wakes == wakes, "woken after %zu bytes of a ring of %lld", written,
                    (long long)ring);
    }
    /* the loop has not ended: the thread was woken for the notices, which arrive */
    RASSERT(st.wakes > wakes, "not woken after %zu bytes of a ring of %lld", written,
            (long long)ring);
    tensor_msg t;
    char *data;
    int notice;
    recv_shm(f.sub, &rd, &t, &data, &notice);
    ck_assert(notice && data);
    ck_assert_int_eq(t.steps[0], 1);
    free(data);
    free(t.steps);
    free(t.rows);
    ifd_tensor_ring_close(&rd);
    fixture_close(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tensor_publisher");
    TCase *tc = tu_tcase(s, "tensors", 60);
    tcase_add_loop_test(tc, asked_tensors_arrive_in_order_and_others_are_not_sent, 0, 8);
    tcase_add_loop_test(tc, a_summary_goes_after_the_steps_before_it, 0, 4);
    tcase_add_loop_test(tc, the_byte_rate_drops_what_exceeds_it, 0, 4);
    tcase_add_loop_test(tc, a_loop_s_messages_wake_the_publisher_once, 0, 4);
    tcase_add_loop_test(tc, a_long_loop_wakes_the_publisher_at_the_mark, 0, 4);
    tcase_add_loop_test(tc, sent_messages_give_their_buffers_back_for_the_next_loop, 0, 4);
    tcase_add_loop_test(tc, shared_memory_subscribers_get_the_steps_tcp_ones_get, 0, 9);
    tcase_add_loop_test(tc, a_loop_over_a_quarter_of_the_ring_sends_its_notices_at_once, 0, 4);
    return tu_run_suite(s);
}
