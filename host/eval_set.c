/* The eval set (host/eval_set.h): copies of the eval producers' step batches, and their replay. */
#include "host/eval_set.h"

#include "core/log.h"
#include "core/thread.h"
#include "intake/shard.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct eval_batch {
    int64_t rows;
    int ntensors;
    ifd_tensor t[IFD_MAX_INPUTS]; /* their data: copies owned here */
} eval_batch;

/* the stored entry, and the replay's batch of it during an eval */
_Static_assert(sizeof(eval_batch) + sizeof(ifd_batch) <= IFD_EVAL_BATCH_OVERHEAD,
               "IFD_EVAL_BATCH_OVERHEAD covers a batch's bookkeeping");

struct ifd_eval_set {
    ifd_mutex mu;
    ifd_cond cv;
    int64_t max_bytes, bytes;
    eval_batch *b;
    int64_t n, cap;
    int joined, ended; /* eval producers welcomed, and of those, ended */
    int closed;
    int refused; /* a batch did not fit, or an eval producer left without END: the set is
                    incomplete for the rest of the run */
    char refused_msg[IFD_ERROR_MSG_MAX];
    int warned; /* the wait's WARN line was written */
};

int ifd_eval_set_create(ifd_eval_set **out, int64_t max_bytes)
{
    ifd_eval_set *e = calloc(1, sizeof *e);
    if (e == NULL)
        return IFD_ENOMEM;
    ifd_mutex_init(&e->mu);
    ifd_cond_init(&e->cv);
    e->max_bytes = max_bytes;
    *out = e;
    return IFD_OK;
}

void ifd_eval_set_destroy(ifd_eval_set *e)
{
    if (e == NULL)
        return;
    for (int64_t i = 0; i < e->n; i++)
        for (int j = 0; j < e->b[i].ntensors; j++)
            free(e->b[i].t[j].data);
    free(e->b);
    ifd_cond_fini(&e->cv);
    ifd_mutex_fini(&e->mu);
    free(e);
}

static int complete(const ifd_eval_set *e)
{
    return e->joined > 0 && e->ended == e->joined;
}

int ifd_eval_set_join(ifd_eval_set *e, const char *producer, ifd_error *err)
{
    int rc = IFD_OK;
    ifd_mutex_lock(&e->mu);
    if (e->closed)
        rc = ifd_error_set(err, IFD_ECLOSED,
                           "HELLO: role: eval producer '%s': the run is stopping; no eval set is "
                           "taken any more",
                           producer);
    else if (complete(e))
        rc = ifd_error_set(err, IFD_ECLOSED,
                           "HELLO: role: eval producer '%s': the eval set is complete (every "
                           "eval producer sent END, %" PRId64 " batches); it is sent once a run",
                           producer, e->n);
    else
        e->joined++;
    ifd_mutex_unlock(&e->mu);
    return rc;
}

void ifd_eval_set_end(ifd_eval_set *e)
{
    ifd_mutex_lock(&e->mu);
    if (e->ended < e->joined)
        e->ended++;
    if (complete(e)) {
        IFD_LOG_INFO("eval set complete: %" PRId64 " batches, %" PRId64 " bytes", e->n, e->bytes);
        ifd_cond_broadcast(&e->cv);
    }
    ifd_mutex_unlock(&e->mu);
}

void ifd_eval_set_abandon(ifd_eval_set *e, const char *producer, const char *why)
{
    ifd_mutex_lock(&e->mu);
    if (!e->refused)
        snprintf(e->refused_msg, sizeof e->refused_msg,
                 "eval producer '%.64s' %.200s before its END: the eval set is incomplete",
                 producer, why);
    e->refused = 1;
    ifd_cond_broadcast(&e->cv);
    ifd_mutex_unlock(&e->mu);
}

/* Bytes of memory a tensor of len bytes takes here (64-byte aligned). */
static size_t held(size_t len)
{
    return len ? (len + 63) / 64 * 64 : 64;
}

/* What a batch is charged: its tensors as held, and its bookkeeping. */
static int64_t batch_bytes(const ifd_tensor *t, int n)
{
    int64_t sum = IFD_EVAL_BATCH_OVERHEAD;
    for (int j = 0; j < n; j++)
        sum += (int64_t)held(ifd_tensor_nbytes(&t[j]));
    return sum;
}

static int grow(ifd_eval_set *e)
{
    if (e->n < e->cap)
        return IFD_OK;
    int64_t cap = e->cap ? 2 * e->cap : 64;
    eval_batch *b = realloc(e->b, (size_t)cap * sizeof *b);
    if (b == NULL)
        return IFD_ENOMEM;
    e->b = b;
    e->cap = cap;
    return IFD_OK;
}

int ifd_eval_set_add(ifd_eval_set *e, const ifd_tensor *tensors, int ntensors, int64_t rows,
                     const char *producer, int64_t seq, ifd_error *err)
{
    int64_t size = batch_bytes(tensors, ntensors);
    int rc = IFD_OK;
    ifd_mutex_lock(&e->mu);
    if (e->closed) {
        rc = ifd_error_set(err, IFD_ECLOSED, "the run is stopping; no eval set is taken any more");
        goto out;
    }
    if (e->bytes + size > e->max_bytes) {
        rc = ifd_error_set(err, IFD_ERANGE,
                           "the eval set does not fit in --eval-memory (%" PRId64
                           " bytes): it holds %" PRId64 " bytes in %" PRId64
                           " batches and this batch takes %" PRId64
                           " bytes (its tensors, each rounded up to 64 bytes, and %d for its "
                           "bookkeeping); raise --eval-memory or send a smaller eval set "
                           "(evaluation is skipped for the rest of this run, training goes on)",
                           e->max_bytes, e->bytes, e->n, size, IFD_EVAL_BATCH_OVERHEAD);
        if (!e->refused)
            snprintf(e->refused_msg, sizeof e->refused_msg,
                     "batch %" PRId64 " from eval producer '%.64s' was refused: %.380s", seq,
                     producer, err->msg);
        e->refused = 1;
        ifd_cond_broadcast(&e->cv);
        goto out;
    }
    if ((rc = grow(e)) != IFD_OK) {
        ifd_error_set(err, rc, "the eval set: no memory for %" PRId64 " batches", e->n + 1);
        goto out;
    }
    eval_batch *b = &e->b[e->n];
    memset(b, 0, sizeof *b);
    b->rows = rows;
    for (int j = 0; j < ntensors; j++) {
        size_t len = ifd_tensor_nbytes(&tensors[j]);
        b->t[j] = tensors[j];
        b->t[j].data = aligned_alloc(64, held(len));
        if (b->t[j].data == NULL) {
            for (int i = 0; i < j; i++)
                free(b->t[i].data);
            rc = ifd_error_set(err, IFD_ENOMEM, "the eval set: no memory for %zu bytes", len);
            goto out;
        }
        memcpy(b->t[j].data, tensors[j].data, len);
    }
    b->ntensors = ntensors;
    e->n++;
    e->bytes += size;
out:
    ifd_mutex_unlock(&e->mu);
    return rc;
}

void ifd_eval_set_close(ifd_eval_set *e)
{
    if (e == NULL)
        return;
    ifd_mutex_lock(&e->mu);
    e->closed = 1;
    ifd_cond_broadcast(&e->cv);
    ifd_mutex_unlock(&e->mu);
}

int ifd_eval_set_wait(ifd_eval_set *e, int64_t global_step, int64_t *batches, ifd_error *err)
{
    int rc = IFD_OK;
    ifd_mutex_lock(&e->mu);
    while (!complete(e) && !e->closed && !e->refused) {
        if (!e->warned)
            IFD_LOG_WARN("eval due at global step %" PRId64 ": training waits for the eval set "
                         "(%s)",
                         global_step,
                         e->joined == 0 ? "no eval producer has connected yet"
                                        : "an eval producer has not sent END yet");
        e->warned = 1;
        ifd_cond_wait(&e->cv, &e->mu);
    }
    if (e->refused)
        rc = ifd_error_set(err, IFD_ERANGE, "%s", e->refused_msg);
    else if (!complete(e))
        rc = ifd_error_set(err, IFD_ECLOSED,
                           "the run is stopping, and the eval set is not complete (%d eval "
                           "producers welcomed, %d sent END)",
                           e->joined, e->ended);
    else
        *batches = e->n;
    ifd_mutex_unlock(&e->mu);
    return rc;
}

int64_t ifd_eval_set_bytes(ifd_eval_set *e)
{
    ifd_mutex_lock(&e->mu);
    int64_t b = e->bytes;
    ifd_mutex_unlock(&e->mu);
    return b;
}

void ifd_eval_set_get_state(ifd_eval_set *e, ifd_eval_set_state *st, char *why, size_t len)
{
    ifd_mutex_lock(&e->mu);
    *st = (ifd_eval_set_state){.batches = e->n,
                               .bytes = e->bytes,
                               .max_bytes = e->max_bytes,
                               .producers = e->joined,
                               .ended = e->ended,
                               .complete = complete(e) && !e->refused};
    snprintf(why, len, "%s", e->refused ? e->refused_msg : "");
    ifd_mutex_unlock(&e->mu);
}

/* ---- the replay ---------------------------------------------------------------------------- */

struct ifd_eval_replay {
    ifd_mutex mu;
    ifd_batch *b; /* one a stored batch, views of its tensors */
    int64_t n, next;
    int aborted;
    /* ifd_eval_replay_pad: padding batches after the stored ones, up to total */
    const ifd_program *program;
    int64_t pad_rows, total;
};

static void replay_release(ifd_batch *b, void *arg)
{
    (void)b;
    (void)arg; /* the bytes are the set's */
}

static int replay_try_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    ifd_eval_replay *r = ctx;
    int rc;
    ifd_mutex_lock(&r->mu);
    if (r->aborted) {
        rc = IFD_ESTOPPED;
    } else if (r->next < r->n) {
        *out = &r->b[r->next++];
        rc = IFD_OK;
    } else if (r->next < r->total) {
        rc = ifd_infeed_padding_batch(r->program, IFD_MODE_EVAL, r->pad_rows, out, err);
        if (rc == IFD_OK)
            r->next++;
    } else {
        rc = IFD_EEOF;
    }
    ifd_mutex_unlock(&r->mu);
    return rc;
}

static void replay_abort(void *ctx)
{
    ifd_eval_replay *r = ctx;
    ifd_mutex_lock(&r->mu);
    r->aborted = 1;
    ifd_mutex_unlock(&r->mu);
}

static const ifd_batch_source_ops replay_ops = {
    .next = replay_try_next, /* never blocks: every batch is here */
    .abort = replay_abort,
    .try_next = replay_try_next,
};

int ifd_eval_replay_create(ifd_eval_replay **out, ifd_eval_set *e, ifd_error *err)
{
    ifd_eval_replay *r = calloc(1, sizeof *r);
    ifd_mutex_lock(&e->mu);
    int64_t n = e->n;
    if (r)
        r->b = calloc(n ? (size_t)n : 1, sizeof *r->b);
    if (r == NULL || r->b == NULL) {
        ifd_mutex_unlock(&e->mu);
        if (r)
            free(r->b);
        free(r);
        return ifd_error_set(err, IFD_ENOMEM, "the eval set's replay of %" PRId64 " batches", n);
    }
    for (int64_t i = 0; i < n; i++) {
        ifd_batch *b = &r->b[i];
        ifd_batch_init(b);
        b->seq = i;
        b->rows = e->b[i].rows;
        b->flags = IFD_BATCH_CHECKED; /* checked by the ingest as it arrived */
        b->ntensors = e->b[i].ntensors;
        memcpy(b->tensors, e->b[i].t, sizeof b->tensors);
        b->producer = "eval set";
        b->release = replay_release;
    }
    ifd_mutex_unlock(&e->mu);
    ifd_mutex_init(&r->mu);
    r->n = n;
    r->total = n;
    *out = r;
    return IFD_OK;
}

void ifd_eval_replay_pad(ifd_eval_replay *r, const ifd_program *p, int64_t rows, int64_t total)
{
    ifd_mutex_lock(&r->mu);
    r->program = p;
    r->pad_rows = rows;
    r->total = total;
    ifd_mutex_unlock(&r->mu);
}

ifd_batch_source ifd_eval_replay_source(ifd_eval_replay *r)
{
    return (ifd_batch_source){.ops = &replay_ops, .ctx = r};
}

void ifd_eval_replay_destroy(ifd_eval_replay *r)
{
    if (r == NULL)
        return;
    ifd_mutex_fini(&r->mu);
    free(r->b);
    free(r);
}
