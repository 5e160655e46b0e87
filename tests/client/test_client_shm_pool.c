/*
 * The C producer's shared-memory pool (clients/c/shm.c): the slot allocator on random sequences
 * against a model, the pool's checks on fake pools (tests/util/fake_pool.c: memfds made as
 * infeedd makes them), and WELCOME's shm object through the reply decoder. The producer sending
 * through a pool is tests/client/test_client_shm_send.c.
 */
#include <infeed/client.h>

#include "clients/c/producer_impl.h"
#include "clients/c/shm.h"
#include "core/rng.h"
#include "core/wire.h"
#include "tests/util/fake_pool.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zmq.h>

/* ---- the slot allocator ------------------------------------------------------------------- */

/* A model of the pool: per slot the message's seq and the step's, msg -1 when free. */
typedef struct model {
    int n;
    int64_t msg[1024], step[1024];
} model;

static int model_has_run(const model *m, int k)
{
    for (int s = 0; s + k <= m->n; s++) {
        int j = 0;
        while (j < k && m->msg[s + j] < 0)
            j++;
        if (j == k)
            return 1;
    }
    return 0;
}

static int model_busy(const model *m)
{
    int busy = 0;
    for (int i = 0; i < m->n; i++)
        busy += m->msg[i] >= 0;
    return busy;
}

/* A producer's life with credit C and max_steps M in a pool of C + M - 1 slots: messages of
 * random k, cumulative ACKs (which may end inside a message), and (with_errors) refusals of
 * random messages. Checks that find only returns free runs, that it finds one whenever the model
 * has one, and (ACKs only, credit for k) that it always finds one, at the slot after the last
 * message or at 0 when fewer than k are left before the end. */
static void slots_life(ifd_rng *rng, int with_errors)
{
    int C = (int)rand_between(rng, 1, 64), M = (int)rand_between(rng, 1, 8);
    int n = C + M - 1;
    ifdp_slots s;
    ck_assert_int_eq(ifdp_slots_init(&s, n), IFD_OK);
    model m = {.n = n};
    for (int i = 0; i < n; i++)
        m.msg[i] = -1;
    int64_t next_seq = rand_between(rng, 0, 1000);
    int expect_at = 0, wrapped = 0, rejected = 0;
    for (int op = 0; op < 3000; op++) {
        int r = (int)rand_between(rng, 0, 9);
        int k = (int)rand_between(rng, 1, M);
        int busy = model_busy(&m);
        if (r < 5 && busy + k <= C) {
            int first = ifdp_slots_find(&s, k);
            if (!rejected) {
                int want = expect_at + k > n ? 0 : expect_at;
                wrapped += want != expect_at;
                RASSERT(first == want,
                        "C %d M %d: k %d with credit: found slot %d, expected %d (%d in flight)", C,
                        M, k, first, want, busy);
            }
            RASSERT((first >= 0) == model_has_run(&m, k), "find(%d) = %d but the model %s", k,
                    first, first >= 0 ? "has no free run" : "has one");
            if (first < 0)
                continue;
            for (int j = 0; j < k; j++) {
                RASSERT(m.msg[first + j] < 0, "find gave slot %d, which is taken", first + j);
                m.msg[first + j] = next_seq;
                m.step[first + j] = next_seq + j;
            }
            ifdp_slots_take(&s, first, k, next_seq);
            next_seq += k;
            expect_at = (first + k) % n;
        } else if (r < 8 && busy > 0) {
            /* ACK up to a step in flight: every step at or below it is consumed */
            int64_t lo = INT64_MAX, hi = -1;
            for (int i = 0; i < n; i++)
                if (m.msg[i] >= 0) {
                    lo = m.step[i] < lo ? m.step[i] : lo;
                    hi = m.step[i] > hi ? m.step[i] : hi;
                }
            int64_t seq = rand_between(rng, lo, hi);
            ifdp_slots_ack(&s, seq);
            for (int i = 0; i < n; i++)
                if (m.msg[i] >= 0 && m.step[i] <= seq)
                    m.msg[i] = -1;
        } else if (with_errors && busy > 0) {
            int i = (int)rand_between(rng, 0, n - 1);
            while (m.msg[i] < 0)
                i = (i + 1) % n;
            int64_t victim = m.msg[i];
            ifdp_slots_reject(&s, victim);
            for (int j = 0; j < n; j++)
                if (m.msg[j] == victim)
                    m.msg[j] = -1;
            rejected = 1;
        }
        RASSERT(ifdp_slots_busy(&s) == model_busy(&m), "busy %d, the model says %d",
                ifdp_slots_busy(&s), model_busy(&m));
    }
    RASSERT(with_errors || C < 2 || M < 2 || wrapped > 0, "no wrap to 0 in 3000 ops (C %d M %d)", C,
            M);
    ifdp_slots_fini(&s);
}

START_TEST(test_slots_in_order)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int i = 0; i < 30; i++)
        slots_life(&rng, 0);
}
END_TEST

START_TEST(test_slots_out_of_order)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int i = 0; i < 30; i++)
        slots_life(&rng, 1);
}
END_TEST

/* A message in slots 3-4 of 6, the next of 2 steps wraps to 0; a refused middle message's slots
 * are used again before the oldest is acknowledged. */
START_TEST(test_slots_wrap)
{
    ifdp_slots s;
    ck_assert_int_eq(ifdp_slots_init(&s, 6), IFD_OK);
    ck_assert_int_eq(ifdp_slots_find(&s, 3), 0);
    ifdp_slots_take(&s, 0, 3, 10); /* steps 10, 11, 12 in 0-2 */
    ck_assert_int_eq(ifdp_slots_find(&s, 2), 3);
    ifdp_slots_take(&s, 3, 2, 13);                /* 13, 14 in 3-4 */
    ck_assert_int_eq(ifdp_slots_find(&s, 2), -1); /* slot 5 alone, 0-2 in flight */
    ifdp_slots_ack(&s, 11);                       /* frees 0-1: 12 still in 2 */
    ck_assert_int_eq(ifdp_slots_find(&s, 2), 0);  /* wraps */
    ck_assert_int_eq(ifdp_slots_find(&s, 1), 5);
    ck_assert_int_eq(ifdp_slots_find(&s, 3), -1);
    ifdp_slots_reject(&s, 13); /* 3-4 free again, out of order */
    ck_assert_int_eq(ifdp_slots_find(&s, 3), 3);
    ifdp_slots_reserve(&s, 3, 3);
    ifdp_slots_ack(&s, 1000); /* a reservation is no step: ACKs leave it */
    ck_assert_int_eq(ifdp_slots_busy(&s), 3);
    ifdp_slots_unreserve(&s, 4, 2);
    ck_assert_int_eq(ifdp_slots_busy(&s), 1);
    ifdp_slots_fini(&s);
}
END_TEST

/* ---- fake pools (tests/util/fake_pool.c) --------------------------------------------------- */

/* Maps d and expects the code and every string of `want` in the sentence. */
static void expect_map(const ifdp_shm_desc *d, const size_t *rb, int n, int64_t bs, int code,
                       const char *want1, const char *want2)
{
    ifdp_pool pool;
    ifd_error err;
    ifd_error_clear(&err);
    int rc = ifdp_pool_map(&pool, d, rb, n, bs, &err);
    RASSERT(rc == code, "map: %s, expected %s: %s", ifd_errname(rc), ifd_errname(code), err.msg);
    RASSERT(want1 == NULL || strstr(err.msg, want1), "'%s' lacks '%s'", err.msg, want1);
    RASSERT(want2 == NULL || strstr(err.msg, want2), "'%s' lacks '%s'", err.msg, want2);
    if (rc == IFD_OK)
        ifdp_pool_unmap(&pool);
    else
        RASSERT(pool.base == NULL, "a failed map left a mapping");
}

START_TEST(test_pool_checks)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 20; round++) {
        int n = (int)rand_between(&rng, 1, 3);
        size_t rb[IFD_MAX_INPUTS];
        for (int i = 0; i < n; i++)
            rb[i] = (size_t)rand_between(&rng, 1, 40) * (i == 0 ? 4 : 1);
        int64_t bs = rand_between(&rng, 1, 100), slots = rand_between(&rng, 1, 20);
        fake_pool pf;
        fake_pool_make(&pf, &rng, n, rb, bs, slots);
        ifdp_shm_desc d = pf.desc;

        /* The right pool maps, and its slots are where WELCOME says. */
        ifdp_pool pool;
        ifd_error err;
        RC_OK(ifdp_pool_map(&pool, &d, rb, n, bs, &err), err);
        int i = (int)rand_between(&rng, 0, n - 1), s = (int)rand_between(&rng, 0, slots - 1);
        ifdp_pool_slot(&pool, i, s)[0] = 0xA5;
        RASSERT(pf.base[d.offsets[i] + (size_t)s * d.step_bytes[i]] == 0xA5, "slot %d/%d", i, s);
        RASSERT(pool.slots.n == slots, "slots");
        ifdp_pool_unmap(&pool);

        /* The file's size differs from WELCOME's. */
        d = pf.desc;
        d.size += (uint64_t)rand_between(&rng, 1, 4096);
        char want[64];
        snprintf(want, sizeof want, "expected a file of %llu bytes", (unsigned long long)d.size);
        expect_map(&d, rb, n, bs, IFD_EPROTO, "size", want);
        /* Another token. */
        d = pf.desc;
        d.token[rand_between(&rng, 0, IFD_SHM_TOKEN_LEN - 1)] ^= 1;
        expect_map(&d, rb, n, bs, IFD_EPROTO, "token", d.path);
        /* Another magic. */
        d = pf.desc;
        int b = (int)rand_between(&rng, 0, IFD_SHM_MAGIC_LEN - 1);
        pf.base[b] ^= 0x20;
        expect_map(&d, rb, n, bs, IFD_EPROTO, "magic", "IFDSHM1");
        pf.base[b] ^= 0x20;
        expect_map(&d, rb, n, bs, IFD_OK, NULL, NULL);
        /* A file that is not there. */
        snprintf(d.path, sizeof d.path, "/proc/%d/fd/%d", (int)getpid(), 100000 + round);
        expect_map(&d, rb, n, bs, IFD_ENOTFOUND, "cannot open", d.path);
        /* Layouts that do not fit the schema or the pool. */
        d = pf.desc;
        d.n = n + 1;
        expect_map(&d, rb, n, bs, IFD_EPROTO, "offsets and step_bytes", "entries");
        d = pf.desc;
        d.step_bytes[i] += 1;
        expect_map(&d, rb, n, bs, IFD_EPROTO, "step_bytes[", "batch_size");
        d = pf.desc;
        d.offsets[i] += 8;
        expect_map(&d, rb, n, bs, IFD_EPROTO, "offsets[", "multiple of 64");
        d = pf.desc;
        d.offsets[n - 1] += ((d.size - d.offsets[n - 1]) / 64 + 1) * 64;
        expect_map(&d, rb, n, bs, IFD_EPROTO, "region", "inside the pool");
        d = pf.desc;
        d.slots = 0;
        expect_map(&d, rb, n, bs, IFD_EPROTO, "slots", NULL);
        d = pf.desc;
        snprintf(d.why, sizeof d.why, "token: expected 32 hex digits, got 3 characters");
        expect_map(&d, rb, n, bs, IFD_EPROTO, "WELCOME: shm: token", NULL);
        fake_pool_free(&pf);
    }
}
END_TEST

/* WELCOME's shm object through the reply decoder: a malformed token or layout is kept as the
 * reason the pool cannot be used (ifdp_shm_desc.why), never a crash. Checked with the unconnected
 * producer of producer_internal.h. */
START_TEST(test_welcome_shm_parse)
{
    static const char *const bad[] = {
        "{\"path\": \"/x\", \"size\": 100, \"token\": \"abc\", \"slots\": 1, \"offsets\": [64], "
        "\"step_bytes\": [4]}",
        "{\"path\": \"/x\", \"size\": 100, \"token\": \"zz0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c\", "
        "\"slots\": 1, \"offsets\": [64], \"step_bytes\": [4]}",
        "{\"path\": \"/x\", \"size\": 100, \"token\": \"000c0c0c0c0c0c0c0c0c0c0c0c0c0c0c\", "
        "\"slots\": 1, \"offsets\": [64, 128], \"step_bytes\": [4]}",
        "{\"size\": 100}",
    };
    static const char *const why[] = {"token", "hex", "offsets and step_bytes", "path"};
    for (int i = 0; i < 4; i++) {
        ifd_producer *p;
        ifd_error err;
        RC_OK(ifdp_alloc(&p, "ipc:///nowhere", "t", &err), err);
        ifdp_expect_hello(p, 1);
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"protocol\": 1, \"credit\": 4, \"next_seq\": 0, \"batch_size\": 1, "
                 "\"mode\": \"train\", \"shm\": %s}",
                 bad[i]);
        unsigned char h[8];
        ifd_proto_header(h, IFD_MSG_WELCOME);
        ifd_frame fr[2] = {{h, 8}, {json, strlen(json)}};
        ifdp_on_reply(p, fr, 2);
        RC_OK(ifdp_hello_answer(p, &err), err);
        int rc = ifdp_shm_attach(p, &err);
        RASSERT(rc == IFD_EPROTO && strstr(err.msg, "WELCOME: shm: ") && strstr(err.msg, why[i]),
                "case %d: %s: '%s', expected EPROTO naming '%s'", i, ifd_errname(rc), err.msg,
                why[i]);
        ifd_producer_destroy(p);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_shm_pool");
    TCase *tc = tu_tcase(s, "pool", 60);
    tcase_add_test(tc, test_slots_in_order);
    tcase_add_test(tc, test_slots_out_of_order);
    tcase_add_test(tc, test_slots_wrap);
    tcase_add_test(tc, test_pool_checks);
    tcase_add_test(tc, test_welcome_shm_parse);
    return tu_run_suite(s);
}
