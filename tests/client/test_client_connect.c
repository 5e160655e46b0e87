/*
 * The C client (include/infeed/client.h) connecting, against fake daemons (tests/util/
 * fake_daemon.c): HELLO byte by byte and answered by ERROR then WELCOME, hello's timeout, the
 * connect timeout and what its sentence says (CURVE or not), the client options' checks (CURVE
 * keys and key files) and the arguments' checks.
 *
 * Sizes, counts and codes are random. The seed comes from IFD_TEST_SEED when set, else from the
 * clock, and every failure message names it.
 */
#include <infeed/client.h>

#include "core/rng.h"
#include "core/thread.h"
#include "tests/util/fake_daemon.h"
#include "tests/util/testutil.h"
#include "tests/util/files.h"

#include <check.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

typedef struct hello_case {
    ifd_input_spec schema[IFD_MAX_INPUTS];
    int n;
    int64_t first_seq;
    char name[64];
    int64_t credit, next_seq, batch_size;
    int replicas;
    int replica; /* -1: none (no key) */
    int eval;    /* role "eval" (else no key: train) */
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
    size_t keys = (c->replica >= 0 ? 5 : 4) + (c->eval ? 1 : 0);
    FCHECK(f, json_object_size(o) == keys, "HELLO has %zu keys, expected %zu", json_object_size(o),
           keys);
    FCHECK(f, json_is_true(json_object_get(o, "shm")), "HELLO shm: expected true (auto, local)");
    FCHECK(f,
           c->replica < 0 || (json_is_integer(json_object_get(o, "replica")) &&
                              json_integer_value(json_object_get(o, "replica")) == c->replica),
           "HELLO replica");
    const char *role = json_string_value(json_object_get(o, "role"));
    FCHECK(f, c->eval ? role && strcmp(role, "eval") == 0 : role == NULL, "HELLO role: %s",
           role ? role : "none");
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
    c.eval = (int)rand_between(&rng, 0, 1);
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
    RASSERT(ifd_producer_set_role(p, "predict", &err) == IFD_EINVAL && strstr(err.msg, "role"),
            "set_role(predict): %s", err.msg);
    RC_OK(ifd_producer_set_role(p, c.eval ? "eval" : "train", &err), err);
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

/* Takes HELLO and answers nothing (the socket stays bound until fake_join). */
static void script_silent(fake *f)
{
    fmsg m;
    if (fake_recv(f, &m, 10000))
        fmsg_free(&m);
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
    int64_t t0 = ifd_clock_ns(), deadline = t0 + t * MS;
    int rc = ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, t, &err);
    int64_t back = ifd_clock_ns();
    RASSERT(rc == IFD_ETIMEDOUT, "hello with no answer returned %s", ifd_errname(rc));
    /* The order of the events: the timeout passed, then hello returned. A timeout that returns
     * early is the bug this looks for, so the lower bound stays; it needs no margin, since the
     * deadline is taken before the call on the clock hello counts on (CLOCK_MONOTONIC), and
     * hello returns IFD_ETIMEDOUT only once that clock passed its own, later, deadline. The
     * upper bound is generous (2 s over). */
    RASSERT(back >= deadline && back - t0 < (t + 2000) * MS,
            "hello timed out after %" PRId64 " ns, timeout %d ms", back - t0, t);
    /* No WELCOME: sending is refused. */
    ifd_frame fr = {"abcd", 4};
    RASSERT(ifd_producer_send(p, 1, &fr, 1, 0, &err) == IFD_EINVAL, "send before WELCOME");
    fake_join(&f);
    ifd_producer_destroy(p);
    ifd_producer_destroy(NULL);
}
END_TEST

/* An endpoint where nothing listens: a free port below the kernel's ephemeral range, so that a
 * client reconnecting there is never given it as its own port (see test_self_connection). */
static void dead_endpoint(ifd_rng *rng, char *buf, size_t len)
{
    int low = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &low) != 1)
            low = 32768;
        fclose(f);
    }
    ck_assert_int_gt(low, 10001);
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    int bound = 0;
    for (int i = 0; i < 200 && !bound; i++) {
        snprintf(buf, len, "tcp://127.0.0.1:%d", (int)rand_between(rng, 10000, low - 1));
        bound = zmq_bind(s, buf) == 0;
    }
    ck_assert_msg(bound, "no free port below %d", low);
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
    dead_endpoint(&rng, ep, sizeof ep);
    ifd_client_options o = {.connect_timeout_ms = (int)rand_between(&rng, 50, 300)};
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create_opts(&p, ep, "loader-0", &o, &err), err);
    int rc = ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, -1, &err); /* no bound of its own */
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
    rc = ifd_producer_hello(p, FAKE_ONE_U8, 1, 0,
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
    dead_endpoint(&rng, ep, sizeof ep);
    for (int i = 0; i < 3; i++) {
        ifd_client_options o = {.connect_timeout_ms = (int)rand_between(&rng, 50, 250)};
        ifd_producer *p;
        ifd_error err;
        RC_OK(ifd_producer_create_opts(&p, ep, "loader-0", &o, &err), err);
        int rc = ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, o.connect_timeout_ms, &err);
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

/* A socket that connects to itself (a TCP client given the port it connects to as its own, which
 * the kernel can do on a port of its ephemeral range where nothing listens; here forced with a
 * source address) is not a daemon: hello reconnects and sends HELLO again until the connect
 * timeout, whose sentence it ends with (it said "no WELCOME", CI's seed 2026-11-26). */
START_TEST(test_self_connection)
{
    ifd_rng rng;
    seed_rng(&rng);
    char ep[256], self[600];
    dead_endpoint(&rng, ep, sizeof ep);
    const char *addr = ep + strlen("tcp://");
    snprintf(self, sizeof self, "tcp://%s;%s", addr, addr);
    ifd_client_options o = {.connect_timeout_ms = (int)rand_between(&rng, 100, 400)};
    ifd_producer *p;
    ifd_error err;
    RC_OK(ifd_producer_create_opts(&p, self, "loader-0", &o, &err), err);
    int rc = ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, o.connect_timeout_ms, &err);
    RASSERT(rc == IFD_ETIMEDOUT && strstr(err.msg, "no daemon answered at") &&
                !strstr(err.msg, "WELCOME"),
            "connected to itself: %s: %s", ifd_errname(rc), err.msg);
    ifd_producer_destroy(p);
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
    dead_endpoint(&rng, ep, sizeof ep);
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
        int rc = ifd_producer_hello(p, FAKE_ONE_U8, 1, 0, -1, &err);
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
    RASSERT(ifd_producer_hello(p, FAKE_ONE_U8, 1, -1, 0, &err) == IFD_EINVAL, "first_seq -1");
    RASSERT(ifd_producer_hello(p, FAKE_ONE_U8, 0, 0, 0, &err) == IFD_EINVAL, "0 tensors");
    RASSERT(ifd_producer_end(p, 0, &err) == IFD_EINVAL, "end before WELCOME");
    ifd_producer_destroy(p);
}
END_TEST

/* Writes text to the file name under dir; returns its path (in path). */
static const char *write_file(const char *dir, const char *name, const char *text, char *path,
                              size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    tu_spit(path, text, strlen(text));
    return path;
}

/* Every misuse of ifd_client_options is IFD_EINVAL naming the field, and creates nothing. */
START_TEST(test_curve_options)
{
    char spub[41], ssec[41], cpub[41], csec[41], opub[41], osec[41];
    ck_assert(zmq_curve_keypair(spub, ssec) == 0);
    ck_assert(zmq_curve_keypair(cpub, csec) == 0);
    ck_assert(zmq_curve_keypair(opub, osec) == 0);
    char *dir = tu_tmp_dir("ifd-client-keys");
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
    tu_rm_dir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_connect");
    TCase *tc = tu_tcase(s, "producer", 60);
    tcase_add_test(tc, test_hello_welcome);
    tcase_add_test(tc, test_hello_timeout);
    tcase_add_test(tc, test_connect_timeout);
    tcase_add_test(tc, test_connect_timeout_equal_to_hellos);
    tcase_add_test(tc, test_self_connection);
    tcase_add_test(tc, test_connect_timeout_says_curve);
    tcase_add_test(tc, test_arguments);
    tcase_add_test(tc, test_curve_options);
    return tu_run_suite(s);
}
