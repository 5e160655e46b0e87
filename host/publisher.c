#include "host/publisher.h"
#include "host/conns.h"
#include "host/endpoint.h"
#include "host/security.h"
#include "host/tensor_pool.h"
#include "host/tensor_ring.h"

#include "core/log.h"
#include "core/thread.h"
#include "host/limits.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include <zmq.h>
#include <sys/eventfd.h>

/* A message waiting for the publisher thread: a summary (one frame, JSON, in buf) or a tensor
 * message (three frames: the topic and the JSON header in buf, the data in its own buffer, from
 * the publisher's pool, which libzmq takes without a copy and gives back). */
typedef struct outmsg {
    struct outmsg *next;
    int nframes;
    size_t len[3];
    size_t bytes;  /* of the frames together */
    int64_t steps; /* a tensor message: the steps it holds */
    char *data;    /* a tensor message: its data frame (len[2] bytes; the pool's, or NULL) */
    char buf[];
} outmsg;

/* A tensor some subscriber asked for, with its subscriptions counted: for data messages
 * ("tensor:NAME") and for notices of data in the ring ("tensor-shm:NAME"). */
typedef struct wanted_tensor {
    char name[IFD_PUB_TOPIC_MAX];
    int subs, shm_subs;
} wanted_tensor;

/* One outfeed tensor's steps gathered into its next message (the outfeed thread's, under
 * acc_mu): their global steps and rows, and their data one after another. */
typedef struct tensor_acc {
    char name[IFD_PUB_TOPIC_MAX]; /* "" for a name too long to be asked for */
    int want;                     /* some subscriber asks for it (as of acc_gen) */
    ifd_dtype dtype;
    int rank;
    int64_t dims[IFD_MAX_RANK]; /* dims[1..rank): a row's shape */
    int nsteps;
    int64_t steps[IFD_PUB_TENSOR_STEPS_MAX], rows[IFD_PUB_TENSOR_STEPS_MAX];
    char *data;            /* from the publisher's pool */
    size_t len, cap, hint; /* hint: the last message's bytes, the next buffer's size */
} tensor_acc;

struct ifd_publisher {
    void *pub;
    ifd_conns *conns; /* its connections and their subscriptions (this thread's) */
    int efd;
    ifd_sink *sink;
    ifd_thread thread;
    int started;
    ifd_mutex mu;
    outmsg *head, *tail; /* under mu */
    size_t len;          /* under mu */
    int64_t dropped;     /* under mu */
    int stopping;        /* under mu */
    /* Tensor messages (under mu): the tensors asked for, the bytes waiting in the outbox, the
     * token bucket of the byte rate, and the messages (and the steps they held) published and
     * not. */
    wanted_tensor wanted[IFD_PUB_TENSORS_MAX];
    int nwanted;       /* written under mu, atomically; read without it by the outfeed thread */
    unsigned want_gen; /* written under mu, atomically: changes with the names asked for */
    size_t tensor_bytes;
    double rate, tokens; /* bytes a second; bytes it may send now */
    int64_t refill_ns;
    int64_t tensor_sent, tensor_dropped, tensor_limited;
    int64_t steps_sent, steps_dropped, steps_limited;
    size_t largest; /* the largest tensor message so far */
    /* The steps being gathered (under acc_mu; lock order acc_mu, then mu): one accumulator a
     * tensor of the steps' layout (acc_names, naccs: the names array the steps came with, only
     * compared; each accumulator keeps a copy of its name), checked against the names asked for
     * at acc_gen. pending_bytes, pending_steps: their data and steps (atomic). */
    ifd_mutex acc_mu;
    tensor_acc *accs;
    int naccs;
    const char *const *acc_names;
    unsigned acc_gen;
    size_t pending_bytes, pending_steps;
    int unwoken;           /* atomic: tensor messages were queued without waking the thread */
    int64_t wakes;         /* atomic: the thread woken for what was queued */
    ifd_tensor_pool *pool; /* the data frames' buffers */
    /* The ring of the shared-memory subscribers' data (the outfeed thread's, under acc_mu), made
     * when first asked for; ring_bytes: its size (0: off), ring_failed: it could not be made.
     * Under mu: the notices sent, and the messages that went as data on a "tensor-shm:" topic
     * (no ring, or larger than it takes). */
    ifd_tensor_ring *ring;
    int64_t ring_bytes;
    int ring_failed;
    size_t ring_size;    /* under mu: the ring's file, once made */
    size_t ring_unwoken; /* under acc_mu: bytes written into it since the thread was woken */
    int64_t shm_notices, shm_data;
    ifd_tensor_sink tsink;
    char mode[16]; /* the run's, in the tensor messages' headers */
    char bound[IFD_ENDPOINT_MAX];
};

static void wake(ifd_publisher *p)
{
    __atomic_store_n(&p->unwoken, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->wakes, 1, __ATOMIC_RELAXED);
    uint64_t one = 1;
    ssize_t n = write(p->efd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the thread will wake */
}

static void outmsg_free(outmsg *m)
{
    if (m) {
        ifd_tensor_pool_put(m->data);
        free(m);
    }
}

static int is_tensor(const outmsg *m)
{
    return m->nframes > 1;
}

/* Takes the outbox's head (under mu). */
static outmsg *outbox_pop(ifd_publisher *p)
{
    outmsg *m = p->head;
    p->head = m->next;
    if (p->head == NULL)
        p->tail = NULL;
    p->len--;
    if (is_tensor(m))
        p->tensor_bytes -= m->bytes;
    return m;
}

/* Queues m (under mu); when the outbox is full the oldest message is not published. */
static void outbox_push(ifd_publisher *p, outmsg *m)
{
    if (p->len == IFD_OUTBOX_MAX) { /* the thread is behind */
        outmsg *old = outbox_pop(p);
        if (is_tensor(old)) {
            p->tensor_dropped++;
            p->steps_dropped += old->steps;
        } else {
            p->dropped++;
        }
        outmsg_free(old);
    }
    if (p->tail)
        p->tail->next = m;
    else
        p->head = m;
    p->tail = m;
    p->len++;
    if (is_tensor(m))
        p->tensor_bytes += m->bytes;
}

/* ---- tensor messages ------------------------------------------------------------------------ */

static wanted_tensor *find_wanted(ifd_publisher *p, const char *name)
{
    for (int i = 0; i < p->nwanted; i++)
        if (strcmp(p->wanted[i].name, name) == 0)
            return &p->wanted[i];
    return NULL;
}

int ifd_publisher_tensor_wanted(ifd_publisher *p, const char *name)
{
    ifd_mutex_lock(&p->mu);
    int yes = find_wanted(p, name) != NULL;
    ifd_mutex_unlock(&p->mu);
    return yes;
}

/* Whether the byte rate lets a message of n bytes go now (under mu): a token bucket of a
 * second's worth. */
static int rate_allows(ifd_publisher *p, size_t n)
{
    int64_t now = ifd_clock_ns();
    p->tokens += p->rate * (double)(now - p->refill_ns) / 1e9;
    if (p->tokens > p->rate)
        p->tokens = p->rate;
    p->refill_ns = now;
    if (p->tokens < (double)n)
        return 0;
    p->tokens -= (double)n;
    return 1;
}

/* The header is written by hand (hundreds of integers a message, on the outfeed thread; snprintf
 * took a microsecond a step for them). */
static char *put_str(char *at, const char *s)
{
    size_t n = strlen(s);
    memcpy(at, s, n);
    return at + n;
}

static char *put_i64(char *at, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    if (v < 0)
        *at++ = '-';
    while (n)
        *at++ = tmp[--n];
    return at;
}

static char *put_i64s(char *at, const int64_t *v, int n)
{
    *at++ = '[';
    for (int i = 0; i < n; i++) {
        if (i)
            *at++ = ',';
        at = put_i64(at, v[i]);
    }
    *at++ = ']';
    return at;
}

/* Where a notice's data lies in the ring (docs/summaries.md, "Tensor messages in shared
 * memory"). */
typedef struct ring_place {
    const ifd_tensor_ring *ring;
    uint64_t seq;
    size_t bytes;
} ring_place;

/* The most bytes a's header takes: its fixed text, the name, the mode and dtype (each under
 * 16), and up to 20 digits, a sign and a comma a number; with a notice's "shm" object. */
static size_t header_bound(const tensor_acc *a, const ring_place *at)
{
    return 160 + strlen(a->name) + 22 * (size_t)(a->rank + 2 * a->nsteps) +
           (at ? 160 + strlen(ifd_tensor_ring_path(at->ring)) : 0);
}

/* The tensor message's JSON header at at (names are plain: IFD_NAME_MAX characters of a
 * program's declaration, no quote or backslash, and the mode's and dtype's names); a notice's
 * says where its data lies (place). */
static char *tensor_header(char *at, const char *mode, const tensor_acc *a, const ring_place *place)
{
    at = put_str(at, "{\"event\":\"tensor\",\"mode\":\"");
    at = put_str(at, mode);
    at = put_str(at, "\",\"name\":\"");
    at = put_str(at, a->name);
    at = put_str(at, "\",\"dtype\":\"");
    at = put_str(at, ifd_dtype_name(a->dtype));
    at = put_str(at, "\",\"row_shape\":");
    at = put_i64s(at, a->dims + 1, a->rank > 0 ? a->rank - 1 : 0);
    at = put_str(at, ",\"global_steps\":");
    at = put_i64s(at, a->steps, a->nsteps);
    at = put_str(at, ",\"rows\":");
    at = put_i64s(at, a->rows, a->nsteps);
    if (place) {
        at = put_str(at, ",\"shm\":{\"path\":\"");
        at = put_str(at, ifd_tensor_ring_path(place->ring));
        at = put_str(at, "\",\"size\":");
        at = put_i64(at, (int64_t)ifd_tensor_ring_size(place->ring));
        at = put_str(at, ",\"token\":\"");
        at = put_str(at, ifd_tensor_ring_token(place->ring));
        at = put_str(at, "\",\"seq\":");
        at = put_i64(at, (int64_t)place->seq);
        at = put_str(at, ",\"bytes\":");
        at = put_i64(at, (int64_t)place->bytes);
        *at++ = '}';
    }
    *at++ = '}';
    return at;
}

/* A's steps as a message for the topic prefix: a data message of three frames (data: its frame,
 * taken, of a->len bytes) or a notice of two (place). NULL when out of memory. */
static outmsg *tensor_msg(ifd_publisher *p, const tensor_acc *a, const char *prefix, char *data,
                          const ring_place *place)
{
    outmsg *m = malloc(sizeof *m + strlen(prefix) + strlen(a->name) + header_bound(a, place));
    if (m == NULL)
        return NULL;
    char *at = put_str(put_str(m->buf, prefix), a->name);
    char *h = tensor_header(at, p->mode, a, place);
    *m = (outmsg){.nframes = place ? 2 : 3,
                  .len = {(size_t)(at - m->buf), (size_t)(h - at), place ? 0 : a->len},
                  .steps = a->nsteps,
                  .data = place ? NULL : data};
    m->bytes = m->len[0] + m->len[1] + m->len[2];
    return m;
}

/* Queues m (under acc_mu), or drops it, never waited for, when the publisher stops or the byte
 * rate or the outbox's bytes would be exceeded; *pushed is set when it was queued. */
static void enqueue_tensor(ifd_publisher *p, outmsg *m, int *pushed)
{
    size_t bytes = m->bytes;
    ifd_mutex_lock(&p->mu);
    int go = !p->stopping;
    if (go && (p->tensor_bytes + bytes > IFD_PUB_TENSOR_OUTBOX_BYTES || !rate_allows(p, bytes))) {
        p->tensor_limited++;
        p->steps_limited += m->steps;
        go = 0;
    }
    int grew = go && bytes > 2 * p->largest;
    if (go && bytes > p->largest)
        p->largest = bytes;
    if (go)
        outbox_push(p, m);
    int urgent = go && (p->tensor_bytes >= IFD_PUB_TENSOR_WAKE_BYTES ||
                        p->len >= IFD_PUB_TENSOR_WAKE_MESSAGES);
    ifd_mutex_unlock(&p->mu);
    if (grew) /* the bound, said again whenever the largest message doubles */
        IFD_LOG_INFO("publish: tensor messages hold at most %.1f MiB waiting in the outbox and "
                     "%.1f MiB a subscriber in ZeroMQ's queue (%d messages of up to %zu bytes), "
                     "and %zu KiB a tensor asked for (%d at most) while its steps are gathered "
                     "(or one step, when larger), and %.1f MiB of sent messages' buffers kept "
                     "for the next, and %.1f MiB of shared memory (tensor_shm_bytes) once a "
                     "subscriber asks for tensors there; docs/summaries.md, \"Tensor messages\"",
                     (double)IFD_PUB_TENSOR_OUTBOX_BYTES / 1048576.0,
                     (double)IFD_PUB_SNDHWM * (double)bytes / 1048576.0, IFD_PUB_SNDHWM, bytes,
                     IFD_PUB_TENSOR_MESSAGE_BYTES >> 10, IFD_PUB_TENSORS_MAX,
                     (double)IFD_PUB_TENSOR_POOL_BYTES / 1048576.0,
                     (double)(p->ring_bytes > 0 ? p->ring_bytes + IFD_TENSOR_RING_HEADER : 0) /
                         1048576.0);
    if (!go)
        outmsg_free(m);
    else if (*pushed < 1 + urgent)
        *pushed = 1 + urgent;
}

/* The ring, made when first asked for (under acc_mu); NULL when off or it cannot be made (said
 * once). */
static ifd_tensor_ring *ring_get(ifd_publisher *p)
{
    if (p->ring || p->ring_failed || p->ring_bytes <= 0)
        return p->ring;
    ifd_error e;
    ifd_error_clear(&e);
    if (ifd_tensor_ring_create(&p->ring, p->ring_bytes, &e) != IFD_OK) {
        p->ring_failed = 1;
        IFD_LOG_WARN("publish: %s; the subscribers that ask for tensors in shared memory "
                     "(\"tensor-shm:NAME\") get data messages instead",
                     ifd_error_text(&e));
        return NULL;
    }
    ifd_mutex_lock(&p->mu);
    p->ring_size = ifd_tensor_ring_size(p->ring);
    ifd_mutex_unlock(&p->mu);
    IFD_LOG_INFO("publish: tensor messages in shared memory: a ring of %.1f MiB at %s",
                 (double)p->ring_size / 1048576.0, ifd_tensor_ring_path(p->ring));
    return p->ring;
}

/* a's steps for the "tensor-shm:" subscribers (under acc_mu): the data written once into the
 * ring and a notice queued, or a data message of a copy when there is no ring or the message is
 * larger than it takes. */
static int flush_shm(ifd_publisher *p, tensor_acc *a, int *pushed, ifd_error *err)
{
    ifd_tensor_ring *ring = ring_get(p);
    ring_place place = {.ring = ring, .bytes = a->len};
    char *at = ring ? ifd_tensor_ring_claim(ring, a->len, &place.seq) : NULL, *copy = NULL;
    if (at) {
        memcpy(at, a->data, a->len);
    } else {
        size_t cap;
        if ((copy = ifd_tensor_pool_get(p->pool, a->len, &cap)) == NULL)
            return ifd_error_set(err, IFD_ENOMEM, "publish: tensor '%s'", a->name);
        memcpy(copy, a->data, a->len);
    }
    outmsg *m = tensor_msg(p, a, IFD_PUB_TENSOR_SHM_PREFIX, copy, at ? &place : NULL);
    if (m == NULL) {
        ifd_tensor_pool_put(copy);
        return ifd_error_set(err, IFD_ENOMEM, "publish: tensor '%s'", a->name);
    }
    enqueue_tensor(p, m, pushed);
    /* a loop that writes more than a quarter of the ring sends its notices now, not at its
     * end: else the ring would write over them before a reader heard of them */
    if (at && (p->ring_unwoken += a->len) >= ifd_tensor_ring_max_message(ring) && *pushed) {
        *pushed = 2;
        p->ring_unwoken = 0;
    }
    return IFD_OK;
}

/* a's steps as messages into the outbox (under acc_mu): a data message for the "tensor:"
 * subscribers, a notice (or data message) for the "tensor-shm:" ones, nothing when nobody asks
 * for the tensor now; *pushed is set when one was queued. a is empty after. */
static int flush_acc(ifd_publisher *p, tensor_acc *a, int *pushed, ifd_error *err)
{
    if (a->nsteps == 0)
        return IFD_OK;
    size_t dlen = a->len;
    int64_t nsteps = a->nsteps;
    ifd_mutex_lock(&p->mu);
    wanted_tensor *w = p->stopping ? NULL : find_wanted(p, a->name);
    int tcp = w && w->subs > 0, shm = w && w->shm_subs > 0;
    ifd_mutex_unlock(&p->mu);
    int rc = shm ? flush_shm(p, a, pushed, err) : IFD_OK;
    if (tcp) {
        outmsg *m = tensor_msg(p, a, IFD_PUB_TENSOR_PREFIX, a->data, NULL);
        if (m == NULL) {
            rc = ifd_error_set(err, IFD_ENOMEM, "publish: tensor '%s'", a->name);
        } else {
            a->data = NULL; /* the message's now */
            a->cap = 0;
            enqueue_tensor(p, m, pushed);
        }
    }
    a->hint = dlen;
    a->len = 0;
    a->nsteps = 0;
    __atomic_sub_fetch(&p->pending_bytes, dlen, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&p->pending_steps, (size_t)nsteps, __ATOMIC_RELAXED);
    return rc;
}

/* Every tensor's gathered steps into the outbox (under acc_mu), and the thread woken. */
static int flush_all(ifd_publisher *p, ifd_error *err)
{
    int pushed = 0, rc = IFD_OK;
    for (int i = 0; i < p->naccs; i++) {
        int r = flush_acc(p, &p->accs[i], &pushed, err);
        if (rc == IFD_OK)
            rc = r;
    }
    if (pushed || __atomic_load_n(&p->unwoken, __ATOMIC_RELAXED)) {
        wake(p);
        p->ring_unwoken = 0;
    }
    return rc;
}

/* The accumulators for the steps' tensors t (under acc_mu): what was gathered for another
 * layout goes out first. */
static int acc_layout(ifd_publisher *p, const ifd_step_tensors *t, ifd_error *err)
{
    int rc = flush_all(p, err);
    for (int i = 0; i < p->naccs; i++)
        ifd_tensor_pool_put(p->accs[i].data);
    free(p->accs);
    p->naccs = 0;
    p->acc_names = NULL;
    p->accs = calloc(t->ntensors > 0 ? (size_t)t->ntensors : 1, sizeof *p->accs);
    if (p->accs == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish: %d tensors", t->ntensors);
    for (int i = 0; i < t->ntensors; i++)
        if (strlen(t->names[i]) < sizeof p->accs[i].name)
            strcpy(p->accs[i].name, t->names[i]);
    p->naccs = t->ntensors;
    p->acc_names = t->names;
    p->acc_gen = __atomic_load_n(&p->want_gen, __ATOMIC_RELAXED) - 1; /* checked next */
    return rc;
}

/* Whether tensor t can join a's steps: its dtype and row shape. */
static int acc_fits(const tensor_acc *a, const ifd_tensor *t)
{
    if (a->dtype != t->dtype || a->rank != t->shape.rank)
        return 0;
    for (int d = 1; d < a->rank; d++)
        if (a->dims[d] != t->shape.dims[d])
            return 0;
    return 1;
}

/* One step's tensor into its accumulator (under acc_mu): what a holds goes out first when the
 * step would not fit in the same message (or does not follow its last step: steps nobody asked
 * for came between), and a goes out at once when it is full. */
static int acc_add(ifd_publisher *p, tensor_acc *a, int64_t step, const ifd_tensor *t, int *pushed,
                   ifd_error *err)
{
    size_t n = ifd_tensor_nbytes(t);
    int rc;
    if (a->nsteps > 0 &&
        (a->len + n > IFD_PUB_TENSOR_MESSAGE_BYTES || a->nsteps == IFD_PUB_TENSOR_STEPS_MAX ||
         step != a->steps[a->nsteps - 1] + 1 || !acc_fits(a, t)) &&
        (rc = flush_acc(p, a, pushed, err)) != IFD_OK)
        return rc;
    if (a->nsteps == 0) {
        a->dtype = t->dtype;
        a->rank = t->shape.rank;
        memcpy(a->dims, t->shape.dims, sizeof a->dims);
    }
    if (a->len + n > a->cap) { /* a buffer of at least the last message's size */
        size_t cap, need = a->len == 0 && a->hint > n ? a->hint : a->len + n;
        char *d = ifd_tensor_pool_get(p->pool, need, &cap);
        if (d == NULL)
            return ifd_error_set(err, IFD_ENOMEM, "publish: tensor '%s'", a->name);
        if (a->len)
            memcpy(d, a->data, a->len);
        ifd_tensor_pool_put(a->data);
        a->data = d;
        a->cap = cap;
    }
    if (n)
        memcpy(a->data + a->len, t->data, n);
    a->len += n;
    a->steps[a->nsteps] = step;
    a->rows[a->nsteps] = t->shape.rank > 0 ? t->shape.dims[0] : 1;
    a->nsteps++;
    __atomic_add_fetch(&p->pending_bytes, n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->pending_steps, 1, __ATOMIC_RELAXED);
    if (a->len >= IFD_PUB_TENSOR_MESSAGE_BYTES || a->nsteps == IFD_PUB_TENSOR_STEPS_MAX)
        return flush_acc(p, a, pushed, err);
    return IFD_OK;
}

/* The session's, before each loop: whether any subscriber asks for a tensor. */
static int tensor_wants(void *ctx)
{
    ifd_publisher *p = ctx;
    return __atomic_load_n(&p->nwanted, __ATOMIC_RELAXED) > 0;
}

/* The outfeed thread's tensor sink: the step's tensors that some subscriber asked for join their
 * next messages. */
static int tensor_write(void *ctx, const ifd_step_tensors *t, ifd_error *err)
{
    ifd_publisher *p = ctx;
    if (__atomic_load_n(&p->nwanted, __ATOMIC_RELAXED) == 0)
        return IFD_OK; /* the usual case, without a lock; what was gathered goes at the flush */
    int pushed = 0, rc = IFD_OK;
    ifd_mutex_lock(&p->acc_mu);
    if (t->names != p->acc_names || t->ntensors != p->naccs)
        rc = acc_layout(p, t, err);
    unsigned gen = __atomic_load_n(&p->want_gen, __ATOMIC_RELAXED);
    if (rc == IFD_OK && gen != p->acc_gen) { /* the names asked for changed */
        ifd_mutex_lock(&p->mu);
        for (int i = 0; i < p->naccs; i++)
            p->accs[i].want = p->accs[i].name[0] && find_wanted(p, p->accs[i].name) != NULL;
        ifd_mutex_unlock(&p->mu);
        p->acc_gen = gen;
    }
    for (int i = 0; i < t->ntensors && rc == IFD_OK; i++)
        if (p->accs[i].want)
            rc = acc_add(p, &p->accs[i], t->global_step, &t->tensors[i], &pushed, err);
    ifd_mutex_unlock(&p->acc_mu);
    if (pushed > 1)
        wake(p);
    else if (pushed) /* they wait for the loop's end (tensor_flush) */
        __atomic_store_n(&p->unwoken, 1, __ATOMIC_RELAXED);
    return rc;
}

/* The outfeed thread's, at the end of each loop and of the run's steps: the gathered steps go. */
static int tensor_flush(void *ctx, ifd_error *err)
{
    ifd_publisher *p = ctx;
    if (__atomic_load_n(&p->pending_steps, __ATOMIC_RELAXED) == 0 &&
        !__atomic_load_n(&p->unwoken, __ATOMIC_RELAXED))
        return IFD_OK;
    ifd_mutex_lock(&p->acc_mu);
    int rc = flush_all(p, err);
    ifd_mutex_unlock(&p->acc_mu);
    return rc;
}

static int pub_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    ifd_publisher *p = ctx;
    outmsg *m = malloc(sizeof *m + len + 1);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    *m = (outmsg){.nframes = 1, .len = {len}, .bytes = len};
    memcpy(m->buf, json, len);
    m->buf[len] = '\0';
    /* a step's tensors go before the summary that covers it: what was gathered goes first */
    ifd_mutex_lock(&p->acc_mu);
    int rc = flush_all(p, err);
    ifd_mutex_lock(&p->mu);
    outbox_push(p, m);
    ifd_mutex_unlock(&p->mu);
    ifd_mutex_unlock(&p->acc_mu);
    wake(p);
    return rc;
}

/* The tensor name topic (n bytes) asks for after prefix, into name; 0 when it asks for none. */
static int topic_tensor(const uint8_t *topic, size_t n, const char *prefix,
                        char name[IFD_PUB_TOPIC_MAX])
{
    size_t pn = strlen(prefix);
    if (n <= pn || n - pn >= IFD_PUB_TOPIC_MAX || memcmp(topic, prefix, pn) != 0 ||
        memchr(topic + pn, '\0', n - pn))
        return 0;
    memcpy(name, topic + pn, n - pn);
    name[n - pn] = '\0';
    return 1;
}

/* A subscription (on = 1) or its end (0) to topic: counted when it asks for a tensor, as data
 * messages ("tensor:NAME") or in shared memory ("tensor-shm:NAME"). */
static void count_subscription(ifd_publisher *p, const uint8_t *topic, size_t n, int on)
{
    char name[IFD_PUB_TOPIC_MAX];
    int shm = 0;
    if (!topic_tensor(topic, n, IFD_PUB_TENSOR_PREFIX, name) &&
        !(shm = topic_tensor(topic, n, IFD_PUB_TENSOR_SHM_PREFIX, name)))
        return;
    ifd_mutex_lock(&p->mu);
    wanted_tensor *w = find_wanted(p, name);
    if (on && w == NULL && p->nwanted < IFD_PUB_TENSORS_MAX) {
        w = &p->wanted[p->nwanted];
        __atomic_store_n(&p->nwanted, p->nwanted + 1, __ATOMIC_RELAXED);
        snprintf(w->name, sizeof w->name, "%s", name);
        w->subs = w->shm_subs = 0;
        __atomic_add_fetch(&p->want_gen, 1, __ATOMIC_RELAXED);
    }
    if (w && on && (shm ? w->shm_subs : w->subs) == 0)
        IFD_LOG_INFO("publish: a subscriber asked for tensor '%s'%s", name,
                     shm ? " in shared memory" : "");
    if (w)
        *(shm ? &w->shm_subs : &w->subs) += on ? 1 : -1;
    if (w && w->subs <= 0 && w->shm_subs <= 0) {
        *w = p->wanted[p->nwanted - 1];
        __atomic_store_n(&p->nwanted, p->nwanted - 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&p->want_gen, 1, __ATOMIC_RELAXED);
    }
    ifd_mutex_unlock(&p->mu);
}

static int pub_flush(void *ctx, ifd_error *err)
{
    (void)ctx;
    (void)err;
    return IFD_OK;
}

static void pub_destroy(void *ctx)
{
    (void)ctx;
}

static const ifd_sink_ops pub_ops = {
    .write = pub_write, .flush = pub_flush, .destroy = pub_destroy};

int ifd_publisher_create(ifd_publisher **out, void *zctx, const char *endpoint, ifd_security *sec,
                         ifd_monitor *mon, int max_connections, ifd_mode mode, int64_t tensor_rate,
                         ifd_error *err)
{
    *out = NULL;
    ifd_publisher *p = calloc(1, sizeof *p);
    if (p == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    ifd_mutex_init(&p->mu);
    ifd_mutex_init(&p->acc_mu);
    p->efd = -1;
    int rc;
    if ((p->pool = ifd_tensor_pool_create()) == NULL) {
        rc = ifd_error_set(err, IFD_ENOMEM, "publish");
        goto fail;
    }
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        rc = ifd_error_set(err, IFD_EIO, "publish: eventfd: %s", strerror(errno));
        goto fail;
    }
    p->pub = zmq_socket(zctx, ZMQ_XPUB);
    if (p->pub == NULL) {
        rc = ifd_error_set(err, IFD_EIO, "publish: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* XPUB, verbose: every subscription and unsubscription is read here, with its connection's
     * descriptor, so that each connection's are counted (IFD_PUB_SUBS_MAX) */
    int linger = 1000, sndhwm = IFD_PUB_SNDHWM, rcvhwm = IFD_PUB_RCVHWM, hs = IFD_HANDSHAKE_IVL_MS,
        verboser = 1, rcvbuf = IFD_PUB_RCVBUF;
    /* a subscriber sends little; a small kernel buffer bounds what it has sent and libzmq will
     * still read once its connection is closed for too many subscriptions */
    zmq_setsockopt(p->pub, ZMQ_RCVBUF, &rcvbuf, sizeof rcvbuf);
    zmq_setsockopt(p->pub, ZMQ_XPUB_VERBOSER, &verboser, sizeof verboser);
    int64_t maxmsg = IFD_PUB_MAXMSGSIZE; /* a subscription: 1 byte and the prefix */
    zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(p->pub, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
    zmq_setsockopt(p->pub, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
    zmq_setsockopt(p->pub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(p->pub, ZMQ_HANDSHAKE_IVL, &hs, sizeof hs);
    if ((rc = ifd_security_apply(sec, p->pub, IFD_SOCK_PUBLISH, err)) != IFD_OK)
        goto fail;
    /* a subscriber over the limit takes the place of a connection without a subscription */
    ifd_conns_rules rules = {.max = max_connections,
                             .idle_ns = IFD_HANDSHAKE_IVL_MS * 1000000LL,
                             .idle = "no subscription on it"};
    if ((rc = ifd_conns_create(&p->conns, mon, zctx, p->pub, "publish", &rules, err)))
        goto fail;
    if ((rc = ifd_endpoint_bind(p->pub, "publish", endpoint, 0, p->bound, sizeof p->bound, err)) !=
        IFD_OK)
        goto fail;
    p->rate = (double)(tensor_rate > 0 ? tensor_rate : IFD_PUB_TENSOR_RATE);
    p->ring_bytes = IFD_TENSOR_RING_BYTES;
    p->tokens = p->rate;
    p->refill_ns = ifd_clock_ns();
    p->tsink = (ifd_tensor_sink){
        .write = tensor_write, .ctx = p, .wants = tensor_wants, .flush = tensor_flush};
    snprintf(p->mode, sizeof p->mode, "%s", ifd_mode_name(mode));
    rc = ifd_sink_create(&p->sink, &pub_ops, p);
    if (rc) {
        ifd_error_set(err, rc, "publish: sink");
        goto fail;
    }
    *out = p;
    return IFD_OK;
fail:
    ifd_publisher_destroy(p);
    return rc;
}

void ifd_publisher_set_tensor_shm(ifd_publisher *p, int64_t bytes)
{
    p->ring_bytes = bytes;
}

const char *ifd_publisher_endpoint(const ifd_publisher *p)
{
    return p->bound;
}

ifd_sink *ifd_publisher_sink(ifd_publisher *p)
{
    return p ? p->sink : NULL;
}

const ifd_tensor_sink *ifd_publisher_tensor_sink(ifd_publisher *p)
{
    return p ? &p->tsink : NULL;
}

void ifd_publisher_tensor_stats(ifd_publisher *p, ifd_publisher_tensors *st)
{
    ifd_mutex_lock(&p->mu);
    st->subscribed = p->nwanted;
    st->sent = p->tensor_sent;
    st->dropped = p->tensor_dropped;
    st->limited = p->tensor_limited;
    st->sent_steps = p->steps_sent;
    st->dropped_steps = p->steps_dropped;
    st->limited_steps = p->steps_limited;
    st->pending_bytes = (int64_t)__atomic_load_n(&p->pending_bytes, __ATOMIC_RELAXED);
    st->outbox_bytes = (int64_t)p->tensor_bytes;
    st->largest = (int64_t)p->largest;
    st->rate = (int64_t)p->rate;
    st->wakes = __atomic_load_n(&p->wakes, __ATOMIC_RELAXED);
    st->shm_notices = p->shm_notices;
    st->shm_data = p->shm_data;
    st->shm_ring_bytes = (int64_t)p->ring_size;
    ifd_mutex_unlock(&p->mu);
    ifd_tensor_pool_stats ps;
    ifd_tensor_pool_get_stats(p->pool, &ps);
    st->buffers = ps.taken;
    st->buffers_reused = ps.reused;
    st->buffers_out = ps.out;
    st->buffers_kept = ps.kept;
}

/* Sends what the outbox holds; returns whether the thread was asked to stop. */
static int publish(ifd_publisher *p)
{
    ifd_mutex_lock(&p->mu);
    int stopping = p->stopping;
    for (;;) {
        outmsg *m = p->head ? outbox_pop(p) : NULL;
        ifd_mutex_unlock(&p->mu);
        if (m == NULL)
            return stopping;
        /* drops for a slow subscriber; the frames of a message go together or not at all */
        const char *at = m->buf;
        int tensor = is_tensor(m);
        for (int i = 0; i < m->nframes; i++) {
            int more = i + 1 < m->nframes ? ZMQ_SNDMORE : 0;
            if (i == 2 && m->data) { /* a tensor's data: libzmq gives it back once sent */
                zmq_msg_t d;
                if (zmq_msg_init_data(&d, m->data, m->len[2], ifd_tensor_pool_free, NULL) == 0) {
                    m->data = NULL;
                    if (zmq_msg_send(&d, p->pub, ZMQ_DONTWAIT) < 0)
                        zmq_msg_close(&d);
                    continue;
                }
            }
            zmq_send(p->pub, i == 2 ? m->data : at, m->len[i], ZMQ_DONTWAIT | more);
            at += m->len[i];
        }
        int64_t steps = m->steps;
        int notice = m->nframes == 2, shm_data = tensor && !notice &&
                                                 strncmp(m->buf, IFD_PUB_TENSOR_SHM_PREFIX,
                                                         sizeof IFD_PUB_TENSOR_SHM_PREFIX - 1) == 0;
        outmsg_free(m);
        ifd_mutex_lock(&p->mu);
        if (tensor) {
            p->tensor_sent++;
            p->steps_sent += steps;
            p->shm_notices += notice;
            p->shm_data += shm_data;
        }
    }
}

/* Reads what subscribers sent (libzmq has applied each subscription already): each
 * connection's subscriptions are counted, and one that goes beyond IFD_PUB_SUBS_MAX is closed,
 * which drops them all (a subscription of 1 KiB costs libzmq's trie about 48 KiB). Anything
 * else (an XSUB peer's messages) is dropped. */
static void read_subscriptions(ifd_publisher *p)
{
    for (int k = 0; k < 4096; k++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->pub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        const uint8_t *d = zmq_msg_data(&m);
        int fd = zmq_msg_get(&m, ZMQ_SRCFD);
        if (zmq_msg_size(&m) >= 1 && d[0] == 1) {
            /* counted even when its connection is closed for it: libzmq has applied it, and
             * the connection's end unsubscribes every topic it had */
            count_subscription(p, d + 1, zmq_msg_size(&m) - 1, 1);
            if (ifd_conns_marks(p->conns, fd) >= IFD_PUB_SUBS_MAX) {
                char why[128];
                snprintf(why, sizeof why,
                         "a subscriber made more than %d subscriptions (each costs the daemon "
                         "memory until it leaves)",
                         IFD_PUB_SUBS_MAX);
                ifd_conns_close(p->conns, fd, why);
            } else {
                ifd_conns_mark(p->conns, fd);
            }
        } else if (zmq_msg_size(&m) >= 1 && d[0] == 0) {
            ifd_conns_unmark(p->conns, fd, IFD_CONNS_NOW);
            count_subscription(p, d + 1, zmq_msg_size(&m) - 1, 0);
        }
        zmq_msg_close(&m);
    }
}

static void *publisher_main(void *arg)
{
    ifd_publisher *p = arg;
    /* Polling the socket makes libzmq process its commands: new subscribers and their
     * subscriptions are taken while no summary is sent. */
    zmq_pollitem_t items[3] = {{.fd = p->efd, .events = ZMQ_POLLIN},
                               {.socket = p->pub, .events = ZMQ_POLLIN},
                               {.socket = ifd_conns_pollable(p->conns), .events = ZMQ_POLLIN}};
    for (;;) {
        int rc = zmq_poll(items, 3, 100);
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN)) {
            uint64_t v;
            ssize_t r = read(p->efd, &v, sizeof v);
            (void)r;
        }
        ifd_conns_update(p->conns); /* before the subscriptions: their connections are known */
        read_subscriptions(p);
        if (publish(p))
            return NULL;
    }
}

int ifd_publisher_start(ifd_publisher *p, ifd_error *err)
{
    int rc = ifd_thread_start(&p->thread, "ifd-publish", publisher_main, p);
    if (rc)
        return ifd_error_set(err, rc, "publish: cannot start its thread");
    p->started = 1;
    return IFD_OK;
}

void ifd_publisher_stop(ifd_publisher *p)
{
    if (p == NULL || !p->started)
        return;
    ifd_error err;
    ifd_mutex_lock(&p->acc_mu); /* what was gathered goes out with the rest */
    if (flush_all(p, &err) != IFD_OK)
        IFD_LOG_WARN("publish: %s", err.msg);
    ifd_mutex_unlock(&p->acc_mu);
    ifd_mutex_lock(&p->mu);
    p->stopping = 1;
    ifd_mutex_unlock(&p->mu);
    wake(p);
    ifd_thread_join(&p->thread);
    p->started = 0;
    if (p->dropped)
        IFD_LOG_WARN("publish: %" PRId64 " summaries were not published (the outbox was full)",
                     p->dropped);
    if (p->tensor_dropped || p->tensor_limited)
        IFD_LOG_INFO("publish: %" PRId64 " tensor messages sent (%" PRId64
                     " tensor steps), %" PRId64 " not (%" PRId64 " tensor steps: %" PRId64
                     " messages over the byte rate or "
                     "the outbox's bytes, %" PRId64 " behind in the outbox)",
                     p->tensor_sent, p->steps_sent, p->tensor_dropped + p->tensor_limited,
                     p->steps_dropped + p->steps_limited, p->tensor_limited, p->tensor_dropped);
}

void ifd_publisher_destroy(ifd_publisher *p)
{
    if (p == NULL)
        return;
    ifd_publisher_stop(p);
    if (p->sink)
        ifd_sink_destroy(p->sink);
    while (p->head) {
        outmsg *m = p->head;
        p->head = m->next;
        outmsg_free(m);
    }
    for (int i = 0; i < p->naccs; i++)
        ifd_tensor_pool_put(p->accs[i].data);
    free(p->accs);
    ifd_tensor_ring_destroy(p->ring); /* a subscriber's mapping keeps its pages till unmapped */
    ifd_tensor_pool_destroy(p->pool); /* freed once libzmq gives back what it holds */
    ifd_conns_destroy(p->conns);      /* libzmq waits on a monitor event nobody reads */
    if (p->pub)
        zmq_close(p->pub);
    if (p->efd >= 0)
        close(p->efd);
    ifd_mutex_fini(&p->mu);
    ifd_mutex_fini(&p->acc_mu);
    free(p);
}
