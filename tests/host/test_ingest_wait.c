/*
 * The I/O thread's wait on its sockets' ZMQ_FD (host/ingest/zmq_wait.c): a socket the caller
 * marked, or that was never waited on, is reported when a message waits although its
 * edge-triggered ZMQ_FD was taken by another call; a socket read until EAGAIN wakes the wait on
 * its next message; a plain descriptor is reported when readable. The peers run in their own
 * thread, in ping-pong, so that a wake-up the wait missed is a stall: each wait has a limit of
 * WAIT_MS, far beyond any scheduling delay, and the test fails when one ends with nothing.
 */
#include "host/ingest/zmq_wait.h"
#include "tests/util/testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#define WAIT_MS 10000
#define MAX_PEERS 4

/* An endpoint of a random transport for a test's ROUTER or REP. */
static void random_endpoint(ifd_rng *rng, char *ep, size_t len)
{
    switch (rand_between(rng, 0, 2)) {
    case 0:
        snprintf(ep, len, "inproc://wait-%d-%llu", (int)getpid(),
                 (unsigned long long)ifd_rng_next(rng));
        break;
    case 1:
        snprintf(ep, len, "ipc:///tmp/ifd-test-wait-%d-%llu", (int)getpid(),
                 (unsigned long long)ifd_rng_next(rng));
        break;
    default:
        snprintf(ep, len, "tcp://127.0.0.1:*");
    }
}

static void *bound_socket(void *ctx, int type, ifd_rng *rng, char *ep, size_t len)
{
    void *s = zmq_socket(ctx, type);
    ck_assert_ptr_nonnull(s);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    random_endpoint(rng, ep, len);
    RASSERT(zmq_bind(s, ep) == 0, "bind %s: %s", ep, zmq_strerror(zmq_errno()));
    size_t n = len;
    ck_assert_int_eq(zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n), 0);
    return s;
}

static void *connected_socket(void *ctx, int type, const char *ep)
{
    void *s = zmq_socket(ctx, type);
    ck_assert_ptr_nonnull(s);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    RASSERT(zmq_connect(s, ep) == 0, "connect %s: %s", ep, zmq_strerror(zmq_errno()));
    return s;
}

static int fd_readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

/* Receives one whole message: its parts, or 0 on EAGAIN. Without waiting, or (wait) for up to
 * WAIT_MS for its first part. */
static int recv_message_within(void *s, int wait)
{
    int parts = 0, more = 1;
    int ms = WAIT_MS;
    if (wait)
        ck_assert_int_eq(zmq_setsockopt(s, ZMQ_RCVTIMEO, &ms, sizeof ms), 0);
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, parts == 0 && !wait ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&m);
            ck_assert_int_eq(zmq_errno(), EAGAIN);
            ck_assert_int_eq(parts, 0);
            return 0;
        }
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        parts++;
    }
    return parts;
}

static int recv_message(void *s)
{
    return recv_message_within(s, 0);
}

/*
 * Messages wait and the socket's edge is gone (zmq_poll read its ZMQ_EVENTS, which takes it, as
 * a send can): the wait reports the socket at once when it was never waited on (sockets start
 * marked) or when the caller marked it, whatever the socket type and transport.
 */
START_TEST(a_marked_socket_is_reported_although_its_edge_was_taken)
{
    ifd_rng rng;
    seed_rng(&rng);
    void *ctx = zmq_ctx_new();
    int rep = rand_between(&rng, 0, 1);
    char ep[256];
    void *s = bound_socket(ctx, rep ? ZMQ_REP : ZMQ_ROUTER, &rng, ep, sizeof ep);
    void *peer = connected_socket(ctx, rep ? ZMQ_REQ : ZMQ_DEALER, ep);
    int n = rep ? 1 : (int)rand_between(&rng, 1, 8);
    int fd;
    size_t len = sizeof fd;
    ck_assert_int_eq(zmq_getsockopt(s, ZMQ_FD, &fd, &len), 0);
    ingest_wait w = {0};
    ifd_error err;
    int first = rand_between(&rng, 0, 1); /* the first wait, or a later one after a touch */
    int i = -1;
    if (!first) {
        RC_OK(ingest_wait_add(&w, s, -1, "test", &i, &err), err);
        while (ingest_wait_poll(&w, 0) > 0) /* the mark is spent (and the connection's edges) */
            ck_assert_int_eq(recv_message(s), 0);
    }
    for (int k = 0; k < n; k++)
        ck_assert_int_eq(zmq_send(peer, "x", 1, 0), 1);
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    ck_assert_int_eq(zmq_poll(&it, 1, WAIT_MS), 1);
    while (fd_readable(fd)) /* a later command (the connection's) made another edge: take it */
        ck_assert_int_eq(zmq_poll(&it, 1, 0), 1);
    if (first)
        RC_OK(ingest_wait_add(&w, s, -1, "test", &i, &err), err);
    else
        ingest_wait_touch(&w, i);
    ck_assert_int_eq(ingest_wait_poll(&w, WAIT_MS), 1);
    ck_assert(w.ready[i]);
    /* The first message is there (the wait saw it); the peer's later ones may still be on their
     * way through the I/O threads on a loaded machine. */
    for (int k = 0; k < n; k++)
        RASSERT(recv_message_within(s, k > 0) == (rep ? 1 : 2), "message %d of %d", k, n);
    if (rep) /* a REP answers before it reads again */
        ck_assert_int_eq(zmq_send(s, "y", 1, 0), 1);
    ck_assert_int_eq(recv_message(s), 0);
    zmq_close(peer);
    zmq_close(s);
    zmq_ctx_term(ctx);
}
END_TEST

/* The peers' plan: in round r peer[r] sends burst[r] requests and waits for their answers
 * (ping-pong), after writing the eventfd when wake[r]; the main thread is the I/O loop. */
#define MAX_ROUNDS 400
typedef struct peers {
    void *ctx;
    char ep[256];
    int npeers, rounds, efd;
    int peer[MAX_ROUNDS], burst[MAX_ROUNDS], wake[MAX_ROUNDS];
} peers;

static void *peers_main(void *arg)
{
    peers *p = arg;
    void *s[MAX_PEERS];
    for (int k = 0; k < p->npeers; k++)
        s[k] = connected_socket(p->ctx, ZMQ_DEALER, p->ep);
    for (int r = 0; r < p->rounds; r++) {
        void *d = s[p->peer[r]];
        for (int b = 0; b < p->burst[r]; b++)
            ck_assert_int_eq(zmq_send(d, "ping", 4, 0), 4);
        if (p->wake[r]) {
            uint64_t one = 1;
            ck_assert_int_eq(write(p->efd, &one, sizeof one), (ssize_t)sizeof one);
        }
        for (int b = 0; b < p->burst[r]; b++) {
            char buf[8];
            ck_assert_int_eq(zmq_recv(d, buf, sizeof buf, 0), 4);
        }
    }
    for (int k = 0; k < p->npeers; k++)
        zmq_close(s[k]);
    return NULL;
}

/* Reads the ROUTER until EAGAIN, answering each request at once or, when `after`, once the
 * EAGAIN came (up to 16 held; then at once): how many were answered. */
static int answer_until_eagain(void *router, int after)
{
    zmq_msg_t id[16];
    int held = 0, answered = 0;
    for (;;) {
        zmq_msg_t m, body;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, router, ZMQ_DONTWAIT) < 0) {
            ck_assert_int_eq(zmq_errno(), EAGAIN);
            zmq_msg_close(&m);
            break;
        }
        zmq_msg_init(&body);
        ck_assert_int_eq(zmq_msg_recv(&body, router, 0), 4);
        zmq_msg_close(&body);
        if (after && held < 16) {
            zmq_msg_init(&id[held]);
            zmq_msg_move(&id[held++], &m);
        } else {
            ck_assert_int_ge(zmq_msg_send(&m, router, ZMQ_SNDMORE), 0);
            ck_assert_int_eq(zmq_send(router, "pong", 4, 0), 4);
            answered++;
        }
        zmq_msg_close(&m);
    }
    for (int h = 0; h < held; h++) {
        ck_assert_int_ge(zmq_msg_send(&id[h], router, ZMQ_SNDMORE), 0);
        ck_assert_int_eq(zmq_send(router, "pong", 4, 0), 4);
        zmq_msg_close(&id[h]);
        answered++;
    }
    return answered;
}

/*
 * The I/O loop's use: wait, read the ROUTER until EAGAIN and answer what arrived, either before
 * that EAGAIN (nothing more to do) or after it (then the socket is marked). Every request is
 * answered and every wait ends with something ready: a wake-up the wait missed would leave a
 * peer waiting for its answer and the wait for the next request, until WAIT_MS.
 */
START_TEST(a_socket_read_until_eagain_wakes_the_wait_on_its_next_message)
{
    ifd_rng rng;
    seed_rng(&rng);
    peers p = {.ctx = zmq_ctx_new()};
    void *router = bound_socket(p.ctx, ZMQ_ROUTER, &rng, p.ep, sizeof p.ep);
    p.npeers = (int)rand_between(&rng, 1, MAX_PEERS);
    p.rounds = (int)rand_between(&rng, 50, MAX_ROUNDS);
    int64_t total = 0, wakes = 0;
    for (int r = 0; r < p.rounds; r++) {
        p.peer[r] = (int)rand_between(&rng, 0, p.npeers - 1);
        p.burst[r] = (int)rand_between(&rng, 1, 3);
        p.wake[r] = rand_between(&rng, 0, 7) == 0;
        total += p.burst[r];
        wakes += p.wake[r];
    }
    p.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ck_assert_int_ge(p.efd, 0);
    ingest_wait w = {0};
    ifd_error err;
    int i_efd, i_router;
    RC_OK(ingest_wait_add(&w, NULL, p.efd, "wake-up", &i_efd, &err), err);
    RC_OK(ingest_wait_add(&w, router, -1, "ingest", &i_router, &err), err);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, peers_main, &p), 0);
    int64_t answered = 0, woken = 0;
    while (answered < total || woken < wakes) {
        int rc = ingest_wait_poll(&w, WAIT_MS);
        RASSERT(rc > 0, "a wait ended with nothing ready (%d) after %lld of %lld answers", rc,
                (long long)answered, (long long)total);
        if (w.ready[i_efd]) {
            uint64_t v;
            if (read(p.efd, &v, sizeof v) == (ssize_t)sizeof v)
                woken += (int64_t)v;
        }
        int after = (int)rand_between(&rng, 0, 1);
        int n = answer_until_eagain(router, after);
        answered += n;
        if (after && n > 0)
            ingest_wait_touch(&w, i_router); /* sent since its EAGAIN */
    }
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_int_eq(answered, total);
    ck_assert_int_eq(woken, wakes);
    zmq_close(router);
    zmq_ctx_term(p.ctx);
    close(p.efd);
}
END_TEST

START_TEST(bad_items_are_refused_with_a_sentence)
{
    ingest_wait w = {0};
    ifd_error err;
    int i;
    for (int k = 0; k < INGEST_WAIT_MAX; k++)
        RC_OK(ingest_wait_add(&w, NULL, 0, "stdin", &i, &err), err);
    ck_assert_int_eq(ingest_wait_add(&w, NULL, 0, "one more", &i, &err), IFD_EINVAL);
    RASSERT(strstr(err.msg, "one more: ") == err.msg, "%s", err.msg);
    /* not a socket (zeros: libzmq's tag check refuses it): ZMQ_FD cannot be read */
    static uint64_t not_a_socket[8192];
    ingest_wait w2 = {0};
    ck_assert_int_eq(ingest_wait_add(&w2, not_a_socket, -1, "ingest", &i, &err), IFD_EIO);
    RASSERT(strstr(err.msg, "ingest: zmq_getsockopt(ZMQ_FD): ") == err.msg, "%s", err.msg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ingest_wait");
    TCase *tc = tu_tcase(s, "wait", 120);
    tcase_add_loop_test(tc, a_marked_socket_is_reported_although_its_edge_was_taken, 0, 12);
    tcase_add_loop_test(tc, a_socket_read_until_eagain_wakes_the_wait_on_its_next_message, 0, 6);
    tcase_add_test(tc, bad_items_are_refused_with_a_sentence);
    return tu_run_suite(s);
}
