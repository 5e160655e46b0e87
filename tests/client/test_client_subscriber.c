/*
 * The C client's summary subscriber (include/infeed/client.h) against a PUB socket of the test:
 * its timeout, the summaries it receives, and CURVE: a subscriber with the server's key receives,
 * one with another key or none receives nothing.
 *
 * Sizes, counts and codes are random. The seed comes from IFD_TEST_SEED when set, else from the
 * clock, and every failure message names it.
 */
#include <infeed/client.h>

#include "core/rng.h"
#include "core/thread.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* A summary publisher: an XPUB socket, which hands the publisher each new subscription, so that
 * it publishes once a subscriber listens (a handshake) instead of publishing on a timer until one
 * does. */
typedef struct pub_case {
    void *pub;
    char endpoint[128];
    int tag;
    int n;           /* summaries published at once after the subscription */
    int subscribed;  /* a subscription came (publisher's) */
    atomic_int stop; /* the test is done */
} pub_case;

/* Binds the publisher on a free loopback port; a CURVE server when secret is not NULL. */
static void pub_open(pub_case *c, void *ctx, const char *secret)
{
    c->pub = zmq_socket(ctx, ZMQ_XPUB);
    ck_assert_ptr_nonnull(c->pub);
    int zero = 0, one = 1;
    ck_assert(zmq_setsockopt(c->pub, ZMQ_LINGER, &zero, sizeof zero) == 0);
    if (secret) {
        ck_assert(zmq_setsockopt(c->pub, ZMQ_CURVE_SERVER, &one, sizeof one) == 0);
        ck_assert(zmq_setsockopt(c->pub, ZMQ_CURVE_SECRETKEY, secret, 40) == 0);
    }
    ck_assert(zmq_bind(c->pub, "tcp://127.0.0.1:*") == 0);
    size_t len = sizeof c->endpoint;
    ck_assert(zmq_getsockopt(c->pub, ZMQ_LAST_ENDPOINT, c->endpoint, &len) == 0);
}

/* Waits (10 s at most) for a subscription, then publishes n summaries at once; then one every 5
 * ms until stopped, so that a subscriber that should receive nothing (CURVE) is tested against a
 * stream, not a silence. */
static void *publisher(void *arg)
{
    pub_case *c = arg;
    zmq_pollitem_t it = {c->pub, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 10000) != 1)
        return NULL;
    unsigned char sub[64];
    c->subscribed = zmq_recv(c->pub, sub, sizeof sub, 0) >= 1 && sub[0] == 1;
    for (int i = 0; c->subscribed && !atomic_load(&c->stop); i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"kind\": \"train\", \"tag\": %d, \"i\": %d}", c->tag, i);
        zmq_send(c->pub, json, strlen(json), 0);
        if (i >= c->n)
            ifd_sleep_ns(5 * MS);
    }
    return NULL;
}

START_TEST(test_subscriber)
{
    ifd_rng rng;
    seed_rng(&rng);
    void *ctx = zmq_ctx_new();
    pub_case c = {.tag = (int)rand_between(&rng, 0, 1 << 30), .n = (int)rand_between(&rng, 1, 5)};
    atomic_init(&c.stop, 0);
    pub_open(&c, ctx, NULL);

    ifd_subscriber *s;
    ifd_error err;
    RC_OK(ifd_subscriber_create(&s, c.endpoint, &err), err);
    /* Nothing published yet: a timeout. */
    int t = (int)rand_between(&rng, 10, 60);
    int64_t deadline = ifd_clock_ns() + t * MS;
    char *json = NULL;
    int rc = ifd_subscriber_recv(s, &json, t, &err);
    /* The order of the events: the timeout passed, then recv returned. A timeout that returns
     * early is the bug this looks for, so the lower bound stays; it needs no margin, since the
     * deadline is taken before the call on the clock recv counts on (CLOCK_MONOTONIC), and recv
     * returns IFD_ETIMEDOUT only once that clock passed its own, later, deadline. */
    RASSERT(rc == IFD_ETIMEDOUT && json == NULL && ifd_clock_ns() >= deadline,
            "recv with nothing published returned %s", ifd_errname(rc));
    pthread_t th;
    pthread_create(&th, NULL, publisher, &c);
    for (int i = 0; i < c.n; i++) {
        RC_OK(ifd_subscriber_recv(s, &json, 10000, &err), err);
        json_t *o = json_loads(json, 0, NULL);
        RASSERT(json_is_object(o) && json_integer_value(json_object_get(o, "tag")) == c.tag,
                "summary '%s'", json);
        json_decref(o);
        free(json);
    }
    atomic_store(&c.stop, 1);
    pthread_join(th, NULL);
    RASSERT(c.subscribed, "the publisher saw no subscription");
    ifd_subscriber_destroy(s);
    ifd_subscriber_destroy(NULL);
    zmq_close(c.pub);
    zmq_ctx_term(ctx);
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
    pub_case c = {.tag = (int)rand_between(&rng, 0, 1 << 30), .n = (int)rand_between(&rng, 1, 4)};
    atomic_init(&c.stop, 0);
    pub_open(&c, ctx, ssec);
    const char *ep = c.endpoint;

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
    for (int i = 0; i < c.n; i++) {
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
    RASSERT(c.subscribed, "the publisher saw no subscription");
    ifd_subscriber_destroy(good);
    ifd_subscriber_destroy(wrong);
    ifd_subscriber_destroy(plain);
    zmq_close(c.pub);
    zmq_ctx_term(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_subscriber");
    TCase *tc = tu_tcase(s, "subscriber", 60);
    tcase_add_test(tc, test_subscriber);
    tcase_add_test(tc, test_curve_subscriber);
    return tu_run_suite(s);
}
