/*
 * bench_outfeed: what outfeed tensors cost (issue 21). The built-in softmax program (D = 16,
 * K = 10) trains at batch 256 on R = 2 cpu replicas, iterations_per_loop 100, six ways side by
 * side in one run, each repeat running every way once in turn:
 *
 *   plain     softmax as built in (its outfeed: class, confidence and label, 3 values a row),
 *             with infeedd's default host calls (class_accuracy, a confidence histogram);
 *   out16     the same and one more outfeed tensor, the row's 16 input floats (a program
 *             registered here that wraps softmax's functions and adds the copy), written,
 *             copied and concatenated every step;
 *   out16+sub out16 with a tensor sink that takes every tensor of every step (copies it out,
 *             as a subscriber's sink would before sending it);
 *   out16+pub out16 with infeedd's PUB socket as the tensor sink (host/publisher.c, a byte
 *             rate of 4 GiB/s) and two SUB sockets on loopback tcp asking for every tensor, in a
 *             ZeroMQ context of their own (their own I/O thread, "1/ZMQbg/IO/0", as a subscriber
 *             process has), read by a thread that checks every message as a subscriber
 *             splitting it into steps would (the header names the topic's tensor, its steps are
 *             consecutive, the data is their rows) and every value in it (x16 and label are the
 *             batch's, class a class, confidence a probability, count the replica's rows,
 *             learning_rate the configured one, the rest finite); the messages published and
 *             the ones read and checked are printed (a message holds several steps of a tensor,
 *             and ZeroMQ drops what a slow reader cannot take), with the time the checks took
 *             and the publisher's data buffers (taken, reused), and a message that fails the
 *             check ends the bench with status 1;
 *   out16+ipc out16+pub on an ipc endpoint (a unix socket), as a subscriber on the daemon's
 *             host would connect;
 *   out16+shm out16+pub with the subscribers asking for "tensor-shm:NAME": the data in the
 *             daemon's shared-memory ring (host/tensor_ring.h), notices on the socket; the reader
 *             checks every value in place in the ring, and counts as lost (not failed) a message
 *             the ring wrote over before or while it was checked.
 *
 * The batch source hands out one prebuilt batch, so no producer is measured. Prints steps/s
 * (median and fastest of the repeats), each way's ratio to plain, the targets of issue 21 (out16
 * at most 10 % slower, the others at most 20 %), the median CPU time of the whole process a step
 * (cpu_us/st: on a shared machine the CPU a step costs says more than its wall time), and the
 * BLAS kernel.
 *
 *   bench_outfeed [--steps N] [--repeat N]
 *                 [--ways plain,out16,out16+sub,out16+pub,out16+ipc,out16+shm]
 *                 [--tensor-shm-bytes N (out16+shm's ring, the daemon's default)]
 */
#include "bench/bench_util.h"
#include "host/limits.h"
#include "host/publisher.h"
#include "host/tensor_ring.h"
#include "core/thread.h"
#include "device/cpu/blas.h"
#include <infeed/infeed.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

enum { FEATURES = 16, CLASSES = 10, BATCH = 256, REPLICAS = 2, IPL = 100 };

/* ---- the program with 16 more floats a row ---- */

static const ifd_program_class *softmax_cls;

static int out16_setup(ifd_program *p, ifd_error *err)
{
    int rc = softmax_cls->setup(p, err);
    if (rc)
        return rc;
    int64_t d = p->settings.features;
    if (ifd_program_add_outfeed(p, "x16", IFD_F32, 1, 1, &d) != IFD_OK)
        return ifd_error_set(err, IFD_EINVAL, "softmax_out16: cannot declare x16");
    return IFD_OK;
}

static int out16_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                      ifd_error *err)
{
    int rc = softmax_cls->train_step(p, ops, a, err);
    if (rc == IFD_OK && a->outfeeds)
        ops->copy(ops->ctx, a->outfeeds[p->noutfeeds - 1], a->inputs[0].data,
                  a->rows * p->settings.features * (int64_t)sizeof(float));
    return rc;
}

static ifd_program_class out16_cls;

static void register_out16(void)
{
    softmax_cls = ifd_program_find("softmax");
    out16_cls = *softmax_cls;
    out16_cls.name = "softmax_out16";
    out16_cls.description = "softmax with its 16 input floats a row outfed (bench_outfeed)";
    out16_cls.setup = out16_setup;
    out16_cls.train_step = out16_step;
    if (ifd_program_register(&out16_cls) != IFD_OK) {
        fprintf(stderr, "bench_outfeed: cannot register softmax_out16\n");
        exit(1);
    }
}

/* ---- one batch, handed out again and again ---- */

typedef struct static_source {
    ifd_batch batch;
    float x[BATCH * FEATURES];
    int32_t y[BATCH];
} static_source;

static void source_init(static_source *s)
{
    memset(s, 0, sizeof *s);
    ifd_batch_init(&s->batch);
    s->batch.rows = BATCH;
    s->batch.ntensors = 2;
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < BATCH; i++) {
        s->y[i] = i % CLASSES;
        for (int j = 0; j < FEATURES; j++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            s->x[i * FEATURES + j] = (float)(r % 1000) / 1000.0f + (j == s->y[i] ? 1.0f : 0.0f);
        }
    }
    int64_t xd[2] = {BATCH, FEATURES}, yd[1] = {BATCH};
    ifd_tensor_init(&s->batch.tensors[0], IFD_F32, 2, xd, s->x);
    ifd_tensor_init(&s->batch.tensors[1], IFD_I32, 1, yd, s->y);
    s->batch.refs = 1; /* owned here: never released */
}

static static_source src; /* the batch every step trains on (the subscribers check x16 by it) */

/* ---- a sink that takes every tensor ---- */

typedef struct taker {
    char *buf;
    size_t cap;
    int64_t bytes;
} taker;

static int take_all(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    taker *k = ctx;
    for (int i = 0; i < t->ntensors; i++) {
        size_t n = ifd_tensor_nbytes(&t->tensors[i]);
        if (n > k->cap) {
            char *b = realloc(k->buf, n);
            if (b == NULL)
                return ifd_error_set(err, IFD_ENOMEM, "bench_outfeed: sink");
            k->buf = b;
            k->cap = n;
        }
        memcpy(k->buf, t->tensors[i].data, n);
        k->bytes += (int64_t)n;
    }
    return IFD_OK;
}

/* ---- runs ---- */

enum { PLAIN, OUT16, OUT16_SUB, OUT16_PUB, OUT16_IPC, OUT16_SHM, NWAYS };
static const char *const way_names[NWAYS] = {"plain",     "out16",     "out16+sub",
                                             "out16+pub", "out16+ipc", "out16+shm"};

/* ---- the PUB socket and its subscribers ---- */

static const char *const all_tensors[] = {"class",      "confidence",   "label", "x16",
                                          "loss",       "correct",      "count", "grad_norm",
                                          "param_norm", "learning_rate"};
enum { NALL = sizeof all_tensors / sizeof all_tensors[0] };

typedef struct pub_run {
    void *zctx, *sctx, *subs[2]; /* the daemon's context; the subscribers' own */
    ifd_publisher *pub;
    ifd_thread reader;
    int stop;          /* atomic */
    int64_t got;       /* atomic: messages read and checked */
    int64_t got_steps; /* the tensor steps they held */
    int64_t bad;       /* messages that failed the check */
    int64_t check_ns;  /* the time the checks took (the reader's clock around them) */
    int64_t lost;      /* out16+shm: notices whose data the ring wrote over first */
    const char *prefix;
    ifd_tensor_ring_reader ring;
    char why[160]; /* the first one's fault */
} pub_run;

/* The keys of a tensor message's header the reader uses (docs/summaries.md, "Tensor messages";
 * a notice's "shm" object too), and where each one's value starts. */
enum {
    K_NAME,
    K_DTYPE,
    K_ROW_SHAPE,
    K_STEPS,
    K_ROWS,
    K_PATH,
    K_SIZE,
    K_TOKEN,
    K_SEQ,
    K_BYTES,
    NKEYS
};
static const char *const key_names[NKEYS] = {"name", "dtype", "row_shape", "global_steps", "rows",
                                             "path", "size",  "token",     "seq",          "bytes"};

/* Where each key's value starts in the header h (n bytes), NULL for a key it lacks: one pass from
 * quote to quote (memchr), a quoted text followed by ':' being a key. A scan, not a JSON parser:
 * the header is the daemon's own, one line of plain keys and strings without quotes or
 * backslashes in them (docs/summaries.md), and a subscriber in C needs no more. */
static void scan_keys(const char *h, size_t n, const char *val[NKEYS])
{
    static size_t key_len[NKEYS];
    if (key_len[0] == 0)
        for (int i = 0; i < NKEYS; i++)
            key_len[i] = strlen(key_names[i]);
    memset(val, 0, sizeof(const char *) * NKEYS);
    const char *at = h, *end = h + n, *q;
    while ((at = memchr(at, '"', (size_t)(end - at))) != NULL &&
           (q = memchr(at + 1, '"', (size_t)(end - at - 1))) != NULL) {
        size_t kl = (size_t)(q - at - 1);
        if (q + 1 < end && q[1] == ':')
            for (int i = 0; i < NKEYS; i++)
                if (kl == key_len[i] && memcmp(at + 1, key_names[i], kl) == 0) {
                    if (val[i] == NULL)
                        val[i] = q + 2;
                    break;
                }
        at = q + 1;
    }
}

/* The integer at at (before end): its end, or NULL when none is there. */
static const char *read_i64(const char *at, const char *end, int64_t *v)
{
    int neg = at < end && *at == '-';
    const char *d = at + neg;
    uint64_t u = 0;
    for (at = d; at < end && *at >= '0' && *at <= '9' && at - d < 19; at++)
        u = u * 10 + (uint64_t)(*at - '0');
    if (at == d)
        return NULL;
    *v = neg ? -(int64_t)u : (int64_t)u;
    return at;
}

/* The integers of the array at at (a value scan_keys found, before end) into v (at most max):
 * their count, or -1. */
static int int_array(const char *at, const char *end, int64_t *v, int max)
{
    if (at == NULL || at >= end || *at++ != '[')
        return -1;
    int k = 0;
    while (at < end && *at != ']') {
        if (k == max || (at = read_i64(at, end, &v[k++])) == NULL || at >= end ||
            (*at != ',' && *at != ']'))
            return -1;
        at += *at == ',';
    }
    return at < end ? k : -1;
}

/* The string at at (a value scan_keys found, before end): its text and *len, or NULL. */
static const char *str_value(const char *at, const char *end, size_t *len)
{
    if (at == NULL || at >= end || *at != '"')
        return NULL;
    const char *q = memchr(at + 1, '"', (size_t)(end - at - 1));
    if (q == NULL)
        return NULL;
    *len = (size_t)(q - at - 1);
    return at + 1;
}

/* The integer at at (a value scan_keys found, before end), or -1. */
static int64_t int_value(const char *at, const char *end)
{
    int64_t v;
    return at && read_i64(at, end, &v) ? v : -1;
}

/* The tensors the reader checks, each by its own rule (check_values). */
enum { T_X16, T_LABEL, T_CLASS, T_CONFIDENCE, T_COUNT, T_CORRECT, T_LEARNING_RATE, T_FINITE };

static int tensor_kind(const char *name, size_t nl)
{
    static const char *const names[] = {"x16",   "label",   "class",        "confidence",
                                        "count", "correct", "learning_rate"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (nl == strlen(names[i]) && memcmp(name, names[i], nl) == 0)
            return i;
    return T_FINITE; /* loss, grad_norm, param_norm */
}

/* Whether value i of the floats f or ints k (the same data) is right for a tensor of kind. */
static inline int value_ok(int kind, const float *f, const int32_t *k, int64_t i)
{
    switch (kind) {
    case T_CLASS:
        return k[i] >= 0 && k[i] < CLASSES;
    case T_CONFIDENCE:
        return f[i] >= 0.0f && f[i] <= 1.0f;
    case T_COUNT:
        return f[i] == (float)(BATCH / REPLICAS);
    case T_CORRECT: /* a whole number of the replica's rows */
        return f[i] >= 0.0f && f[i] <= (float)(BATCH / REPLICAS) && f[i] == (float)(int)f[i];
    case T_LEARNING_RATE:
        return f[i] == 0.01f;
    default:
        return f[i] >= 0.0f && f[i] < 1e30f; /* finite (NaN fails) */
    }
}

/* The wrong values among the n at data for a tensor of kind (not x16 or label): counted over all
 * of them without a branch a value, so that the compiler vectorizes the loop. */
static int64_t count_wrong(int kind, const char *data, int64_t n)
{
    const float *f = (const float *)data;
    const int32_t *k = (const int32_t *)data;
    int64_t wrong = 0;
#define COUNT(kd)                                                                                  \
    case kd:                                                                                       \
        for (int64_t i = 0; i < n; i++)                                                            \
            wrong += !value_ok(kd, f, k, i);                                                       \
        break;
    switch (kind) {
        COUNT(T_CLASS)
        COUNT(T_CONFIDENCE)
        COUNT(T_COUNT)
        COUNT(T_CORRECT)
        COUNT(T_LEARNING_RATE)
        COUNT(T_FINITE)
    }
#undef COUNT
    return wrong;
}

/* Every value of a message's steps of tensor name (data: ns steps of rows[i] x row floats or
 * ints), against what the bench's batch and settings make them (a subscriber's host call reads
 * them all too): x16 and label each step's BATCH rows equal to the batch's, the others each
 * value by value_ok. 0, or -1 with why (the first wrong value's step and index). */
static int check_values(const char *name, size_t nl, const char *data, int ns, const int64_t *rows,
                        int64_t row, char *why, size_t whylen)
{
    int kind = tensor_kind(name, nl);
    int64_t n = 0, bad = -1, step = 0;
    if (kind == T_X16 || kind == T_LABEL) {
        const void *want = kind == T_X16 ? (const void *)src.x : (const void *)src.y;
        size_t bytes = kind == T_X16 ? sizeof src.x : sizeof src.y;
        for (int i = 0; i < ns && bad < 0; i++, data += bytes)
            if (rows[i] != BATCH || row != (kind == T_X16 ? FEATURES : 1) ||
                memcmp(data, want, bytes) != 0)
                bad = 0, step = i;
    } else {
        for (int i = 0; i < ns; i++)
            n += rows[i] * row;
        if (count_wrong(kind, data, n) > 0) { /* where: for the sentence */
            const float *f = (const float *)data;
            const int32_t *k = (const int32_t *)data;
            while (value_ok(kind, f, k, ++bad))
                ;
            for (; step < ns && rows[step] * row <= bad; step++) /* its index in its step */
                bad -= rows[step] * row;
        }
    }
    if (bad < 0)
        return 0;
    snprintf(why, whylen, "%.*s: value %lld of the message's step %lld (from 0) is wrong", (int)nl,
             name, (long long)bad, (long long)step);
    return -1;
}

/* A tensor message's header, as a subscriber that splits it into steps reads it. */
typedef struct tensor_header {
    const char *val[NKEYS], *end; /* scan_keys's, and the header's end */
    const char *name;
    size_t nl;
    int ns;
    int64_t steps[IFD_PUB_TENSOR_STEPS_MAX], rows[IFD_PUB_TENSOR_STEPS_MAX];
    int64_t row, total; /* a row's values; the steps' bytes */
} tensor_header;

/* The data of a notice (its header t, h its text, n bytes) in place in the ring (opened at the
 * first), and its position *seq; NULL with why when the notice does not say where, or the ring
 * cannot be opened. */
static const char *notice_data(pub_run *p, const tensor_header *t, const char *h, size_t n,
                               size_t *len, uint64_t *seq, char *why, size_t whylen)
{
    size_t pl = 0, tl = 0;
    const char *path = str_value(t->val[K_PATH], t->end, &pl),
               *token = str_value(t->val[K_TOKEN], t->end, &tl);
    int64_t size = int_value(t->val[K_SIZE], t->end), s = int_value(t->val[K_SEQ], t->end),
            bytes = int_value(t->val[K_BYTES], t->end);
    if (path == NULL || token == NULL || size < 0 || s < 0 || bytes < 0 || pl >= 64 || tl >= 64) {
        snprintf(why, whylen, "a notice that does not say where its data is: %.*s",
                 (int)(n < 160 ? n : 160), h);
        return NULL;
    }
    ifd_error err;
    if (p->ring.base == NULL) {
        char ps[64], ts[64];
        snprintf(ps, sizeof ps, "%.*s", (int)pl, path);
        snprintf(ts, sizeof ts, "%.*s", (int)tl, token);
        if (ifd_tensor_ring_open(&p->ring, ps, (size_t)size, ts, &err) != IFD_OK) {
            snprintf(why, whylen, "%s", ifd_error_text(&err));
            return NULL;
        }
    }
    const char *d = ifd_tensor_ring_at(&p->ring, (uint64_t)s, (size_t)bytes, &err);
    if (d == NULL)
        snprintf(why, whylen, "%s", ifd_error_text(&err));
    *len = (size_t)bytes;
    *seq = (uint64_t)s;
    return d;
}

/* Reads the header (frame 1) of a message on topic (frame 0, p->prefix and the name): it names
 * the topic's tensor, float32 or int32, its steps are consecutive; 0, or -1 with why. */
static int read_header(const pub_run *p, zmq_msg_t *f, tensor_header *t, char *why, size_t whylen)
{
    const char *topic = zmq_msg_data(&f[0]), *h = zmq_msg_data(&f[1]);
    size_t tn = zmq_msg_size(&f[0]), hn = zmq_msg_size(&f[1]), pn = strlen(p->prefix), dl = 0;
    int64_t shape[IFD_MAX_RANK];
    scan_keys(h, hn, t->val);
    t->end = h + hn;
    const char *dtype = str_value(t->val[K_DTYPE], t->end, &dl);
    t->name = str_value(t->val[K_NAME], t->end, &t->nl);
    t->ns = int_array(t->val[K_STEPS], t->end, t->steps, IFD_PUB_TENSOR_STEPS_MAX);
    int nr = int_array(t->val[K_ROWS], t->end, t->rows, IFD_PUB_TENSOR_STEPS_MAX);
    int rank = int_array(t->val[K_ROW_SHAPE], t->end, shape, IFD_MAX_RANK);
    if (t->name == NULL || dtype == NULL || t->ns < 1 || nr != t->ns || rank < 0 || tn <= pn ||
        strncmp(topic, p->prefix, pn) != 0 || t->nl != tn - pn ||
        memcmp(topic + pn, t->name, t->nl) ||
        !((dl == 7 && memcmp(dtype, "float32", 7) == 0) ||
          (dl == 5 && memcmp(dtype, "int32", 5) == 0))) {
        snprintf(why, whylen, "a header that does not name its topic's tensor: %.*s",
                 (int)(hn < 100 ? hn : 100), h);
        return -1;
    }
    t->row = 1;
    t->total = 0;
    for (int i = 0; i < rank; i++)
        t->row *= shape[i];
    for (int i = 0; i < t->ns; i++) {
        if (i && t->steps[i] != t->steps[i - 1] + 1) {
            snprintf(why, whylen, "%.*s: step %lld after %lld", (int)t->nl, t->name,
                     (long long)t->steps[i], (long long)t->steps[i - 1]);
            return -1;
        }
        t->total += t->rows[i] * t->row * 4;
    }
    return 0;
}

/* Checks a tensor message (f: its nf frames) as a subscriber that splits it into steps would
 * (docs/summaries.md, "Tensor messages"): its header (read_header), and the data (its frame, or
 * for a notice the ring's bytes, checked in place) is the steps' rows of row_shape floats or
 * ints. Returns its steps, 0 for a notice whose data the ring wrote over (lost), or -1 with
 * why. */
static int64_t check_tensor(pub_run *p, zmq_msg_t *f, int nf, char *why, size_t whylen)
{
    tensor_header t;
    if (read_header(p, f, &t, why, whylen))
        return -1;
    size_t len = nf == 3 ? zmq_msg_size(&f[2]) : 0;
    uint64_t seq = 0;
    const char *data = nf == 3 ? zmq_msg_data(&f[2])
                               : notice_data(p, &t, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &len,
                                             &seq, why, whylen);
    if (data == NULL)
        return -1;
    if ((size_t)t.total != len) {
        snprintf(why, whylen, "%.*s: %zu bytes of data for %lld", (int)t.nl, t.name, len,
                 (long long)t.total);
        return -1;
    }
    int ring = nf == 2;
    if (ring && !ifd_tensor_ring_intact(&p->ring, seq))
        return 0;
    if (check_values(t.name, t.nl, data, t.ns, t.rows, t.row, why, whylen))
        /* a value read while the ring wrote over it is a lost message, not a wrong one */
        return ring && !ifd_tensor_ring_intact(&p->ring, seq) ? 0 : -1;
    return ring && !ifd_tensor_ring_intact(&p->ring, seq) ? 0 : t.ns;
}

/* Takes every message sub holds now (a message's frames arrive together), checked. */
static void read_messages(pub_run *p, void *sub)
{
    for (;;) {
        zmq_msg_t f[4];
        int n = 0, more = 1;
        for (; more; n++) {
            zmq_msg_init(&f[n < 3 ? n : 3]);
            if (zmq_msg_recv(&f[n < 3 ? n : 3], sub, n ? 0 : ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&f[n < 3 ? n : 3]);
                if (n == 0)
                    return;
                break;
            }
            more = zmq_msg_more(&f[n < 3 ? n : 3]);
            if (n >= 3)
                zmq_msg_close(&f[3]);
        }
        int64_t t0 = ifd_clock_ns();
        int64_t st = n == 3 || n == 2 ? check_tensor(p, f, n, p->why, sizeof p->why) : -1;
        p->check_ns += ifd_clock_ns() - t0;
        if (st < 0 && n != 3 && n != 2)
            snprintf(p->why, sizeof p->why, "a message of %d frames", n);
        if (st < 0)
            p->bad++;
        else if (st == 0)
            p->lost++;
        else
            p->got_steps += st;
        __atomic_add_fetch(&p->got, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < (n < 3 ? n : 3); i++)
            zmq_msg_close(&f[i]);
    }
}

static void *read_all(void *arg)
{
    pub_run *p = arg;
    zmq_pollitem_t it[2] = {{.socket = p->subs[0], .events = ZMQ_POLLIN},
                            {.socket = p->subs[1], .events = ZMQ_POLLIN}};
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        if (zmq_poll(it, 2, 20) <= 0)
            continue;
        for (int k = 0; k < 2; k++)
            read_messages(p, p->subs[k]);
    }
    return NULL;
}

static int64_t g_shm_bytes = IFD_TENSOR_RING_BYTES; /* --tensor-shm-bytes */

static void pub_open(pub_run *p, int way)
{
    memset(p, 0, sizeof *p);
    p->prefix = way == OUT16_SHM ? IFD_PUB_TENSOR_SHM_PREFIX : IFD_PUB_TENSOR_PREFIX;
    ifd_error err;
    p->zctx = zmq_ctx_new();
    p->sctx = zmq_ctx_new();
    /* the subscribers' I/O thread is named "1/ZMQbg/IO/0", the daemon's "ZMQbg/IO/0" */
    zmq_ctx_set(p->sctx, ZMQ_THREAD_NAME_PREFIX, 1);
    char ipc[96];
    snprintf(ipc, sizeof ipc, "ipc:///tmp/bench_outfeed-%d", (int)getpid());
    int rc = ifd_publisher_create(&p->pub, p->zctx, way == OUT16_IPC ? ipc : "tcp://127.0.0.1:*",
                                  NULL, NULL, 16, IFD_MODE_TRAIN, INT64_C(4) << 30, &err);
    if (rc == IFD_OK)
        ifd_publisher_set_tensor_shm(p->pub, g_shm_bytes);
    if (rc || ifd_publisher_start(p->pub, &err)) {
        fprintf(stderr, "bench_outfeed: publisher: %s\n", ifd_error_text(&err));
        exit(1);
    }
    for (int k = 0; k < 2; k++) {
        p->subs[k] = zmq_socket(p->sctx, ZMQ_SUB);
        zmq_connect(p->subs[k], ifd_publisher_endpoint(p->pub));
        for (int i = k * NALL / 2; i < (k + 1) * NALL / 2; i++) {
            char topic[64];
            snprintf(topic, sizeof topic, "%s%s", p->prefix, all_tensors[i]);
            zmq_setsockopt(p->subs[k], ZMQ_SUBSCRIBE, topic, strlen(topic));
        }
    }
    for (int i = 0; i < NALL; i++) /* the subscriptions arrive: then the run may start */
        while (!ifd_publisher_tensor_wanted(p->pub, all_tensors[i]))
            ifd_sleep_ns(1000000);
    ifd_thread_start(&p->reader, "bench-sub", read_all, p);
}

/* Stops the publisher (what it gathered goes out), lets the reader take what was sent (until a
 * second passes without a message: ZeroMQ may have dropped some for a slow reader), then closes
 * it all. *st: the publisher's counts. */
static void pub_close(pub_run *p, ifd_publisher_tensors *st)
{
    ifd_publisher_stop(p->pub);
    ifd_publisher_tensor_stats(p->pub, st);
    int64_t seen = -1, idle_since = ifd_clock_ns();
    for (int64_t got; (got = __atomic_load_n(&p->got, __ATOMIC_ACQUIRE)) < st->sent;
         ifd_sleep_ns(1000000))
        if (got != seen)
            seen = got, idle_since = ifd_clock_ns();
        else if (ifd_clock_ns() - idle_since > 1000000000)
            break;
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    ifd_thread_join(&p->reader);
    for (int k = 0; k < 2; k++)
        zmq_close(p->subs[k]);
    ifd_tensor_ring_close(&p->ring);
    ifd_publisher_destroy(p->pub);
    zmq_ctx_term(p->sctx);
    zmq_ctx_term(p->zctx);
}

/* The PUB ways' last runs: messages and their steps, published and read, lost (out16+shm) */
typedef struct pub_stats {
    int64_t sent, steps, got, got_steps, lost, bad, buffers, reused, check_ns, notices;
    char why[160];
} pub_stats;
static pub_stats g_pub[NWAYS];

/* The process's CPU time (user and system, all threads) in seconds. */
static double cpu_seconds(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec * 1e-6;
}

/* Steps a second of one whole session; *cpu_us: the CPU time it took a step (every thread of
 * the process: replicas, their waits, the outfeed, publisher, I/O and subscriber threads). */
static double run_once(int way, int64_t steps, int64_t *sunk, double *cpu_us)
{
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = way == PLAIN ? "softmax" : "softmax_out16";
    cfg.settings.features = FEATURES;
    cfg.settings.classes = CLASSES;
    cfg.replicas = REPLICAS;
    cfg.batch_size = BATCH;
    cfg.iterations_per_loop = IPL;
    cfg.steps = steps;
    cfg.optimizer.learning_rate = 0.01f;
    cfg.summary_every = 0;
    /* infeedd's default host calls for a classifier: they take the outfeed, so every way
     * writes, copies and concatenates the program's tensors (x16 too) */
    cfg.host_calls[0] = (ifd_host_call){.tensor = "class", .spec = "class_accuracy"};
    cfg.host_calls[1] = (ifd_host_call){.tensor = "confidence", .spec = "histogram"};
    cfg.nhost_calls = 2;
    source_init(&src);
    ifd_session *s;
    ifd_error err;
    if (ifd_session_create(&s, &cfg, bench_repeat_source(&src.batch), &err)) {
        fprintf(stderr, "bench_outfeed: %s\n", ifd_error_text(&err));
        exit(1);
    }
    taker k = {0};
    ifd_tensor_sink sink = {.write = take_all, .ctx = &k};
    pub_run pr;
    int pub = way == OUT16_PUB || way == OUT16_IPC || way == OUT16_SHM;
    if (pub)
        pub_open(&pr, way);
    if ((way == OUT16_SUB && ifd_session_add_tensor_sink(s, &sink) != IFD_OK) ||
        (pub && ifd_session_add_tensor_sink(s, ifd_publisher_tensor_sink(pr.pub)))) {
        fprintf(stderr, "bench_outfeed: cannot add the tensor sink\n");
        exit(1);
    }
    double c0 = cpu_seconds();
    int64_t t0 = ifd_clock_ns();
    int rc = ifd_session_run(s, &err);
    int64_t t1 = ifd_clock_ns();
    *cpu_us = (cpu_seconds() - c0) * 1e6 / (double)steps;
    if (rc || ifd_session_global_step(s) != steps) {
        fprintf(stderr, "bench_outfeed: run failed: %s\n", ifd_error_text(&err));
        exit(1);
    }
    ifd_session_destroy(s);
    free(k.buf);
    *sunk = k.bytes;
    if (pub) {
        ifd_publisher_tensors st;
        pub_close(&pr, &st);
        pub_stats *g = &g_pub[way];
        g->sent = st.sent;
        g->steps = st.sent_steps;
        g->notices = st.shm_notices;
        g->buffers = st.buffers;
        g->reused = st.buffers_reused;
        g->got = pr.got;
        g->got_steps = pr.got_steps;
        g->lost = pr.lost;
        g->check_ns = pr.check_ns;
        g->bad += pr.bad;
        if (pr.bad && g->why[0] == '\0')
            snprintf(g->why, sizeof g->why, "%s", pr.why);
    }
    return (double)steps * 1e9 / (double)(t1 - t0);
}

/* The PUB ways' lines (on: the ways run); 1 when a message failed the check (said). */
static int print_pub_stats(const int on[NWAYS], int64_t steps)
{
    int bad = 0;
    for (int w = OUT16_PUB; w < NWAYS; w++) {
        const pub_stats *g = &g_pub[w];
        if (!on[w])
            continue;
        printf("%s: %lld tensor messages published in the last run (%.2f a step, %lld tensor "
               "steps: %d tensors a step; %lld of them notices of data in shared memory), %lld "
               "read by the subscribers, %lld of them lost (the ring wrote over them first) and "
               "the others checked (%lld tensor steps; checking them took %.2f us a step); %lld "
               "data buffers taken, %lld of them reused\n",
               way_names[w], (long long)g->sent, (double)g->sent / (double)steps,
               (long long)g->steps, NALL, (long long)g->notices, (long long)g->got,
               (long long)g->lost, (long long)g->got_steps,
               (double)g->check_ns / 1e3 / (double)steps, (long long)g->buffers,
               (long long)g->reused);
        if (g->bad) {
            fprintf(stderr,
                    "bench_outfeed: %s: %lld tensor messages failed the check, the first: %s\n",
                    way_names[w], (long long)g->bad, g->why);
            bad = 1;
        }
    }
    return bad;
}

/* Sets on[w] for each way named in the comma-separated list; 0 when a name is unknown. */
static int parse_ways(const char *list, int on[NWAYS])
{
    memset(on, 0, sizeof(int) * NWAYS);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < NWAYS && strcmp(w, way_names[k]) != 0)
            k++;
        if (k == NWAYS) {
            fprintf(stderr,
                    "bench_outfeed: --ways: no way '%s' (expected some of plain, out16, "
                    "out16+sub, out16+pub, out16+ipc, out16+shm)\n",
                    w);
            return 0;
        }
        on[k] = 1;
    }
    return 1;
}

int main(int argc, char **argv)
{
    int64_t steps = 20000;
    int repeat = 5;
    int on[NWAYS] = {1, 1, 1, 1, 1, 1};
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_outfeed: %s needs a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--steps") == 0)
            steps = strtoll(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--tensor-shm-bytes") == 0)
            g_shm_bytes = strtoll(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--ways") == 0) {
            if (!parse_ways(argv[i + 1], on))
                return 2;
        } else {
            fprintf(stderr, "bench_outfeed: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (steps < IPL || repeat < 1 || repeat > 64 || !on[PLAIN] ||
        g_shm_bytes < IFD_TENSOR_RING_MIN) {
        fprintf(stderr,
                "usage: bench_outfeed [--steps N >= %d] [--repeat 1..64] [--ways plain,...]\n"
                "  --ways: a comma-separated list of plain (always, the ratios' base), out16,\n"
                "          out16+sub, out16+pub, out16+ipc, out16+shm (default: all six)\n"
                "  --tensor-shm-bytes: out16+shm's ring (default %lld, the daemon's; >= %lld)\n",
                IPL, (long long)IFD_TENSOR_RING_BYTES, (long long)IFD_TENSOR_RING_MIN);
        return 2;
    }
    register_out16();
    double rate[NWAYS][64], cpu[NWAYS][64];
    int64_t sunk = 0;
    for (int k = 0; k < repeat; k++)
        for (int w = 0; w < NWAYS; w++) {
            if (!on[w])
                continue;
            int64_t b;
            rate[w][k] = run_once(w, steps, &b, &cpu[w][k]);
            if (w == OUT16_SUB)
                sunk = b;
        }
    ifd_blas_info info;
    ifd_blas_info_get(&info);
    char blas[256];
    printf("softmax D=%d K=%d, batch %d, R=%d, ipl %d, cpu backend, %lld steps x %d repeats\n",
           FEATURES, CLASSES, BATCH, REPLICAS, IPL, (long long)steps, repeat);
    printf("BLAS: %s\n", ifd_blas_describe(&info, blas, sizeof blas));
    if (on[OUT16_SUB])
        printf("out16+sub: the sink took %.1f MB a run (%.0f bytes a step)\n", (double)sunk / 1e6,
               (double)sunk / (double)steps);
    if (print_pub_stats(on, steps))
        return 1;
    printf("%-10s %12s %12s %10s %10s %8s %10s\n", "way", "steps/s", "best", "x plain", "slower",
           "target", "cpu_us/st");
    double med[NWAYS], best[NWAYS], cpu_med[NWAYS];
    for (int w = 0; w < NWAYS; w++) {
        if (!on[w])
            continue;
        med[w] = bench_median(rate[w], repeat);
        best[w] = rate[w][repeat - 1];
        cpu_med[w] = bench_median(cpu[w], repeat);
    }
    int met = 1;
    for (int w = 0; w < NWAYS; w++) {
        if (!on[w])
            continue;
        double slower = 1.0 - med[w] / med[PLAIN];
        double target = w == OUT16 ? 0.10 : 0.20;
        char t[16] = "-";
        if (w != PLAIN) {
            snprintf(t, sizeof t, "<=%.0f%%", target * 100);
            met &= slower <= target;
        }
        printf("%-10s %12.0f %12.0f %10.3f %9.1f%% %8s %10.2f\n", way_names[w], med[w], best[w],
               med[w] / med[PLAIN], slower * 100, t, cpu_med[w]);
    }
    printf("targets (issue 21, medians): %s\n", met ? "met" : "NOT met");
    return 0;
}
