/* The checkpoint hook: the seed's CheckpointSaverHook, at loop boundaries. */
#include "core/log.h"
#include "core/thread.h"
#include <infeed/checkpoint.h>
#include <infeed/hosts.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct ckpt_hook {
    ifd_checkpoint_options o;
    char *dir;
    int64_t start_step; /* the run's first global step */
    int64_t prev_step;  /* at the previous loop end */
    int64_t saved_step; /* of the last checkpoint written, -1: none */
} ckpt_hook;

static int many(const ckpt_hook *h)
{
    return ifd_hosts_many(h->o.hosts);
}

static int writes(const ckpt_hook *h)
{
    return !many(h) || h->o.write;
}

/* A position on the wire between hosts: the name (NUL-padded) and the seq. */
typedef struct wire_pos {
    char name[IFD_CHECKPOINT_NAME_MAX + 1];
    int64_t seq;
} wire_pos;

/* Several hosts: c holds this host's positions in its table; afterwards it holds every host's
 * (the largest table's size agreed with an all-reduce, then an all-gather of the tables padded
 * to it, on the LOOP channel: the session's thread, between loops, on every host in turn). */
static int gather_positions(const ifd_hosts *hs, ifd_checkpoint *c, ifd_error *err)
{
    int64_t n = ifd_checkpoint_producer_count(c);
    int64_t most = n;
    int rc =
        hs->ops->allreduce_i64(hs->ctx, IFD_HOSTS_LOOP, &most, 1, IFD_HOSTS_MAX, NULL, NULL, err);
    if (rc)
        return rc;
    size_t per = sizeof(int64_t) + (size_t)most * sizeof(wire_pos);
    uint8_t *send = calloc(1, per), *recv = calloc((size_t)hs->size, per);
    if (send == NULL || recv == NULL) {
        free(send);
        free(recv);
        return ifd_error_set(err, IFD_ENOMEM, "checkpoint: the positions of %d hosts", hs->size);
    }
    memcpy(send, &n, sizeof n);
    for (int64_t i = 0; i < n; i++) {
        wire_pos w;
        memset(&w, 0, sizeof w);
        snprintf(w.name, sizeof w.name, "%s", ifd_checkpoint_producer_name(c, (int)i));
        w.seq = ifd_checkpoint_producer_seq(c, (int)i);
        memcpy(send + sizeof n + (size_t)i * sizeof w, &w, sizeof w);
    }
    rc = hs->ops->allgather(hs->ctx, IFD_HOSTS_LOOP, send, recv, per, NULL, NULL, err);
    for (int r = 0; r < hs->size && rc == IFD_OK; r++) {
        if (r == hs->rank)
            continue;
        const uint8_t *b = recv + (size_t)r * per;
        int64_t rn;
        memcpy(&rn, b, sizeof rn);
        rc = ifd_checkpoint_select_host(c, r, err);
        for (int64_t i = 0; i < rn && rc == IFD_OK; i++) {
            wire_pos w;
            memcpy(&w, b + sizeof rn + (size_t)i * sizeof w, sizeof w);
            w.name[sizeof w.name - 1] = '\0';
            rc = ifd_checkpoint_set_producer(c, w.name, w.seq, err);
        }
    }
    free(send);
    free(recv);
    return rc;
}

int ifd_checkpoint_add_positions(ifd_checkpoint *c, const ifd_hosts *hosts,
                                 int (*positions)(void *arg, ifd_checkpoint *c, ifd_error *err),
                                 void *positions_arg, ifd_error *err)
{
    int rc = IFD_OK;
    if (ifd_hosts_many(hosts)) {
        rc = ifd_checkpoint_set_hosts(c, hosts->size, err);
        if (rc == IFD_OK)
            rc = ifd_checkpoint_select_host(c, hosts->rank, err);
    }
    if (rc == IFD_OK && positions)
        rc = positions(positions_arg, c, err);
    if (rc == IFD_OK && ifd_hosts_many(hosts))
        rc = gather_positions(hosts, c, err);
    return rc;
}

static int save(ckpt_hook *h, ifd_run_context *ctx, ifd_error *err)
{
    int64_t t0 = ifd_clock_ns();
    ifd_checkpoint *c;
    int rc = ifd_run_context_checkpoint(ctx, &c, err);
    if (rc)
        return rc;
    rc = ifd_checkpoint_add_positions(c, h->o.hosts, h->o.positions, h->o.positions_arg, err);
    if (rc == IFD_OK && !writes(h)) {
        h->saved_step = ifd_checkpoint_global_step(c);
        ifd_checkpoint_free(c);
        return IFD_OK;
    }
    char path[4096 + 64];
    if (rc == IFD_OK)
        rc = ifd_checkpoint_save(c, h->dir, h->o.keep, path, sizeof path, err);
    if (rc == IFD_OK) {
        h->saved_step = ifd_checkpoint_global_step(c);
        IFD_LOG_INFO("checkpoint at global step %lld: %s (%d producers, %.1f ms)",
                     (long long)h->saved_step, path, ifd_checkpoint_producer_count(c),
                     (double)(ifd_clock_ns() - t0) / 1e6);
    }
    ifd_checkpoint_free(c);
    return rc;
}

static int ck_begin(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)ctx;
    ckpt_hook *h = arg;
    if (!writes(h))
        return IFD_OK;
    if (mkdir(h->dir, 0755) != 0 && errno != EEXIST)
        return ifd_error_set(err, IFD_EIO, "checkpoint_dir: cannot create '%s': %s", h->dir,
                             strerror(errno));
    /* What a killed writer left behind, and checkpoints beyond keep. */
    return ifd_checkpoint_prune(h->dir, h->o.keep, err);
}

/* Loops the session sizes itself end at the next multiple of every, so checkpoints fall on
 * exact multiples (loops of a fixed length ignore it). */
static void end_loop_at_next_multiple(const ckpt_hook *h, ifd_run_context *ctx)
{
    if (h->o.every > 0)
        ifd_run_context_end_next_loop_by(ctx, (ifd_run_context_global_step(ctx) / h->o.every + 1) *
                                                  h->o.every);
}

static int ck_after_create_session(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    ckpt_hook *h = arg;
    h->start_step = h->prev_step = ifd_run_context_global_step(ctx);
    end_loop_at_next_multiple(h, ctx);
    return IFD_OK;
}

static int ck_after_run(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    ckpt_hook *h = arg;
    int64_t gs = ifd_run_context_global_step(ctx), prev = h->prev_step;
    h->prev_step = gs;
    end_loop_at_next_multiple(h, ctx);
    if (h->o.every > 0 && gs / h->o.every > prev / h->o.every)
        return save(h, ctx, err);
    return IFD_OK;
}

/* Where the last checkpoint is, for the warnings of an end that writes none: the one this run
 * wrote last, else the newest in the folder (a run resumed from it), else that there is none. */
static const char *last_checkpoint(const ckpt_hook *h, char *buf, size_t len)
{
    int64_t step = h->saved_step;
    ifd_error e;
    ifd_error_clear(&e);
    if (step < 0 && ifd_checkpoint_latest_step(h->dir, &step, &e) != IFD_OK)
        step = -1;
    if (step >= 0)
        snprintf(buf, len, "the last checkpoint in %s is at step %lld", h->dir, (long long)step);
    else
        snprintf(buf, len, "%s holds no checkpoint", h->dir);
    return buf;
}

static int ck_end(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    ckpt_hook *h = arg;
    int64_t gs = ifd_run_context_global_step(ctx);
    char last[4200];
    if (ifd_run_context_failed(ctx)) {
        IFD_LOG_WARN("checkpoint: none at the end: the run failed at global step %lld (%s)",
                     (long long)gs, last_checkpoint(h, last, sizeof last));
        return IFD_OK;
    }
    if (gs == h->saved_step || gs == h->start_step)
        return IFD_OK;
    int64_t dropped = ifd_run_context_dropped(ctx);
    if (many(h)) {
        /* every host writes or skips this one together (its positions are in it) */
        const ifd_hosts *hs = h->o.hosts;
        int rc = hs->ops->allreduce_i64(hs->ctx, IFD_HOSTS_LOOP, &dropped, 1, IFD_HOSTS_MAX, NULL,
                                        NULL, err);
        if (rc)
            return rc;
    }
    if (dropped > 0) {
        /* the source counted those batches as handed out: positions now would skip them */
        IFD_LOG_WARN("checkpoint: none at the end: the input ended with batches taken from "
                     "the producers and not trained on (%lld, inside a step or, with several "
                     "hosts, queued for the next steps), which its positions would skip (%s)",
                     (long long)dropped, last_checkpoint(h, last, sizeof last));
        return IFD_OK;
    }
    return save(h, ctx, err);
}

static void ck_destroy(void *arg)
{
    ckpt_hook *h = arg;
    free(h->dir);
    free(h);
}

int ifd_hook_checkpoint(ifd_hook *out, const ifd_checkpoint_options *o, ifd_error *err)
{
    if (o->dir == NULL || o->dir[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "checkpoint_dir: expected a folder, got nothing");
    if (o->every < 0)
        return ifd_error_set(err, IFD_EINVAL, "checkpoint_every: expected 0 or more, got %lld",
                             (long long)o->every);
    if (o->keep < 1)
        return ifd_error_set(err, IFD_EINVAL, "keep_checkpoints: expected 1 or more, got %d",
                             o->keep);
    ckpt_hook *h = calloc(1, sizeof *h);
    if (h)
        h->dir = strdup(o->dir);
    if (h == NULL || h->dir == NULL) {
        free(h);
        return ifd_error_set(err, IFD_ENOMEM, "checkpoint hook");
    }
    h->o = *o;
    h->o.dir = h->dir;
    h->saved_step = -1;
    *out = (ifd_hook){
        .name = "checkpoint",
        .begin = ck_begin,
        .after_create_session = ck_after_create_session,
        .after_run = ck_after_run,
        .end = ck_end,
        .destroy = ck_destroy,
        .arg = h,
    };
    return IFD_OK;
}
