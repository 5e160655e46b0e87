/*
 * Tensor messages on the PUB socket (host/publisher.c, docs/summaries.md "Tensor messages"): a
 * subscription to "tensor:NAME" asks for NAME; what is asked for arrives in order as three frames
 * (topic, JSON header, data), what is not is never sent; an unsubscription ends it; the byte
 * rate drops, never waits. Tests wait for the subscription to be seen, never for a fixed time.
 */
#include "core/thread.h"
#include "host/limits.h"
#include "host/publisher.h"
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

static void random_tensor(ifd_rng *rng, ifd_tensor *t)
{
    int rank = (int)rand_between(rng, 1, 3);
    int64_t dims[3];
    for (int i = 0; i < rank; i++)
        dims[i] = rand_between(rng, 1, 7);
    ifd_dtype dt = rand_between(rng, 0, 1) ? IFD_F32 : IFD_I32;
    ck_assert_int_eq(ifd_tensor_init(t, dt, rank, dims, NULL), IFD_OK);
    t->data = malloc(ifd_tensor_nbytes(t));
    uint32_t *w = t->data;
    for (int64_t i = 0; i < ifd_tensor_numel(t); i++)
        w[i] = (uint32_t)ifd_rng_next(rng);
}

/* A tensor message: topic, header and data as written. */
static void expect_tensor(void *sock, const char *name, int64_t step, const ifd_tensor *t)
{
    zmq_msg_t m;
    int more;
    recv_frame(sock, &m, &more);
    char topic[80];
    snprintf(topic, sizeof topic, "tensor:%s", name);
    RASSERT(more && zmq_msg_size(&m) == strlen(topic) &&
                memcmp(zmq_msg_data(&m), topic, strlen(topic)) == 0,
            "expected the topic '%s', got %zu bytes '%.*s'", topic, zmq_msg_size(&m),
            (int)zmq_msg_size(&m), (const char *)zmq_msg_data(&m));
    zmq_msg_close(&m);
    recv_frame(sock, &m, &more);
    ck_assert(more);
    json_error_t je;
    json_t *h = json_loadb(zmq_msg_data(&m), zmq_msg_size(&m), 0, &je);
    zmq_msg_close(&m);
    RASSERT(h != NULL, "the header is not JSON: %s", je.text);
    ck_assert_str_eq(json_string_value(json_object_get(h, "event")), "tensor");
    ck_assert_str_eq(json_string_value(json_object_get(h, "mode")), "train");
    ck_assert_str_eq(json_string_value(json_object_get(h, "name")), name);
    ck_assert_int_eq(json_integer_value(json_object_get(h, "global_step")), step);
    ck_assert_str_eq(json_string_value(json_object_get(h, "dtype")), ifd_dtype_name(t->dtype));
    json_t *shape = json_object_get(h, "shape");
    ck_assert_int_eq((int)json_array_size(shape), t->shape.rank);
    for (int i = 0; i < t->shape.rank; i++)
        ck_assert_int_eq(json_integer_value(json_array_get(shape, (size_t)i)), t->shape.dims[i]);
    json_decref(h);
    recv_frame(sock, &m, &more);
    ck_assert(!more);
    ck_assert_uint_eq(zmq_msg_size(&m), ifd_tensor_nbytes(t));
    ck_assert(memcmp(zmq_msg_data(&m), t->data, ifd_tensor_nbytes(t)) == 0);
    zmq_msg_close(&m);
}

START_TEST(asked_tensors_arrive_in_order_and_others_are_not_sent)
{
    ifd_rng rng;
    seed_rng(&rng);
    pub_fixture f;
    fixture_open(&f, 0);
    subscribe(&f, "tensor:wanted", 1);
    subscribe(&f, "{", 1); /* the summaries */
    wait_wants(&f, "wanted", 1);
    ck_assert(!ifd_publisher_tensor_wanted(f.pub, "other"));
    ck_assert(!ifd_publisher_tensor_wanted(f.pub, "want")); /* a name, not a prefix */
    int64_t steps = rand_between(&rng, 1, 40), step0 = rand_between(&rng, 0, 1000);
    ifd_tensor *ts = calloc((size_t)steps, sizeof *ts);
    ifd_error err;
    const char *const names[2] = {"other", "wanted"};
    for (int64_t s = 0; s < steps; s++) {
        random_tensor(&rng, &ts[s]);
        ifd_tensor pair[2] = {ts[s], ts[s]};
        write_step(&f, step0 + s, 2, names, pair);
    }
    ifd_sink *sink = ifd_publisher_sink(f.pub);
    RC_OK(ifd_sink_write(sink, "{\"event\":\"end\"}", 15, &err), err);
    for (int64_t s = 0; s < steps; s++)
        expect_tensor(f.sub, "wanted", step0 + s, &ts[s]);
    zmq_msg_t m;
    int more;
    recv_frame(f.sub, &m, &more); /* the summary: one frame, after the tensors */
    ck_assert(!more);
    ck_assert_uint_eq(zmq_msg_size(&m), 15);
    zmq_msg_close(&m);
    ifd_publisher_tensors st;
    ifd_publisher_tensor_stats(f.pub, &st);
    ck_assert_int_eq(st.sent, steps);
    ck_assert_int_eq(st.subscribed, 1);
    /* unsubscribed: the tensor is no longer asked for */
    subscribe(&f, "tensor:wanted", 0);
    wait_wants(&f, "wanted", 0);
    for (int64_t s = 0; s < steps; s++)
        free(ts[s].data);
    free(ts);
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
    subscribe(&f, "tensor:x", 1);
    wait_wants(&f, "x", 1);
    ifd_tensor t;
    random_tensor(&rng, &t);
    int64_t n = rand_between(&rng, 20, 60);
    const char *const names[1] = {"x"};
    int64_t t0 = ifd_clock_ns();
    for (int64_t s = 0; s < n; s++)
        write_step(&f, s, 1, names, &t);
    double elapsed = (double)(ifd_clock_ns() - t0) / 1e9;
    ifd_publisher_tensors st;
    ifd_publisher_tensor_stats(f.pub, &st);
    /* the message's bytes: the topic, the header (at least 60 bytes) and the data */
    double bytes = (double)(strlen("tensor:x") + 60 + ifd_tensor_nbytes(&t));
    int64_t most = (int64_t)((double)rate * (1.0 + elapsed) / bytes) + 1;
    ck_assert_int_eq(st.rate, rate);
    RASSERT(n - st.limited <= most,
            "%lld of %lld messages of about %.0f bytes passed a rate of %lld bytes/s in %.3f s",
            (long long)(n - st.limited), (long long)n, bytes, (long long)rate, elapsed);
    ck_assert_int_ge(st.limited, n - most);
    free(t.data);
    fixture_close(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tensor_publisher");
    TCase *tc = tu_tcase(s, "tensors", 60);
    tcase_add_loop_test(tc, asked_tensors_arrive_in_order_and_others_are_not_sent, 0, 4);
    tcase_add_loop_test(tc, the_byte_rate_drops_what_exceeds_it, 0, 4);
    return tu_run_suite(s);
}
