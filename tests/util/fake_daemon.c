#include "tests/util/fake_daemon.h"

#include "tests/util/testutil.h"

#include <check.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

void fmsg_free(fmsg *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->data[i]);
    m->n = 0;
}

void fake_abort(fake *f)
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

int fake_recv(fake *f, fmsg *m, int timeout_ms)
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

void fake_put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint64_t fake_get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void fake_send(fake *f, int type, const unsigned char *fields, size_t nfields, const char *json)
{
    unsigned char h[64] = {'I', 'F', 'D', 'P', 1, 0, (unsigned char)type, 0};
    if (nfields)
        memcpy(h + 8, fields, nfields);
    zmq_send(f->router, f->id, f->id_len, ZMQ_SNDMORE);
    zmq_send(f->router, h, 8 + nfields, json ? ZMQ_SNDMORE : 0);
    if (json)
        zmq_send(f->router, json, strlen(json), 0);
}

void fake_welcome(fake *f, int64_t credit, int64_t next_seq, int64_t batch_size, int replicas)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"protocol\": 1, \"name\": \"p\", \"credit\": %" PRId64 ", \"next_seq\": %" PRId64
             ", \"mode\": \"train\", \"input_mode\": \"per-host\", \"batch_size\": %" PRId64
             ", \"replicas\": %d, \"program\": \"softmax\", \"schema\": [], \"future_key\": 7}",
             credit, next_seq, batch_size, replicas);
    fake_send(f, 2, NULL, 0, json);
}

void fake_ack_n(fake *f, int64_t seq, uint32_t n)
{
    unsigned char b[16] = {0};
    fake_put_le(b, (uint64_t)seq, 8);
    fake_put_le(b + 8, n, 4);
    fake_send(f, 5, b, 16, NULL);
}

void fake_ack(fake *f, int64_t seq)
{
    fake_ack_n(f, seq, 1);
}

void fake_credit(fake *f, uint32_t credit)
{
    unsigned char b[8] = {0};
    fake_put_le(b, credit, 4);
    fake_send(f, 4, b, 8, NULL);
}

void fake_error(fake *f, const char *code, int64_t seq, int credit, const char *msg)
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

void fake_bye(fake *f, const char *status, const char *reason, int64_t acked_seq)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"status\": \"%s\", \"reason\": \"%s\", \"global_step\": 10, \"acked_seq\": "
             "%" PRId64 ", \"message\": \"run over\"}",
             status, reason, acked_seq);
    fake_send(f, 9, NULL, 0, json);
}

static const unsigned char HDR_PREFIX[6] = {'I', 'F', 'D', 'P', 1, 0};

int hdr_type(const fmsg *m)
{
    if (m->n < 1 || m->size[0] < 8 || memcmp(m->data[0], HDR_PREFIX, 6) != 0)
        return -1;
    return (int)fake_get_le(m->data[0] + 6, 2);
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    f->script(f);
    return NULL;
}

void fake_start(fake *f, fake_script script, void *arg)
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

void fake_join(fake *f)
{
    pthread_join(f->thread, NULL);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    RASSERT(f->fail[0] == '\0', "%s", f->fail);
}

unsigned char fake_pattern(int64_t seq, int i, size_t j)
{
    uint64_t z = (uint64_t)seq * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull ^
                 (uint64_t)j * 0x94D049BB133111EBull;
    return (unsigned char)(z >> 56 ^ z >> 17);
}

void fake_fill_pattern(unsigned char *buf, size_t n, int64_t seq, int i)
{
    for (size_t j = 0; j < n; j++)
        buf[j] = fake_pattern(seq, i, j);
}

const char *fake_check_batch(const fmsg *m, int64_t seq, int64_t rows, int n, const size_t *sizes)
{
    static char why[256];
    unsigned char want[32] = {'I', 'F', 'D', 'P', 1, 0, 3, 0};
    fake_put_le(want + 8, (uint64_t)seq, 8);
    fake_put_le(want + 16, (uint64_t)rows, 8);
    fake_put_le(want + 24, 0, 4);
    fake_put_le(want + 28, (uint64_t)n, 4);
    if (m->n != 1 + n) {
        snprintf(why, sizeof why, "batch %" PRId64 ": %d frames, expected %d", seq, m->n, 1 + n);
        return why;
    }
    if (m->size[0] != 32 || memcmp(m->data[0], want, 32) != 0) {
        snprintf(why, sizeof why,
                 "batch %" PRId64 ": header of %zu bytes differs (seq %" PRId64 " rows %" PRId64
                 " flags %u n %u)",
                 seq, m->size[0], m->size[0] >= 32 ? (int64_t)fake_get_le(m->data[0] + 8, 8) : -1,
                 m->size[0] >= 32 ? (int64_t)fake_get_le(m->data[0] + 16, 8) : -1,
                 m->size[0] >= 32 ? (unsigned)fake_get_le(m->data[0] + 24, 4) : 0,
                 m->size[0] >= 32 ? (unsigned)fake_get_le(m->data[0] + 28, 4) : 0);
        return why;
    }
    for (int i = 0; i < n; i++) {
        if (m->size[1 + i] != sizes[i]) {
            snprintf(why, sizeof why, "batch %" PRId64 " tensor %d: %zu bytes, expected %zu", seq,
                     i, m->size[1 + i], sizes[i]);
            return why;
        }
        for (size_t j = 0; j < sizes[i]; j++)
            if (m->data[1 + i][j] != fake_pattern(seq, i, j)) {
                snprintf(why, sizeof why, "batch %" PRId64 " tensor %d: byte %zu differs", seq, i,
                         j);
                return why;
            }
    }
    return NULL;
}

const ifd_input_spec FAKE_ONE_U8[1] = {{"x", IFD_U8, 1, {4}}};
