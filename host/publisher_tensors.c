/* Tensor messages (docs/summaries.md, "Tensor messages"): the outfeed thread's tensor sink
 * gathers each asked-for tensor's steps into a message, under the byte rate and the outbox's
 * bytes, as data frames from the publisher's pool or, for "tensor-shm:" subscribers, as data
 * written once into the shared-memory ring and a notice. */
#include "host/publisher_internal.h"

#include "core/log.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        ifd_pub_outbox_push(p, m);
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
        ifd_pub_outmsg_free(m);
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
    /* a->data is NULL while every step so far had no rows (len 0) */
    if (at) {
        if (a->len)
            memcpy(at, a->data, a->len);
    } else {
        size_t cap;
        if ((copy = ifd_tensor_pool_get(p->pool, a->len, &cap)) == NULL)
            return ifd_error_set(err, IFD_ENOMEM, "publish: tensor '%s'", a->name);
        if (a->len)
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
int ifd_pub_flush_all(ifd_publisher *p, ifd_error *err)
{
    int pushed = 0, rc = IFD_OK;
    for (int i = 0; i < p->naccs; i++) {
        int r = flush_acc(p, &p->accs[i], &pushed, err);
        if (rc == IFD_OK)
            rc = r;
    }
    if (pushed || __atomic_load_n(&p->unwoken, __ATOMIC_RELAXED)) {
        ifd_pub_wake(p);
        p->ring_unwoken = 0;
    }
    return rc;
}

/* The accumulators for the steps' tensors t (under acc_mu): what was gathered for another
 * layout goes out first. */
static int acc_layout(ifd_publisher *p, const ifd_step_tensors *t, ifd_error *err)
{
    int rc = ifd_pub_flush_all(p, err);
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
        ifd_pub_wake(p);
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
    int rc = ifd_pub_flush_all(p, err);
    ifd_mutex_unlock(&p->acc_mu);
    return rc;
}

ifd_tensor_sink ifd_pub_tensor_sink(ifd_publisher *p)
{
    return (ifd_tensor_sink){
        .write = tensor_write, .ctx = p, .wants = tensor_wants, .flush = tensor_flush};
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
void ifd_pub_count_subscription(ifd_publisher *p, const uint8_t *topic, size_t n, int on)
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

void ifd_publisher_set_tensor_shm(ifd_publisher *p, int64_t bytes)
{
    p->ring_bytes = bytes;
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
