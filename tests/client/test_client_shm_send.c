/*
 * The C producer over shared memory against a fake daemon in a thread: it makes a pool as
 * infeedd does (a memfd of the test process, named by /proc/PID/fd/N), and checks every
 * BATCH_SHM: its seq, rows and slot, that none of its slots holds a step in flight, and that the
 * slots hold the batch's bytes. It ACKs and refuses at random. Also the fallbacks: a pool that
 * cannot be mapped (HELLO again without shm), a refused pool (auto: BATCH; on: the sentence), a
 * daemon that does not know the key, and off.
 */
#include <infeed/client.h>

#include "tests/util/fake_daemon.h"
#include "tests/util/fake_pool.h"
#include "core/wire.h"
#include "tests/util/testutil.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SC_SEND, SC_BAD_TOKEN, SC_REFUSED, SC_UNKNOWN_KEY, SC_OFF };

typedef struct shm_case {
    int scenario;
    int shm_mode;
    int predict;
    int n;
    size_t row_bytes[3];
    int64_t batch_size, credit, max_steps, messages;
    ifd_rng rng; /* the fake's */
    /* the fake's view */
    fake f; /* its socket and thread (tests/util/fake_daemon.c) */
    fake_pool pool;
    int64_t slot_step[1024]; /* per slot: the step in flight there, -1 none */
    int64_t slot_msg[1024];
    int64_t accepted, refused, batches; /* BATCH_SHM accepted, refused; plain BATCH */
} shm_case;

/* The byte at offset j of tensor i of message seq. */
static unsigned char pattern(int64_t seq, int i, size_t j)
{
    return fake_pattern(seq, i + 1, j);
}

/* One message: frame 0 into h (its size returned), frame 1 (JSON) into json; the frame count. */
static int shm_recv(shm_case *c, unsigned char *h, size_t *hlen, char *json, size_t jcap,
                    int timeout_ms)
{
    fmsg m;
    json[0] = '\0';
    if (!fake_recv(&c->f, &m, timeout_ms))
        return 0;
    if (m.n > 0) {
        *hlen = m.size[0] < 64 ? m.size[0] : 64;
        memcpy(h, m.data[0], *hlen);
    }
    if (m.n > 1) {
        size_t k = m.size[1] < jcap - 1 ? m.size[1] : jcap - 1;
        memcpy(json, m.data[1], k);
        json[k] = '\0';
    }
    int n = m.n;
    fmsg_free(&m);
    return n;
}

static void shm_welcome(shm_case *c, const char *shm, const char *refused)
{
    char json[2048], extra[600] = "";
    if (refused)
        snprintf(extra, sizeof extra, ", \"shm_refused\": \"%s\"", refused);
    snprintf(json, sizeof json,
             "{\"protocol\": 1, \"name\": \"p\", \"credit\": %" PRId64 ", \"next_seq\": 0, "
             "\"mode\": \"%s\", \"batch_size\": %" PRId64 ", \"max_steps_per_message\": %" PRId64
             ", \"replicas\": 1, \"shm\": %s%s}",
             c->credit, c->predict ? "predict" : "train", c->batch_size, c->max_steps,
             shm ? shm : "null", extra);
    fake_send(&c->f, IFD_MSG_WELCOME, NULL, 0, json);
}

static void pool_json(shm_case *c, char *out, size_t cap, int bad_token)
{
    const ifdp_shm_desc *d = &c->pool.desc;
    /* at most IFD_MAX_INPUTS numbers of at most 20 digits and their separators */
    char offs[IFD_MAX_INPUTS * 24] = "", steps[IFD_MAX_INPUTS * 24] = "";
    size_t no = 0, ns = 0;
    for (int i = 0; i < c->n && i < IFD_MAX_INPUTS; i++) {
        no += (size_t)snprintf(offs + no, sizeof offs - no, "%s%" PRIu64, i ? ", " : "",
                               d->offsets[i]);
        ns += (size_t)snprintf(steps + ns, sizeof steps - ns, "%s%" PRIu64, i ? ", " : "",
                               d->step_bytes[i]);
    }
    char tok[40];
    snprintf(tok, sizeof tok, "%s", c->pool.token_hex);
    if (bad_token)
        tok[0] = tok[0] == '0' ? '1' : '0';
    snprintf(out, cap,
             "{\"path\": \"%s\", \"size\": %" PRIu64 ", \"token\": \"%s\", \"slots\": %" PRId64
             ", \"offsets\": [%s], \"step_bytes\": [%s]}",
             d->path, d->size, tok, d->slots, offs, steps);
}

static void ack_upto(shm_case *c, int64_t seq, uint32_t count)
{
    unsigned char b[16] = {0};
    ifd_put_u64(b, (uint64_t)seq);
    ifd_put_u32(b + 8, count);
    fake_send(&c->f, IFD_MSG_ACK, b, 16, NULL);
}

/* ACKs every step in flight up to seq (cumulative), freeing their slots. */
static void shm_ack(shm_case *c, int64_t seq)
{
    uint32_t count = 0;
    for (int s = 0; s < c->pool.desc.slots; s++)
        if (c->slot_step[s] >= 0 && c->slot_step[s] <= seq) {
            c->slot_step[s] = -1;
            count++;
        }
    if (count)
        ack_upto(c, seq, count);
}

/* A BATCH_SHM: checked against the pool and the fake's slots in flight. */
static void on_batch_shm(shm_case *c, const unsigned char *h, size_t hl, int frames,
                         int64_t *next_seq)
{
    FCHECK(&c->f, hl == IFD_PROTO_BATCH_HDR && frames == 1,
           "BATCH_SHM: %zu header bytes, %d frames", hl, frames);
    ifd_proto_batch b;
    ifd_proto_parse_batch(h, &b);
    uint32_t slot = b.ntensors;
    int64_t bs = c->batch_size;
    FCHECK(&c->f, b.seq == *next_seq, "BATCH_SHM seq %" PRId64 ", expected %" PRId64, b.seq,
           *next_seq);
    FCHECK(&c->f, b.flags == 0, "flags %u", b.flags);
    int64_t k = c->predict ? 1 : b.rows / bs;
    FCHECK(&c->f,
           c->predict ? b.rows >= 1 && b.rows <= bs
                      : b.rows % bs == 0 && k >= 1 && k <= c->max_steps,
           "rows %" PRId64 " (batch_size %" PRId64 ")", b.rows, bs);
    FCHECK(&c->f, (int64_t)slot + k <= c->pool.desc.slots, "slot %u + %" PRId64 " > %" PRId64, slot,
           k, c->pool.desc.slots);
    for (int64_t j = 0; j < k; j++)
        FCHECK(&c->f, c->slot_step[slot + j] < 0,
               "slot %" PRId64 " holds step %" PRId64 " in flight", slot + j,
               c->slot_step[slot + j]);
    for (int i = 0; i < c->n; i++) {
        const unsigned char *at =
            c->pool.base + c->pool.desc.offsets[i] + (size_t)slot * c->pool.desc.step_bytes[i];
        size_t bytes = (size_t)b.rows * c->row_bytes[i];
        for (size_t j = 0; j < bytes; j++)
            FCHECK(&c->f, at[j] == pattern(b.seq, i, j),
                   "batch %" PRId64 " tensor %d byte %zu: 0x%02x, expected 0x%02x", b.seq, i, j,
                   at[j], pattern(b.seq, i, j));
    }
    *next_seq += k;
    if (rand_between(&c->rng, 0, 9) == 0) { /* refused: its k credits and slots come back */
        char json[256];
        snprintf(json, sizeof json,
                 "{\"code\": \"ERANGE\", \"seq\": %" PRId64 ", \"credit\": %" PRId64
                 ", \"message\": \"batch %" PRId64 ": refused by the fake\"}",
                 b.seq, k, b.seq);
        fake_send(&c->f, IFD_MSG_ERROR, NULL, 0, json);
        c->refused++;
        return;
    }
    for (int64_t j = 0; j < k; j++) {
        c->slot_step[slot + j] = b.seq + j;
        c->slot_msg[slot + j] = b.seq;
    }
    c->accepted++;
    if (rand_between(&c->rng, 0, 2) == 0) /* ACK up to a random step in flight */
        shm_ack(c, b.seq + rand_between(&c->rng, -3, k - 1));
}

static void shm_hello(shm_case *c, int want_shm)
{
    unsigned char h[64];
    size_t hl = 0;
    char json[4096];
    int n = shm_recv(c, h, &hl, json, sizeof json, 10000);
    FCHECK(&c->f, n == 2 && ifd_get_u16(h + 6) == IFD_MSG_HELLO, "expected HELLO, got %d frames",
           n);
    json_t *o = json_loads(json, 0, NULL);
    int has = json_is_true(json_object_get(o, "shm"));
    int present = json_object_get(o, "shm") != NULL;
    json_decref(o);
    FCHECK(&c->f, has == want_shm && (want_shm || !present), "HELLO shm: expected %s, got %.900s",
           want_shm ? "true" : "no key", json); /* the HELLO cut to fit the failure's sentence */
}

static void shm_script(fake *f)
{
    shm_case *c = f->arg;
    for (int s = 0; s < 1024; s++)
        c->slot_step[s] = -1;
    char shm[1024];
    switch (c->scenario) {
    case SC_SEND:
        shm_hello(c, 1);
        pool_json(c, shm, sizeof shm, 0);
        shm_welcome(c, shm, NULL);
        break;
    case SC_BAD_TOKEN:
        shm_hello(c, 1);
        pool_json(c, shm, sizeof shm, 1);
        shm_welcome(c, shm, NULL);
        shm_hello(c, 0); /* the producer gives the pool back */
        shm_welcome(c, NULL, NULL);
        break;
    case SC_REFUSED:
        shm_hello(c, 1);
        shm_welcome(c, NULL, "infeedd runs with --shm off");
        break;
    case SC_UNKNOWN_KEY:
        shm_hello(c, 1);
        fake_send(&c->f, IFD_MSG_ERROR, NULL, 0,
                  "{\"code\": \"EINVAL\", \"seq\": null, \"credit\": 0, \"message\": \"HELLO: "
                  "unknown key 'shm' (expected name, schema, first_seq, replica)\"}");
        shm_hello(c, 0);
        shm_welcome(c, NULL, NULL);
        break;
    case SC_OFF:
        shm_hello(c, 0);
        shm_welcome(c, NULL, NULL);
        break;
    }
    if (c->f.fail[0] || (c->scenario == SC_REFUSED && c->shm_mode == IFD_SHM_ON))
        return;
    int64_t next_seq = 0;
    int idle = 0;
    for (;;) {
        unsigned char h[64];
        size_t hl = 0;
        char json[256];
        int n = shm_recv(c, h, &hl, json, sizeof json, 20);
        if (n == 0) { /* the producer waits for credit (or slots): everything is consumed */
            FCHECK(&c->f, ++idle < 500, "nothing from the producer for 10 s");
            /* every step this fake has read, as infeedd acks: not beyond (a BATCH_SHM may be on
             * its way, and its slots are not free until it is read) */
            shm_ack(c, next_seq - 1);
            continue;
        }
        idle = 0;
        int type = ifd_get_u16(h + 6);
        if (type == IFD_MSG_BATCH_SHM) {
            FCHECK(&c->f, c->scenario == SC_SEND, "BATCH_SHM without a pool");
            on_batch_shm(c, h, hl, n, &next_seq);
            if (c->f.fail[0])
                return;
        } else if (type == IFD_MSG_BATCH) {
            ifd_proto_batch b;
            ifd_proto_parse_batch(h, &b);
            next_seq = b.seq + (c->predict ? 1 : b.rows / c->batch_size);
            c->batches++;
            ack_upto(c, next_seq - 1, (uint32_t)(c->predict ? 1 : b.rows / c->batch_size));
        } else if (type == IFD_MSG_END) {
            shm_ack(c, INT64_MAX - 1);
            fake_send(&c->f, IFD_MSG_BYE, NULL, 0,
                      "{\"status\": \"ok\", \"reason\": \"input_ended\"}");
            return;
        } else
            FCHECK(&c->f, 0, "unexpected message type %d", type);
    }
}

/* The producer: `messages` messages of random steps (predict: random rows), each by send, send_zc
 * or buffer/commit, with the pattern of its seq. A refused message is not sent again. */
static void produce(shm_case *c, ifd_producer *p, ifd_rng *rng)
{
    ifd_error err;
    int64_t bs = c->batch_size;
    unsigned char *bufs[3];
    for (int i = 0; i < c->n; i++)
        bufs[i] = malloc((size_t)(c->max_steps * bs) * c->row_bytes[i]);
    int64_t sent = 0, errors = 0;
    while (sent < c->messages) {
        int64_t rows =
            c->predict ? rand_between(rng, 1, bs) : bs * rand_between(rng, 1, c->max_steps);
        int64_t seq = ifd_producer_next_seq(p);
        int how = (int)rand_between(rng, 0, 2), rc;
        if (how == 2) {
            void *data[3];
            rc = ifd_producer_buffer(p, c->predict ? 1 : rows / bs, data, c->n, 10000, &err);
            if (rc == IFD_OK) {
                for (int i = 0; i < c->n; i++)
                    for (size_t j = 0; j < (size_t)rows * c->row_bytes[i]; j++)
                        ((unsigned char *)data[i])[j] = pattern(seq, i, j);
                /* an ERROR queued before the commit is returned first: commit again */
                while ((rc = ifd_producer_commit(p, rows, 10000, &err)) == IFD_ERANGE)
                    errors++;
                RASSERT(rc == IFD_OK, "commit: %s: %s", ifd_errname(rc), err.msg);
            }
        } else {
            ifd_frame fr[3];
            for (int i = 0; i < c->n; i++) {
                size_t bytes = (size_t)rows * c->row_bytes[i];
                for (size_t j = 0; j < bytes; j++)
                    bufs[i][j] = pattern(seq, i, j);
                fr[i] = (ifd_frame){bufs[i], bytes};
            }
            rc = how == 0 ? ifd_producer_send(p, rows, fr, c->n, 10000, &err)
                          : ifd_producer_send_zc(p, rows, fr, c->n, NULL, NULL, 10000, &err);
        }
        if (rc == IFD_ERANGE) { /* the fake's refusal of an earlier message */
            RASSERT(strstr(err.msg, "refused by the fake"), "%s", err.msg);
            errors++;
            continue;
        }
        RASSERT(rc == IFD_OK, "message %" PRId64 ": %s: %s", sent, ifd_errname(rc), err.msg);
        sent++;
    }
    int rc;
    while ((rc = ifd_producer_end(p, 20000, &err)) == IFD_ERANGE)
        errors++;
    RASSERT(rc == IFD_OK, "end: %s: %s", ifd_errname(rc), err.msg);
    RASSERT(errors == ifd_producer_rejected(p), "%" PRId64 " errors, %" PRId64 " rejected", errors,
            ifd_producer_rejected(p));
    for (int i = 0; i < c->n; i++)
        free(bufs[i]);
}

/* buffer/commit misuse is IFD_EINVAL naming what was expected, and changes nothing: a dropped
 * buffer (commit 0) gives its slots back (the messages after it need them). */
static void misuse(shm_case *c, ifd_producer *p)
{
    ifd_error err;
    void *data[4];
    int64_t most = c->max_steps, bs = c->batch_size;
    int rc = ifd_producer_buffer(p, 1, data, c->n + 1, 0, &err);
    RASSERT(rc == IFD_EINVAL && strstr(err.msg, "tensor pointers"), "n + 1: %s", err.msg);
    rc = ifd_producer_buffer(p, most + 1, data, c->n, 0, &err);
    RASSERT(rc == IFD_EINVAL && strstr(err.msg, "max_steps_per_message"), "steps: %s", err.msg);
    rc = ifd_producer_commit(p, bs, 0, &err);
    RASSERT(rc == IFD_EINVAL && strstr(err.msg, "no buffer"), "commit first: %s", err.msg);
    RC_OK(ifd_producer_buffer(p, most, data, c->n, 1000, &err), err);
    rc = ifd_producer_buffer(p, 1, data, c->n, 0, &err);
    RASSERT(rc == IFD_EINVAL && strstr(err.msg, "not committed"), "buffer twice: %s", err.msg);
    if (!c->predict && bs > 1) {
        rc = ifd_producer_commit(p, bs + 1, 0, &err);
        RASSERT(rc == IFD_EINVAL && strstr(err.msg, "multiple of batch_size"), "rows: %s", err.msg);
    }
    rc = ifd_producer_commit(p, most * bs + 1, 0, &err);
    RASSERT(rc == IFD_EINVAL && strstr(err.msg, "up to the buffer's"), "rows: %s", err.msg);
    RC_OK(ifd_producer_commit(p, 0, 0, &err), err);
    RASSERT(ifd_producer_sent(p) == 0 && ifd_producer_available(p) == c->credit,
            "a dropped buffer sent something");
}

static void run_case(shm_case *c, ifd_rng *rng)
{
    ifd_input_spec schema[3];
    c->n = (int)rand_between(rng, 1, 3);
    for (int i = 0; i < c->n; i++) {
        ifd_input_spec *s = &schema[i];
        memset(s, 0, sizeof *s);
        snprintf(s->name, sizeof s->name, "t%d", i);
        s->dtype = i == 1 ? IFD_I32 : i == 2 ? IFD_U8 : IFD_F32;
        s->rank = 1;
        s->dims[0] = rand_between(rng, 1, 300);
        c->row_bytes[i] = (size_t)s->dims[0] * (s->dtype == IFD_U8 ? 1 : 4);
    }
    c->batch_size = rand_between(rng, 1, 64);
    c->max_steps = c->predict ? 1 : rand_between(rng, 1, 4);
    c->credit = rand_between(rng, c->max_steps, 16); /* infeedd's credit is at least that */
    c->messages = rand_between(rng, 20, 200);
    ifd_rng_seed(&c->rng, ifd_rng_next(rng));
    fake_pool_make(&c->pool, rng, c->n, c->row_bytes, c->batch_size, c->credit + c->max_steps - 1);
    fake_start(&c->f, shm_script, c);

    ifd_producer *p;
    ifd_error err;
    ifd_client_options o = {.shm = c->shm_mode};
    RC_OK(ifd_producer_create_opts(&p, c->f.endpoint, "p", &o, &err), err);
    int rc = ifd_producer_hello(p, schema, c->n, 0, 10000, &err);
    const char *why = ifd_producer_shm_refused(p);
    if (c->scenario == SC_REFUSED && c->shm_mode == IFD_SHM_ON) {
        RASSERT(rc == IFD_ENOTSUP && strstr(err.msg, "shm on") &&
                    strstr(err.msg, "infeedd runs with --shm off"),
                "hello (on, refused): %s: '%s'", ifd_errname(rc), err.msg);
        ifd_frame none = {NULL, 0};
        RASSERT(ifd_producer_send(p, 0, &none, 1, 0, &err) == IFD_EINVAL,
                "a send after a failed hello");
    } else {
        RASSERT(rc == IFD_OK, "hello: %s: %s", ifd_errname(rc), err.msg);
        const char *want = c->scenario == SC_SEND ? "shm" : "tcp";
        RASSERT(strcmp(ifd_producer_transport(p), want) == 0, "transport %s, expected %s",
                ifd_producer_transport(p), want);
        const char *want_why = c->scenario == SC_BAD_TOKEN     ? "token"
                               : c->scenario == SC_REFUSED     ? "--shm off"
                               : c->scenario == SC_UNKNOWN_KEY ? "unknown key 'shm'"
                                                               : NULL;
        RASSERT(want_why ? why && strstr(why, want_why) : why == NULL,
                "shm_refused '%s', expected one naming '%s'", why ? why : "(null)",
                want_why ? want_why : "(null)");
        if (c->scenario == SC_SEND || c->scenario == SC_OFF)
            misuse(c, p);
        produce(c, p, rng);
    }
    fake_join(&c->f); /* fails the test with the fake's first failed check */
    ifd_producer_destroy(p);
    fake_pool_free(&c->pool);
    if (c->scenario == SC_SEND)
        RASSERT(c->batches == 0 && c->accepted > 0, "%" PRId64 " BATCH, %" PRId64 " BATCH_SHM",
                c->batches, c->accepted);
    else if (!(c->scenario == SC_REFUSED && c->shm_mode == IFD_SHM_ON))
        RASSERT(c->batches == c->messages, "%" PRId64 " BATCH of %" PRId64, c->batches,
                c->messages);
}

START_TEST(test_shm_send)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 6; round++) {
        shm_case c;
        memset(&c, 0, sizeof c);
        c.scenario = SC_SEND;
        c.shm_mode = round % 2 ? IFD_SHM_ON : IFD_SHM_AUTO;
        c.predict = _i;
        run_case(&c, &rng);
    }
}
END_TEST

START_TEST(test_shm_fallbacks)
{
    ifd_rng rng;
    seed_rng(&rng);
    static const int cases[][2] = {{SC_BAD_TOKEN, IFD_SHM_AUTO},
                                   {SC_REFUSED, IFD_SHM_AUTO},
                                   {SC_REFUSED, IFD_SHM_ON},
                                   {SC_UNKNOWN_KEY, IFD_SHM_AUTO},
                                   {SC_OFF, IFD_SHM_OFF}};
    shm_case c;
    memset(&c, 0, sizeof c);
    c.scenario = cases[_i][0];
    c.shm_mode = cases[_i][1];
    run_case(&c, &rng);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_shm_send");
    TCase *tc = tu_tcase(s, "fake daemon", 60);
    tcase_add_loop_test(tc, test_shm_send, 0, 2);
    tcase_add_loop_test(tc, test_shm_fallbacks, 0, 5);
    return tu_run_suite(s);
}
