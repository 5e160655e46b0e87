/*
 * Tests of the C client (include/infeed/client.h) against fake daemons: a ROUTER socket in a
 * thread of the test that plays a scripted part of infeedd and checks every byte the client
 * sends against docs/protocol.md. Covered: HELLO/WELCOME and HELLO rejected, the BATCH and END
 * headers, blocking on credit (woken by ACK or CREDIT) and its timeout, ERROR replies returned
 * once by the next call, zero-copy buffers released exactly once on every path, END waiting for
 * the ACKs or the BYE, and the summary subscriber.
 *
 * Sizes, counts and codes are random. The seed comes from IFD_TEST_SEED when set, else from the
 * clock, and every failure message names it.
 */
#include "infeed/client.h"

#include "clients/c/producer_internal.h"
#include "core/rng.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

/* ---- checks (seeds, RASSERT and rand_between come from tests/util/testutil.h) ------------ */

#define RC_OK(call, err)                                                                           \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        RASSERT(rc_ == IFD_OK, "%s returned %s: %s", #call, ifd_errname(rc_),                      \
                ifd_error_text(&(err)));                                                           \
    } while (0)

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ---- the fake daemon ---------------------------------------------------------------------- */

#define FAKE_MAX_FRAMES 12

/* One message from the producer, routing id stripped. */
typedef struct fmsg {
    int n;
    size_t size[FAKE_MAX_FRAMES];
    unsigned char *data[FAKE_MAX_FRAMES];
} fmsg;

typedef struct fake fake;
typedef void (*fake_script)(fake *f);

struct fake {
    void *ctx;
    void *router;
    char endpoint[128];
    pthread_t thread;
    fake_script script;
    void *arg;
    unsigned char id[256];
    size_t id_len;
    char fail[1024]; /* the first failed check, written by the fake's thread */
};

static void fmsg_free(fmsg *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->data[i]);
    m->n = 0;
}

static void fake_send(fake *f, int type, const unsigned char *fields, size_t nfields,
                      const char *json);

/* After a failed check: tells the client at once (an ERROR EINTERNAL carrying the failure, then
 * a BYE), so that its pending call fails with the reason instead of timing out. */
static void fake_abort(fake *f)
{
    if (f->id_len == 0)
        return;
    json_t *o = json_pack("{s:s, s:n, s:i, s:s}", "code", "EINTERNAL", "seq", "credit", 0,
                          "message", f->fail);
    char *text = json_dumps(o, 0);
    fake_send(f, 7, NULL, 0, text);
    fake_send(f, 9, NULL, 0, "{\"status\": \"error\", \"reason\": \"fake daemon failed\"}");
    free(text);
    json_decref(o);
}

/* Fails the script (first failure wins), tells the client and returns from the script. */
#define FCHECK(f, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if ((f)->fail[0] == '\0') {                                                            \
                int off_ =                                                                         \
                    snprintf((f)->fail, sizeof(f)->fail, "fake daemon, line %d: ", __LINE__);      \
                snprintf((f)->fail + off_, sizeof(f)->fail - (size_t)off_, __VA_ARGS__);           \
            }                                                                                      \
            fake_abort(f);                                                                         \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Receives one message within timeout_ms. 1 when one came, 0 when none did. */
static int fake_recv(fake *f, fmsg *m, int timeout_ms)
{
    m->n = 0;
    zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return 0;
    int more = 1, first = 1;
    while (more) {
        zmq_msg_t z;
        zmq_msg_init(&z);
        if (zmq_msg_recv(&z, f->router, 0) < 0) {
            zmq_msg_close(&z);
            return 0;
        }
        more = zmq_msg_more(&z);
        if (first) {
            f->id_len = zmq_msg_size(&z) < sizeof f->id ? zmq_msg_size(&z) : sizeof f->id;
            memcpy(f->id, zmq_msg_data(&z), f->id_len);
            first = 0;
        } else if (m->n < FAKE_MAX_FRAMES) {
            m->size[m->n] = zmq_msg_size(&z);
            m->data[m->n] = malloc(m->size[m->n] + 1);
            memcpy(m->data[m->n], zmq_msg_data(&z), m->size[m->n]);
            m->data[m->n][m->size[m->n]] = 0;
            m->n++;
        }
        zmq_msg_close(&z);
    }
    return 1;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void fake_send(fake *f, int type, const unsigned char *fields, size_t nfields,
                      const char *json)
{
    unsigned char h[64] = {'I', 'F', 'D', 'P', 1, 0, (unsigned char)type, 0};
    if (nfields)
        memcpy(h + 8, fields, nfields);
    zmq_send(f->router, f->id, f->id_len, ZMQ_SNDMORE);
    zmq_send(f->router, h, 8 + nfields, json ? ZMQ_SNDMORE : 0);
    if (json)
        zmq_send(f->router, json, strlen(json), 0);
}

static void fake_welcome(fake *f, int64_t credit, int64_t next_seq, int64_t batch_size,
                         int replicas)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"protocol\": 1, \"name\": \"p\", \"credit\": %" PRId64 ", \"next_seq\": %" PRId64
             ", \"mode\": \"train\", \"input_mode\": \"per-host\", \"batch_size\": %" PRId64
             ", \"replicas\": %d, \"program\": \"softmax\", \"schema\": [], \"future_key\": 7}",
             credit, next_seq, batch_size, replicas);
    fake_send(f, 2, NULL, 0, json);
}

static void fake_ack(fake *f, int64_t seq)
{
    unsigned char b[16] = {0};
    put_le(b, (uint64_t)seq, 8);
    put_le(b + 8, 1, 4);
    fake_send(f, 5, b, 16, NULL);
}

static void fake_credit(fake *f, uint32_t credit)
{
    unsigned char b[8] = {0};
    put_le(b, credit, 4);
    fake_send(f, 4, b, 8, NULL);
}

static void fake_error(fake *f, const char *code, int64_t seq, int credit, const char *msg)
{
    char json[1024], seqs[32];
    if (seq < 0)
        snprintf(seqs, sizeof seqs, "null");
    else
        snprintf(seqs, sizeof seqs, "%" PRId64, seq);
    snprintf(json, sizeof json,
             "{\"code\": \"%s\", \"seq\": %s, \"credit\": %d, \"message\": \"%s\"}", code, seqs,
             credit, msg);
    fake_send(f, 7, NULL, 0, json);
}

static void fake_bye(fake *f, const char *status, const char *reason, int64_t acked_seq)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"status\": \"%s\", \"reason\": \"%s\", \"global_step\": 10, \"acked_seq\": "
             "%" PRId64 ", \"message\": \"run over\"}",
             status, reason, acked_seq);
    fake_send(f, 9, NULL, 0, json);
}

static const unsigned char HDR_PREFIX[6] = {'I', 'F', 'D', 'P', 1, 0};

/* Checks the common 8 bytes of a header and returns the type, or -1. */
static int hdr_type(const fmsg *m)
{
    if (m->n < 1 || m->size[0] < 8 || memcmp(m->data[0], HDR_PREFIX, 6) != 0)
        return -1;
    return (int)get_le(m->data[0] + 6, 2);
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    f->script(f);
    return NULL;
}

static void fake_start(fake *f, fake_script script, void *arg)
{
    memset(f, 0, sizeof *f);
    f->script = script;
    f->arg = arg;
    f->ctx = zmq_ctx_new();
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert(zmq_bind(f->router, "tcp://127.0.0.1:*") == 0);
    size_t len = sizeof f->endpoint;
    zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &len);
    ck_assert(pthread_create(&f->thread, NULL, fake_main, f) == 0);
}

static void fake_join(fake *f)
{
    pthread_join(f->thread, NULL);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    RASSERT(f->fail[0] == '\0', "%s", f->fail);
}

/* Receives HELLO (checking its header) and answers WELCOME. */
#define FAKE_HELLO_WELCOME(f, credit, next_seq, batch_size)                                        \
    do {                                                                                           \
        fmsg m_;                                                                                   \
        FCHECK(f, fake_recv(f, &m_, 10000), "no HELLO");                                           \
        int t_ = hdr_type(&m_);                                                                    \
        size_t s0_ = m_.size[0];                                                                   \
        int n_ = m_.n;                                                                             \
        fmsg_free(&m_);                                                                            \
        FCHECK(f, t_ == 1 && s0_ == 8 && n_ == 2,                                                  \
               "expected HELLO, got type %d (%zu bytes, %d "                                       \
               "frames)",                                                                          \
               t_, s0_, n_);                                                                       \
        fake_welcome(f, credit, next_seq, batch_size, 1);                                          \
    } while (0)

/* ---- batches with checkable bytes --------------------------------------------------------- */

/* The byte at offset j of tensor i of batch seq. */
static unsigned char pattern(int64_t seq, int i, size_t j)
{
    uint64_t z = (uint64_t)seq * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull ^
                 (uint64_t)j * 0x94D049BB133111EBull;
    return (unsigned char)(z >> 56 ^ z >> 17);
}

static void fill_pattern(unsigned char *buf, size_t n, int64_t seq, int i)
{
    for (size_t j = 0; j < n; j++)
        buf[j] = pattern(seq, i, j);
}

/* Checks a BATCH message's header and frames. Returns NULL or a description of the first
 * difference (static storage). */
static const char *check_batch(const fmsg *m, int64_t seq, int64_t rows, int n, const size_t *sizes)
{
    static char why[256];
    unsigned char want[32] = {'I', 'F', 'D', 'P', 1, 0, 3, 0};
    put_le(want + 8, (uint64_t)seq, 8);
    put_le(want + 16, (uint64_t)rows, 8);
    put_le(want + 24, 0, 4);
    put_le(want + 28, (uint64_t)n, 4);
    if (m->n != 1 + n) {
        snprintf(why, sizeof why, "batch %" PRId64 ": %d frames, expected %d", seq, m->n, 1 + n);
        return why;
    }
    if (m->size[0] != 32 || memcmp(m->data[0], want, 32) != 0) {
        snprintf(why, sizeof why,
                 "batch %" PRId64 ": header of %zu bytes differs (seq %" PRId64 " rows %" PRId64
                 " flags %u n %u)",
                 seq, m->size[0], m->size[0] >= 32 ? (int64_t)get_le(m->data[0] + 8, 8) : -1,
                 m->size[0] >= 32 ? (int64_t)get_le(m->data[0] + 16, 8) : -1,
                 m->size[0] >= 32 ? (unsigned)get_le(m->data[0] + 24, 4) : 0,
                 m->size[0] >= 32 ? (unsigned)get_le(m->data[0] + 28, 4) : 0);
        return why;
    }
    for (int i = 0; i < n; i++) {
        if (m->size[1 + i] != sizes[i]) {
            snprintf(why, sizeof why, "batch %" PRId64 " tensor %d: %zu bytes, expected %zu", seq,
                     i, m->size[1 + i], sizes[i]);
            return why;
        }
        for (size_t j = 0; j < sizes[i]; j++)
            if (m->data[1 + i][j] != pattern(seq, i, j)) {
                snprintf(why, sizeof why, "batch %" PRId64 " tensor %d: byte %zu differs", seq, i,
                         j);
                return why;
            }
    }
    return NULL;
}

static const ifd_input_spec ONE_U8[1] = {{"x", IFD_U8, 1, {4}}};

/* ---- HELLO / WELCOME ---------------------------------------------------------------------- */

typedef struct hello_case {
    ifd_input_spec schema[IFD_MAX_INPUTS];
    int n;
    int64_t first_seq;
    char name[64];
    int64_t credit, next_seq, batch_size;
    int replicas;
    int replica; /* -1: none (no key) */
    char errmsg[128];
} hello_case;

static const char *dtype_str(ifd_dtype d)
{
    switch (d) {
    case IFD_F32:
        return "float32";
    case IFD_I32:
        return "int32";
    case IFD_I64:
        return "int64";
    case IFD_U8:
        return "uint8";
    default:
        return "?";
    }
}

static void script_hello(fake *f)
{
    hello_case *c = f->arg;
    fmsg m;
    /* First HELLO: checked byte by byte and answered with an ERROR. */
    FCHECK(f, fake_recv(f, &m, 10000), "no HELLO");
    static const unsigned char want[8] = {'I', 'F', 'D', 'P', 1, 0, 1, 0};
    FCHECK(f, m.n == 2 && m.size[0] == 8 && memcmp(m.data[0], want, 8) == 0,
           "HELLO header: %d frames, %zu header bytes", m.n, m.size[0]);
    json_error_t je;
    json_t *o = json_loadb((const char *)m.data[1], m.size[1], 0, &je);
    fmsg_free(&m);
    FCHECK(f, json_is_object(o), "HELLO JSON does not parse: %s", je.text);
    /* shm: the fake's endpoint is local, so the default (auto) asks for a pool. */
    size_t keys = c->replica >= 0 ? 5 : 4;
    FCHECK(f, json_object_size(o) == keys, "HELLO has %zu keys, expected %zu", json_object_size(o),
           keys);
    FCHECK(f, json_is_true(json_object_get(o, "shm")), "HELLO shm: expected true (auto, local)");
    FCHECK(f,
           c->replica < 0 || (json_is_integer(json_object_get(o, "replica")) &&
                              json_integer_value(json_object_get(o, "replica")) == c->replica),
           "HELLO replica");
    FCHECK(f,
           json_is_string(json_object_get(o, "name")) &&
               strcmp(json_string_value(json_object_get(o, "name")), c->name) == 0,
           "HELLO name");
    FCHECK(f, json_integer_value(json_object_get(o, "first_seq")) == c->first_seq,
           "HELLO first_seq");
    json_t *sch = json_object_get(o, "schema");
    FCHECK(f, json_is_array(sch) && (int)json_array_size(sch) == c->n, "HELLO schema length");
    for (int i = 0; i < c->n; i++) {
        json_t *e = json_array_get(sch, (size_t)i);
        json_t *shape = json_object_get(e, "shape");
        FCHECK(f, json_object_size(e) == 3, "schema[%d]: %zu keys", i, json_object_size(e));
        FCHECK(f, strcmp(json_string_value(json_object_get(e, "name")), c->schema[i].name) == 0,
               "schema[%d] name", i);
        FCHECK(f,
               strcmp(json_string_value(json_object_get(e, "dtype")),
                      dtype_str(c->schema[i].dtype)) == 0,
               "schema[%d] dtype", i);
        FCHECK(f, json_is_array(shape) && (int)json_array_size(shape) == c->schema[i].rank,
               "schema[%d] rank", i);
        for (int d = 0; d < c->schema[i].rank; d++)
            FCHECK(f, json_integer_value(json_array_get(shape, (size_t)d)) == c->schema[i].dims[d],
                   "schema[%d] dim %d", i, d);
    }
    json_decref(o);
    fake_error(f, "EDTYPE", -1, 0, c->errmsg);

    /* Second HELLO: a stale batch rejection first (ignored by hello), then WELCOME. */
    FCHECK(f, fake_recv(f, &m, 10000), "no second HELLO");
    int t = hdr_type(&m);
    fmsg_free(&m);
    FCHECK(f, t == 1, "expected a second HELLO, got type %d", t);
    fake_error(f, "ESHAPE", 3, 1, "stale");
    fake_welcome(f, c->credit, c->next_seq, c->batch_size, c->replicas);
}

START_TEST(test_hello_welcome)
{
    ifd_rng rng;
    seed_rng(&rng);
    hello_case c;
    memset(&c, 0, sizeof c);
    c.n = (int)rand_between(&rng, 1, IFD_MAX_INPUTS);
    for (int i = 0; i < c.n; i++) {
        ifd_input_spec *s = &c.schema[i];
        snprintf(s->name, sizeof s->name, "t%d_%d", i, (int)rand_between(&rng, 0, 999));
        s->dtype = (ifd_dtype)rand_between(&rng, IFD_F32, IFD_U8);
        s->rank = (int)rand_between(&rng, 0, 3);
        for (int d = 0; d < s->rank; d++)
            s->dims[d] = rand_between(&rng, 1, 300);
    }
    c.first_seq = rand_between(&rng, 0, 1000000);
    snprintf(c.name, sizeof c.name, "loader-%d", (int)rand_between(&rng, 0, 99));
    c.credit = rand_between(&rng, 1, 64);
    c.next_seq = rand_between(&rng, 0, 1 << 30);
    c.batch_size = rand_between(&rng, 1, 4096);
    c.replicas = (int)rand_between(&rng, 1, 8);
    c.replica = (int)rand_between(&rng, -1, c.replicas - 1);
    snprintf(c.errmsg, sizeof c.errmsg, "schema: tensor 0 't0': expected dtype int32, got %d",
             (int)rand_between(&rng, 0, 99999));

    fake f;
    fake_start(&f, script_hello, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, c.name, &err), err);
    RASSERT(ifd_producer_set_replica(p, -2, &err) == IFD_EINVAL && strstr(err.msg, "replica"),
            "set_replica(-2): %s", err.msg);
    RC_OK(ifd_producer_set_replica(p, c.replica, &err), err);
    int rc = ifd_producer_hello(p, c.schema, c.n, c.first_seq, 10000, &err);
    RASSERT(rc == IFD_EDTYPE, "hello answered by ERROR EDTYPE returned %s", ifd_errname(rc));
    RASSERT(strcmp(err.msg, c.errmsg) == 0, "hello's message '%s', expected '%s'", err.msg,
            c.errmsg);
    RASSERT(ifd_producer_mode(p) == NULL, "a mode before any WELCOME");
    RC_OK(ifd_producer_hello(p, c.schema, c.n, c.first_seq, 10000, &err), err);
    RASSERT(ifd_producer_credit(p) == c.credit, "credit %" PRId64 ", expected %" PRId64,
            ifd_producer_credit(p), c.credit);
    RASSERT(ifd_producer_available(p) == c.credit, "available %" PRId64, ifd_producer_available(p));
    RASSERT(ifd_producer_next_seq(p) == c.next_seq, "next_seq %" PRId64 ", expected %" PRId64,
            ifd_producer_next_seq(p), c.next_seq);
    RASSERT(ifd_producer_batch_size(p) == c.batch_size, "batch_size");
    RASSERT(ifd_producer_replicas(p) == c.replicas, "replicas");
    RASSERT(strcmp(ifd_producer_mode(p), "train") == 0, "mode");
    RASSERT(ifd_producer_acked_seq(p) == -1, "acked_seq before any ACK");
    RASSERT(strstr(ifd_producer_welcome(p), "\"future_key\"") != NULL, "welcome JSON kept");
    fake_join(&f);
    /* The stale rejection is not reported. */
    RC_OK(ifd_producer_wait(p, 0, &err), err);
    ifd_producer_destroy(p);
}
END_TEST

static void script_silent(fake *f)
{
    fmsg m;
    if (fake_recv(f, &m, 10000))
        fmsg_free(&m);
    sleep_ms(200);
}

START_TEST(test_hello_timeout)
{
    ifd_rng rng;
    seed_rng(&rng);
    fake f;
    fake_start(&f, script_silent, NULL);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, NULL, &err), err);
    int t = (int)rand_between(&rng, 20, 120);
    int64_t t0 = now_ms();
    int rc = ifd_producer_hello(p, ONE_U8, 1, 0, t, &err);
    int64_t dt = now_ms() - t0;
    RASSERT(rc == IFD_ETIMEDOUT, "hello with no answer returned %s", ifd_errname(rc));
    RASSERT(dt >= t && dt < t + 2000, "hello timed out after %" PRId64 " ms, timeout %d", dt, t);
    /* No WELCOME: sending is refused. */
    ifd_frame fr = {"abcd", 4};
    RASSERT(ifd_producer_send(p, 1, &fr, 1, 0, &err) == IFD_EINVAL, "send before WELCOME");
    fake_join(&f);
    ifd_producer_destroy(p);
    ifd_producer_destroy(NULL);
}
END_TEST

/* An endpoint where nothing listens: a port bound and closed again. */
static void dead_endpoint(char *buf, size_t len)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    ck_assert(zmq_bind(s, "tcp://127.0.0.1:*") == 0);
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, buf, &len);
    zmq_close(s);
    zmq_ctx_term(ctx);
}

/* No daemon answers: hello and recv end after the connect timeout, not their own, with a
 * sentence naming the endpoint and the daemon's flag; a socket that answers the connection (a
 * silent fake daemon) is waited on up to hello's own timeout, however short the connect
 * timeout. */
START_TEST(test_connect_timeout)
{
    ifd_rng rng;
    seed_rng(&rng);
    char ep[256];
    dead_endpoint(ep, sizeof ep);
    ifd_client_options o = {.connect_timeout_ms = (int)rand_between(&rng, 50, 300)};
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create_opts(&p, ep, "loader-0", &o, &err), err);
    int rc = ifd_producer_hello(p, ONE_U8, 1, 0, -1, &err); /* no bound of its own */
    RASSERT(rc == IFD_ETIMEDOUT, "hello with no daemon returned %s", ifd_errname(rc));
    RASSERT(strstr(err.msg, "no daemon answered at") && strstr(err.msg, ep) &&
                strstr(err.msg, "--listen") && strstr(err.msg, "connect_timeout_ms"),
            "%s", err.msg);
    ifd_producer_destroy(p);

    ifd_subscriber *s;
    RC_OK(ifd_subscriber_create_opts(&s, ep, &o, &err), err);
    char *json = NULL;
    rc = ifd_subscriber_recv(s, &json, -1, &err);
    RASSERT(rc == IFD_ETIMEDOUT && json == NULL, "recv with no daemon returned %s",
            ifd_errname(rc));
    RASSERT(strstr(err.msg, "no daemon answered at") && strstr(err.msg, "--publish"), "%s",
            err.msg);
    ifd_subscriber_destroy(s);

    fake f;
    fake_start(&f, script_silent, NULL);
    o.connect_timeout_ms = (int)rand_between(&rng, 300, 500);
    RC_OK(ifd_producer_create_opts(&p, f.endpoint, NULL, &o, &err), err);
    rc = ifd_producer_hello(p, ONE_U8, 1, 0,
                            o.connect_timeout_ms + (int)rand_between(&rng, 300, 600), &err);
    RASSERT(rc == IFD_ETIMEDOUT && strstr(err.msg, "no WELCOME") &&
                !strstr(err.msg, "no daemon answered"),
            "a connected but silent daemon: %s: %s", ifd_errname(rc), err.msg);
    fake_join(&f);
    ifd_producer_destroy(p);
}
END_TEST

/* hello's own timeout equal to the connect timeout (as examples/c_producer.c has them): with no
 * daemon the sentence is the connect timeout's, not "no WELCOME". */
START_TEST(test_connect_timeout_equal_to_hellos)
{
    ifd_rng rng;
    seed_rng(&rng);
    char ep[256];
    dead_endpoint(ep, sizeof ep);
    for (int i = 0; i < 3; i++) {
        ifd_client_options o = {.connect_timeout_ms = (int)rand_between(&rng, 50, 250)};
        ifd_producer *p;
        ifd_error err;
        RC_OK(ifd_producer_create_opts(&p, ep, "loader-0", &o, &err), err);
        int rc = ifd_producer_hello(p, ONE_U8, 1, 0, o.connect_timeout_ms, &err);
        char within[64];
        snprintf(within, sizeof within, "within %g s (connect_timeout_ms)",
                 o.connect_timeout_ms / 1000.0);
        RASSERT(rc == IFD_ETIMEDOUT && strstr(err.msg, "no daemon answered at") &&
                    strstr(err.msg, within) && !strstr(err.msg, "WELCOME"),
                "timeouts of %d ms: %s: %s", o.connect_timeout_ms, ifd_errname(rc), err.msg);
        ifd_producer_destroy(p);
    }
}
END_TEST

/* Why no daemon answered, as far as the client can tell: a CURVE client that hears nothing may
 * be refused (a refusal is not always reported); a client without CURVE whose handshake fails
 * may face a daemon that requires it. */
START_TEST(test_connect_timeout_says_curve)
{
    ifd_rng rng;
    seed_rng(&rng);
    char spub[41], ssec[41], cpub[41], csec[41];
    ck_assert(zmq_curve_keypair(spub, ssec) == 0);
    ck_assert(zmq_curve_keypair(cpub, csec) == 0);
    char ep[256];
    dead_endpoint(ep, sizeof ep);
    ifd_client_options curve = {.server_key = spub,
                                .public_key = cpub,
                                .secret_key = csec,
                                .connect_timeout_ms = (int)rand_between(&rng, 50, 200)};
    ifd_client_options plain = {.connect_timeout_ms = curve.connect_timeout_ms};
    const ifd_client_options *opts[] = {&curve, &plain};
    for (int i = 0; i < 2; i++) {
        ifd_producer *p;
        ifd_error err;
        RC_OK(ifd_producer_create_opts(&p, ep, "loader-0", opts[i], &err), err);
        int rc = ifd_producer_hello(p, ONE_U8, 1, 0, -1, &err);
        int says = strstr(err.msg, "or does it refuse this client's key (CURVE)?") != NULL;
        RASSERT(rc == IFD_ETIMEDOUT && strstr(err.msg, "is infeedd running with --listen") &&
                    says == (i == 0),
                "%s client, nothing answers: %s", i == 0 ? "a CURVE" : "a plain", err.msg);
        ifd_producer_destroy(p);
    }
    /* a CURVE server, a client without keys: the handshake fails */
    void *ctx = zmq_ctx_new(), *srv = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0, one = 1;
    zmq_setsockopt(srv, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(srv, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(srv, ZMQ_CURVE_SECRETKEY, ssec, 40);
    ck_assert(zmq_bind(srv, "tcp://127.0.0.1:*") == 0);
    size_t len = sizeof ep;
    zmq_getsockopt(srv, ZMQ_LAST_ENDPOINT, ep, &len);
    plain.connect_timeout_ms = (int)rand_between(&rng, 300, 600);
    ifd_subscriber *s;
    ifd_error err;
    RC_OK(ifd_subscriber_create_opts(&s, ep, &plain, &err), err);
    char *json = NULL;
    int rc = ifd_subscriber_recv(s, &json, -1, &err);
    RASSERT(rc == IFD_ETIMEDOUT &&
                strstr(err.msg, "the handshake failed: it may require CURVE (set "
                                "server_key_file and key_file)"),
            "a plain subscriber of a CURVE server: %s: %s", ifd_errname(rc), err.msg);
    ifd_subscriber_destroy(s);
    zmq_close(srv);
    zmq_ctx_term(ctx);
}
END_TEST

/* ---- BATCH bytes, ACKs, END and BYE ------------------------------------------------------- */

#define MAXB 40

typedef struct batch_case {
    int nb, n;
    int64_t next_seq, credit;
    int64_t rows[MAXB];
    size_t sizes[MAXB][IFD_MAX_INPUTS];
    int ack_delay_ms;
    int ack_before_end; /* ACK as batches come, or only after END */
    int bye_after;      /* ACKs sent before the BYE (nb: all) */
    const char *bye_status;
    atomic_llong end_seen_ms;
    atomic_llong last_ack_ms;
} batch_case;

static void script_batches(fake *f)
{
    batch_case *c = f->arg;
    FAKE_HELLO_WELCOME(f, c->credit, c->next_seq, 1);
    fmsg m;
    int acked = 0;
    for (int b = 0; b < c->nb; b++) {
        FCHECK(f, fake_recv(f, &m, 10000), "batch %d never came", b);
        const char *why = check_batch(&m, c->next_seq + b, c->rows[b], c->n, c->sizes[b]);
        fmsg_free(&m);
        FCHECK(f, why == NULL, "%s", why);
        if (c->ack_before_end && acked < c->bye_after)
            fake_ack(f, c->next_seq + acked++);
    }
    FCHECK(f, fake_recv(f, &m, 10000), "END never came");
    static const unsigned char end[8] = {'I', 'F', 'D', 'P', 1, 0, 6, 0};
    FCHECK(f, m.n == 1 && m.size[0] == 8 && memcmp(m.data[0], end, 8) == 0,
           "END: %d frames, header of %zu bytes, type %d", m.n, m.size[0], hdr_type(&m));
    fmsg_free(&m);
    atomic_store(&c->end_seen_ms, now_ms());
    sleep_ms(c->ack_delay_ms);
    while (acked < c->bye_after) {
        fake_ack(f, c->next_seq + acked++);
        sleep_ms(1);
    }
    atomic_store(&c->last_ack_ms, now_ms());
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
            fill_pattern(bufs[i], c->sizes[b][i], seq, i);
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
}

START_TEST(test_batches_end_bye)
{
    ifd_rng rng;
    seed_rng(&rng);
    batch_case c;
    batch_case_random(&c, &rng);
    c.ack_before_end = (int)rand_between(&rng, 0, 1);
    c.ack_delay_ms = (int)rand_between(&rng, 50, 150);
    fake f;
    fake_start(&f, script_batches, &c);
    ifd_producer *p;
    ifd_error err;
    atomic_int zc_freed = 0;
    int zc_frames = 0;
    RC_OK(ifd_producer_create(&p, f.endpoint, "b", &err), err);
    RC_OK(ifd_producer_hello(p, ONE_U8, 1, 0, 10000, &err), err);
    send_batches(p, &c, &rng, &zc_freed, &zc_frames);
    RASSERT(ifd_producer_sent(p) == c.nb, "sent %" PRId64 ", expected %d", ifd_producer_sent(p),
            c.nb);
    RC_OK(ifd_producer_end(p, 10000, &err), err);
    int64_t returned = now_ms();
    RASSERT(ifd_producer_in_flight(p) == 0, "%" PRId64 " in flight after end",
            ifd_producer_in_flight(p));
    RASSERT(ifd_producer_acked(p) == c.nb, "acked %" PRId64 ", expected %d", ifd_producer_acked(p),
            c.nb);
    RASSERT(ifd_producer_acked_seq(p) == c.next_seq + c.nb - 1, "acked_seq %" PRId64,
            ifd_producer_acked_seq(p));
    if (!c.ack_before_end)
        RASSERT(returned >= atomic_load(&c.last_ack_ms) - 5,
                "end returned before the last ACK was sent");
    const char *bye;
    RC_OK(ifd_producer_bye(p, 10000, &bye, &err), err);
    RASSERT(strstr(bye, "\"status\": \"ok\"") != NULL, "BYE JSON: %s", bye);
    ifd_frame fr = {"abcd", 4};
    RASSERT(ifd_producer_send(p, 1, &fr, 1, 0, &err) == IFD_ECLOSED, "send after END");
    fake_join(&f);
    ifd_producer_destroy(p);
    RASSERT(atomic_load(&zc_freed) == zc_frames, "%d zero-copy frames released, expected %d",
            atomic_load(&zc_freed), zc_frames);
    zc_bufs_free();
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
        c.ack_delay_ms = 10;
        fake f;
        fake_start(&f, script_batches, &c);
        ifd_producer *p;
        ifd_error err;
        atomic_int zc_freed = 0;
        int zc_frames = 0;
        RC_OK(ifd_producer_create(&p, f.endpoint, NULL, &err), err);
        RC_OK(ifd_producer_hello(p, ONE_U8, 1, 0, 10000, &err), err);
        send_batches(p, &c, &rng, &zc_freed, &zc_frames);
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
        fake_join(&f);
        ifd_producer_destroy(p);
        RASSERT(atomic_load(&zc_freed) == zc_frames, "%d zero-copy frames released, expected %d",
                atomic_load(&zc_freed), zc_frames);
        zc_bufs_free();
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
    RC_OK(ifd_producer_hello(p, ONE_U8, 1, 0, 10000, &err), err);
    int k = (int)rand_between(&rng, 1, 4);
    for (int b = 0; b < k; b++) {
        ifd_frame fr = {"abcd", 4};
        RC_OK(ifd_producer_send(p, 1, &fr, 1, 1000, &err), err);
    }
    int t = (int)rand_between(&rng, 20, 100);
    int64_t t0 = now_ms();
    int rc = ifd_producer_end(p, t, &err);
    int64_t dt = now_ms() - t0;
    RASSERT(rc == IFD_ETIMEDOUT && dt >= t, "end with no ACKs returned %s after %" PRId64 " ms",
            ifd_errname(rc), dt);
    RASSERT(ifd_producer_wait(p, 0, &err) == IFD_ETIMEDOUT, "wait with no ACKs");
    fake_join(&f);
    ifd_producer_destroy(p);
}
END_TEST

/* ---- credit ------------------------------------------------------------------------------- */

typedef struct credit_case {
    int credit;
    int delay_ms;
    int use_credit_msg; /* wake the blocked send with CREDIT instead of ACK */
    atomic_llong woke_ms;
} credit_case;

static void script_credit(fake *f)
{
    credit_case *c = f->arg;
    FAKE_HELLO_WELCOME(f, c->credit, 0, 1);
    fmsg m;
    for (int b = 0; b < c->credit; b++) {
        FCHECK(f, fake_recv(f, &m, 10000), "batch %d never came", b);
        const char *why = check_batch(&m, b, 1, 1, (size_t[]){4});
        fmsg_free(&m);
        FCHECK(f, why == NULL, "%s", why);
    }
    /* The client is out of credit: nothing may come. */
    FCHECK(f, !fake_recv(f, &m, c->delay_ms), "a batch was sent with no credit (type %d)",
           hdr_type(&m));
    atomic_store(&c->woke_ms, now_ms());
    if (c->use_credit_msg)
        fake_credit(f, 1);
    else
        fake_ack(f, 0);
    FCHECK(f, fake_recv(f, &m, 10000), "the blocked batch never came");
    const char *why = check_batch(&m, c->credit, 1, 1, (size_t[]){4});
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
    c.delay_ms = (int)rand_between(&rng, 100, 250);
    c.use_credit_msg = (int)rand_between(&rng, 0, 1);
    fake f;
    fake_start(&f, script_credit, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, NULL, &err), err);
    RC_OK(ifd_producer_hello(p, ONE_U8, 1, 0, 10000, &err), err);
    ifd_frame fr = {NULL, 4};
    for (int b = 0; b <= c.credit; b++) {
        unsigned char buf[4];
        fill_pattern(buf, 4, b, 0);
        fr.data = buf;
        int64_t t0 = now_ms();
        RC_OK(ifd_producer_send(p, 1, &fr, 1, -1, &err), err);
        int64_t t1 = now_ms();
        if (b < c.credit)
            RASSERT(t1 - t0 < c.delay_ms / 2, "send %d of %d with credit took %" PRId64 " ms", b,
                    c.credit, t1 - t0);
        else
            RASSERT(t1 >= atomic_load(&c.woke_ms) && atomic_load(&c.woke_ms) > 0,
                    "send with no credit returned before the daemon's %s",
                    c.use_credit_msg ? "CREDIT" : "ACK");
    }
    RASSERT(ifd_producer_available(p) == 0, "available %" PRId64, ifd_producer_available(p));
    /* No credit: timeout 0 fails at once, a short timeout after it. */
    unsigned char junk[4] = {0};
    fr.data = junk;
    int rc = ifd_producer_send(p, 1, &fr, 1, 0, &err);
    RASSERT(rc == IFD_ETIMEDOUT, "send with no credit and timeout 0 returned %s", ifd_errname(rc));
    int t = (int)rand_between(&rng, 20, 80);
    int64_t t0 = now_ms();
    rc = ifd_producer_send(p, 1, &fr, 1, t, &err);
    int64_t dt = now_ms() - t0;
    RASSERT(rc == IFD_ETIMEDOUT && dt >= t && dt < t + 2000,
            "send with no credit returned %s after %" PRId64 " ms (timeout %d)", ifd_errname(rc),
            dt, t);
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

static void fake_ack_n(fake *f, int64_t seq, uint32_t n)
{
    unsigned char b[16] = {0};
    put_le(b, (uint64_t)seq, 8);
    put_le(b + 8, n, 4);
    fake_send(f, 5, b, 16, NULL);
}

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
    const char *why = check_batch(&m, 0, c->k1 * c->b, 1, (size_t[]){(size_t)(4 * c->k1 * c->b)});
    fmsg_free(&m);
    FCHECK(f, why == NULL, "%s", why);
    for (int i = 0; i < 10000 && !atomic_load(&c->go); i++)
        usleep(1000);
    fake_ack_n(f, c->ack1 - 1, (uint32_t)c->ack1); /* the first steps of message 1 */
    FCHECK(f, fake_recv(f, &m, 10000), "message 2 never came");
    why = check_batch(&m, c->k1, c->k2 * c->b, 1, (size_t[]){(size_t)(4 * c->k2 * c->b)});
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
    RC_OK(ifd_producer_hello(p, ONE_U8, 1, 0, 10000, &err), err);
    unsigned char buf[4 * 8 * 5];
    fill_pattern(buf, (size_t)(4 * c.k1 * c.b), 0, 0);
    ifd_frame fr = {buf, (size_t)(4 * c.k1 * c.b)};
    RC_OK(ifd_producer_send(p, c.k1 * c.b, &fr, 1, 10000, &err), err);
    RASSERT(ifd_producer_next_seq(p) == c.k1 && ifd_producer_in_flight(p) == c.k1 &&
                ifd_producer_available(p) == left,
            "after %d steps: next_seq %" PRId64 " in_flight %" PRId64 " available %" PRId64, c.k1,
            ifd_producer_next_seq(p), ifd_producer_in_flight(p), ifd_producer_available(p));
    fill_pattern(buf, (size_t)(4 * c.k2 * c.b), c.k1, 0);
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

/* ---- ERROR replies ------------------------------------------------------------------------ */

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
        int64_t seq = (int64_t)get_le(m.data[0] + 8, 8);
        fmsg_free(&m);
        FCHECK(f, seq == 100 + b, "seq %" PRId64 ", expected %d", seq, 100 + b);
        if (b == c->bad)
            fake_error(f, c->code >= 0 ? CODES[c->code] : "EWHATEVER", seq, 1, c->msg);
        else
            fake_ack(f, seq);
    }
    /* Phase 2: batch B rejected; the next send must return that and not go; it then goes. */
    FCHECK(f, fake_recv(f, &m, 10000), "batch B never came");
    int64_t seq = (int64_t)get_le(m.data[0] + 8, 8);
    fmsg_free(&m);
    FCHECK(f, seq == 100 + c->k, "batch B seq %" PRId64, seq);
    fake_error(f, CODES[c->code2], seq, 1, c->msg2);
    FCHECK(f, fake_recv(f, &m, 10000), "batch C never came");
    int64_t seq2 = (int64_t)get_le(m.data[0] + 8, 8);
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
    RC_OK(ifd_producer_hello(p, ONE_U8, 1, 0, 10000, &err), err);
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
    sleep_ms(150); /* the ERROR for B is in */
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
    atomic_int error_sent; /* the fake has answered batch 0 with ERROR */
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
        const char *why = check_batch(&m, seq, 1, 2, (size_t[]){c->size[b], 8});
        fmsg_free(&m);
        FCHECK(f, why == NULL, "%s", why);
        if (b == 0) {
            fake_error(f, "ERANGE", seq, 1, "label out of range");
            atomic_store(&c->error_sent, 1);
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
    fill_pattern(z->data, n, seq, i);
    return z;
}

START_TEST(test_zero_copy)
{
    ifd_rng rng;
    seed_rng(&rng);
    zc_case c;
    c.nb = (int)rand_between(&rng, 2, 12);
    atomic_init(&c.error_sent, 0);
    for (int b = 0; b < c.nb; b++)
        c.size[b] = (size_t)rand_between(&rng, 1, 1 << 20);
    fake f;
    fake_start(&f, script_zc, &c);
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create(&p, f.endpoint, NULL, &err), err);
    RC_OK(ifd_producer_hello(p, ONE_U8, 1, 0, 10000, &err), err);
    zbuf *all[4 * MAXB];
    int nall = 0;
    int refused = 0;
    for (int b = 0; b < c.nb; b++) {
        int64_t seq = ifd_producer_next_seq(p);
        zbuf *z0 = zbuf_new(c.size[b], seq, 0), *z1 = zbuf_new(8, seq, 1);
        all[nall++] = z0;
        all[nall++] = z1;
        ifd_frame fr[2] = {{z0->data, c.size[b]}, {z1->data, 8}};
        if (b == 1 && !refused) { /* batch 0's ERROR is sent, and in after a moment on loopback */
            for (int w = 0; w < 10000 && !atomic_load(&c.error_sent); w++)
                sleep_ms(1);
            sleep_ms(100);
        }
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

/* ---- subscriber --------------------------------------------------------------------------- */

typedef struct pub_case {
    void *pub;
    atomic_int stop;
    int tag;
} pub_case;

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
        put_le(h + 8, (uint64_t)b, 8);
        put_le(h + 16, (uint64_t)c->rows[b], 8);
        put_le(h + 28, 2, 4);
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
    RC_OK(ifd_producer_hello(p, ONE_U8, 1, 0, 10000, &err), err);
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

static void *publisher(void *arg)
{
    pub_case *c = arg;
    for (int i = 0; !atomic_load(&c->stop); i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"kind\": \"train\", \"tag\": %d, \"i\": %d}", c->tag, i);
        zmq_send(c->pub, json, strlen(json), 0);
        sleep_ms(5);
    }
    return NULL;
}

START_TEST(test_subscriber)
{
    ifd_rng rng;
    seed_rng(&rng);
    void *ctx = zmq_ctx_new();
    pub_case c;
    c.pub = zmq_socket(ctx, ZMQ_PUB);
    atomic_init(&c.stop, 0);
    c.tag = (int)rand_between(&rng, 0, 1 << 30);
    int zero = 0;
    zmq_setsockopt(c.pub, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert(zmq_bind(c.pub, "tcp://127.0.0.1:*") == 0);
    char ep[128];
    size_t len = sizeof ep;
    zmq_getsockopt(c.pub, ZMQ_LAST_ENDPOINT, ep, &len);

    ifd_subscriber *s;
    ifd_error err;
    RC_OK(ifd_subscriber_create(&s, ep, &err), err);
    /* Nothing published yet: a timeout. */
    int t = (int)rand_between(&rng, 10, 60);
    int64_t t0 = now_ms();
    char *json = NULL;
    int rc = ifd_subscriber_recv(s, &json, t, &err);
    RASSERT(rc == IFD_ETIMEDOUT && json == NULL && now_ms() - t0 >= t,
            "recv with nothing published returned %s", ifd_errname(rc));
    pthread_t th;
    pthread_create(&th, NULL, publisher, &c);
    int n = (int)rand_between(&rng, 1, 5);
    for (int i = 0; i < n; i++) {
        RC_OK(ifd_subscriber_recv(s, &json, 10000, &err), err);
        json_t *o = json_loads(json, 0, NULL);
        RASSERT(json_is_object(o) && json_integer_value(json_object_get(o, "tag")) == c.tag,
                "summary '%s'", json);
        json_decref(o);
        free(json);
    }
    atomic_store(&c.stop, 1);
    pthread_join(th, NULL);
    ifd_subscriber_destroy(s);
    ifd_subscriber_destroy(NULL);
    zmq_close(c.pub);
    zmq_ctx_term(ctx);
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
    put_le(h + 8, 3, 8);
    put_le(h + 16, (uint64_t)rows, 8);
    put_le(h + 28, ntensors, 4);
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

/* ---- argument checks ---------------------------------------------------------------------- */

START_TEST(test_arguments)
{
    ifd_producer *p = (ifd_producer *)1;
    ifd_error err;
    RASSERT(ifd_producer_create(&p, "", NULL, &err) == IFD_EINVAL && p == NULL, "empty endpoint");
    char longname[80];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    RASSERT(ifd_producer_create(&p, "tcp://127.0.0.1:1", longname, &err) == IFD_EINVAL,
            "a 79-byte name accepted");
    RASSERT(ifd_producer_create(&p, "nonsense://x", NULL, &err) == IFD_EINVAL,
            "a bad endpoint accepted");
    RC_OK(ifd_producer_create(&p, "tcp://127.0.0.1:1", "ok", &err), err);
    ifd_input_spec bad = {"x", IFD_DTYPE_INVALID, 0, {0}};
    RASSERT(ifd_producer_hello(p, &bad, 1, 0, 0, &err) == IFD_EDTYPE, "a bad dtype accepted");
    RASSERT(ifd_producer_hello(p, ONE_U8, 1, -1, 0, &err) == IFD_EINVAL, "first_seq -1");
    RASSERT(ifd_producer_hello(p, ONE_U8, 0, 0, 0, &err) == IFD_EINVAL, "0 tensors");
    RASSERT(ifd_producer_end(p, 0, &err) == IFD_EINVAL, "end before WELCOME");
    ifd_producer_destroy(p);
}
END_TEST

/* ---- CURVE -------------------------------------------------------------------------------- */

/* Writes text to a fresh file under dir; returns its path (static buffer per slot). */
static const char *write_file(const char *dir, const char *name, const char *text, char *path,
                              size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert(f != NULL);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Every misuse of ifd_client_options is IFD_EINVAL naming the field, and creates nothing. */
START_TEST(test_curve_options)
{
    char spub[41], ssec[41], cpub[41], csec[41], opub[41], osec[41];
    ck_assert(zmq_curve_keypair(spub, ssec) == 0);
    ck_assert(zmq_curve_keypair(cpub, csec) == 0);
    ck_assert(zmq_curve_keypair(opub, osec) == 0);
    char dir[] = "/tmp/ifd-client-keys-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char pair[512], pubtext[64], p1[256], p2[256], p3[256], p4[256];
    snprintf(pair, sizeof pair, "# a comment\n\npublic-key %s\nsecret-key %s\n", cpub, csec);
    snprintf(pubtext, sizeof pubtext, "%s\n", spub);
    const char *keyfile = write_file(dir, "c.key", pair, p1, sizeof p1);
    const char *pubfile = write_file(dir, "s.pub", pubtext, p2, sizeof p2);
    snprintf(pair, sizeof pair, "public-key %s\nsecret-key %s\n", opub, csec); /* mismatched */
    const char *mixed = write_file(dir, "m.key", pair, p3, sizeof p3);
    const char *garbage = write_file(dir, "g.pub", "not a key\n", p4, sizeof p4);
    struct {
        ifd_client_options o;
        const char *names; /* a word the error must contain */
    } bad[] = {
        {{.server_key = spub}, "key_file"},
        {{.key_file = keyfile}, "server_key"},
        {{.server_key = spub, .server_key_file = pubfile, .key_file = keyfile}, "both"},
        {{.server_key = spub, .public_key = cpub, .key_file = keyfile}, "both"},
        {{.server_key = spub, .public_key = cpub}, "no secret_key"},
        {{.server_key = "short", .key_file = keyfile}, "server_key"},
        {{.server_key = spub, .public_key = opub, .secret_key = csec}, "public_key"},
        {{.server_key = spub, .public_key = cpub, .secret_key = "x"}, "secret_key"},
        {{.server_key = spub, .key_file = mixed}, "m.key"},
        {{.server_key_file = garbage, .key_file = keyfile}, "g.pub', line 1"},
        {{.server_key_file = keyfile, .key_file = keyfile}, "key pair file"},
        {{.server_key_file = "/nonexistent/s.pub", .key_file = keyfile}, "cannot open"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ifd_producer *p = (ifd_producer *)1;
        ifd_error err;
        ifd_error_clear(&err);
        int rc = ifd_producer_create_opts(&p, "tcp://127.0.0.1:1", "n", &bad[i].o, &err);
        RASSERT(rc == IFD_EINVAL && p == NULL && strstr(err.msg, bad[i].names),
                "case %zu: %s, '%s' (expected it to name '%s')", i, ifd_errname(rc), err.msg,
                bad[i].names);
        ifd_subscriber *s = (ifd_subscriber *)1;
        rc = ifd_subscriber_create_opts(&s, "tcp://127.0.0.1:1", &bad[i].o, &err);
        RASSERT(rc == IFD_EINVAL && s == NULL, "subscriber case %zu: %s", i, ifd_errname(rc));
    }
    /* the good forms, and no options at all */
    ifd_client_options good[] = {
        {.server_key = spub, .key_file = keyfile},
        {.server_key_file = pubfile, .public_key = cpub, .secret_key = csec},
        {0}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ifd_producer *p;
        ifd_error err;
        RC_OK(ifd_producer_create_opts(&p, "tcp://127.0.0.1:1", "n", &good[i], &err), err);
        ifd_producer_destroy(p);
    }
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create_opts(&p, "tcp://127.0.0.1:1", "n", NULL, &err), err);
    ifd_producer_destroy(p);
    unlink(p1);
    unlink(p2);
    unlink(p3);
    unlink(p4);
    rmdir(dir);
}
END_TEST

/* A subscriber with the server's key receives a CURVE PUB's summaries; one that has another
 * server key, or no keys, receives nothing. */
START_TEST(test_curve_subscriber)
{
    ifd_rng rng;
    seed_rng(&rng);
    char spub[41], ssec[41], cpub[41], csec[41], wpub[41], wsec[41];
    ck_assert(zmq_curve_keypair(spub, ssec) == 0);
    ck_assert(zmq_curve_keypair(cpub, csec) == 0);
    ck_assert(zmq_curve_keypair(wpub, wsec) == 0);
    void *ctx = zmq_ctx_new();
    pub_case c;
    c.pub = zmq_socket(ctx, ZMQ_PUB);
    atomic_init(&c.stop, 0);
    c.tag = (int)rand_between(&rng, 0, 1 << 30);
    int zero = 0, one = 1;
    zmq_setsockopt(c.pub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c.pub, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(c.pub, ZMQ_CURVE_SECRETKEY, ssec, 40);
    ck_assert(zmq_bind(c.pub, "tcp://127.0.0.1:*") == 0);
    char ep[128];
    size_t len = sizeof ep;
    zmq_getsockopt(c.pub, ZMQ_LAST_ENDPOINT, ep, &len);

    ifd_error err;
    ifd_subscriber *good, *wrong, *plain;
    ifd_client_options o = {.server_key = spub, .public_key = cpub, .secret_key = csec};
    RC_OK(ifd_subscriber_create_opts(&good, ep, &o, &err), err);
    o.server_key = wpub; /* not the server's: the handshake fails */
    RC_OK(ifd_subscriber_create_opts(&wrong, ep, &o, &err), err);
    RC_OK(ifd_subscriber_create_opts(&plain, ep, NULL, &err), err);
    pthread_t th;
    pthread_create(&th, NULL, publisher, &c);
    char *json = NULL;
    int n = (int)rand_between(&rng, 1, 4);
    for (int i = 0; i < n; i++) {
        RC_OK(ifd_subscriber_recv(good, &json, 10000, &err), err);
        json_t *obj = json_loads(json, 0, NULL);
        RASSERT(json_is_object(obj) && json_integer_value(json_object_get(obj, "tag")) == c.tag,
                "summary '%s'", json);
        json_decref(obj);
        free(json);
    }
    int rc = ifd_subscriber_recv(wrong, &json, 300, &err);
    RASSERT(rc == IFD_ETIMEDOUT && json == NULL, "a subscriber with another server key got %s",
            json ? json : ifd_errname(rc));
    rc = ifd_subscriber_recv(plain, &json, 100, &err);
    RASSERT(rc == IFD_ETIMEDOUT && json == NULL, "a subscriber without CURVE got %s",
            json ? json : ifd_errname(rc));
    atomic_store(&c.stop, 1);
    pthread_join(th, NULL);
    ifd_subscriber_destroy(good);
    ifd_subscriber_destroy(wrong);
    ifd_subscriber_destroy(plain);
    zmq_close(c.pub);
    zmq_ctx_term(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("producer");
    tcase_add_test(tc, test_hello_welcome);
    tcase_add_test(tc, test_hello_timeout);
    tcase_add_test(tc, test_connect_timeout);
    tcase_add_test(tc, test_connect_timeout_equal_to_hellos);
    tcase_add_test(tc, test_connect_timeout_says_curve);
    tcase_add_test(tc, test_batches_end_bye);
    tcase_add_test(tc, test_end_bye_first);
    tcase_add_test(tc, test_end_timeout);
    tcase_add_test(tc, test_several_steps_in_one_message);
    tcase_add_test(tc, test_credit_blocks);
    tcase_add_test(tc, test_async_error);
    tcase_add_test(tc, test_zero_copy);
    tcase_add_test(tc, test_arguments);
    tcase_add_loop_test(tc, test_predictions, 0, 2);
    tcase_add_test(tc, test_prediction_overflow);
    tcase_add_test(tc, test_error_credit_saturates);
    suite_add_tcase(s, tc);
    TCase *ts = tcase_create("subscriber");
    tcase_add_test(ts, test_subscriber);
    tcase_add_test(ts, test_curve_subscriber);
    tcase_add_test(ts, test_curve_options);
    suite_add_tcase(s, ts);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
