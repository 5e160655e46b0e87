/*
 * The ingest's socket options (host/ingest/sockets.c): every zmq_setsockopt result is checked,
 * and a refused one is an error naming the socket, the option and the value. An unbound socket
 * is enough: nothing connects.
 */
#include "host/ingest/zmq_transport.h"
#include "tests/util/testutil.h"

#include <string.h>

START_TEST(options_are_set_and_a_refused_one_is_named)
{
    ifd_rng rng;
    seed_rng(&rng);
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    ck_assert_ptr_nonnull(sock);
    int hwm = (int)rand_between(&rng, 1, 100000);
    int64_t maxmsg = rand_between(&rng, 1, INT64_C(1) << 40);
    const sockopt good[] = {OPT(ZMQ_SNDHWM, hwm), OPT64(ZMQ_MAXMSGSIZE, maxmsg),
                            OPT(ZMQ_LINGER, rand_between(&rng, 0, 5000))};
    ifd_error err;
    RC_OK(ingest_socket_options(sock, "ingest", good, 3, &err), err);
    int got;
    size_t len = sizeof got;
    ck_assert_int_eq(zmq_getsockopt(sock, ZMQ_SNDHWM, &got, &len), 0);
    ck_assert_int_eq(got, hwm);
    int64_t got64;
    len = sizeof got64;
    ck_assert_int_eq(zmq_getsockopt(sock, ZMQ_MAXMSGSIZE, &got64, &len), 0);
    ck_assert_int_eq(got64, maxmsg);
    /* a negative high-water mark is refused: the error says which option of which socket */
    int64_t bad = -rand_between(&rng, 2, 1000);
    const sockopt opts[] = {OPT(ZMQ_RCVHWM, 4), OPT(ZMQ_SNDHWM, bad), OPT(ZMQ_LINGER, 0)};
    ck_assert_int_eq(ingest_socket_options(sock, "control", opts, 3, &err), IFD_EIO);
    char want[64];
    snprintf(want, sizeof want, "control: zmq_setsockopt(ZMQ_SNDHWM, %lld): ", (long long)bad);
    RASSERT(strstr(err.msg, want) == err.msg, "'%s' does not start with '%s'", err.msg, want);
    zmq_close(sock);
    zmq_ctx_term(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ingest_sockets");
    TCase *tc = tu_tcase(s, "options", 30);
    tcase_add_loop_test(tc, options_are_set_and_a_refused_one_is_named, 0, 10);
    return tu_run_suite(s);
}
