/* The checkpoint hook: the seed's CheckpointSaverHook, at loop boundaries. */
#include "core/log.h"
#include "core/thread.h"
#include "infeed/checkpoint.h"

#include <errno.h>
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

static int save(ckpt_hook *h, ifd_run_context *ctx, ifd_error *err)
{
    int64_t t0 = ifd_clock_ns();
    ifd_checkpoint *c;
    int rc = ifd_run_context_checkpoint(ctx, &c, err);
    if (rc)
        return rc;
    if (h->o.positions)
        rc = h->o.positions(h->o.positions_arg, c, err);
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
    if (mkdir(h->dir, 0755) != 0 && errno != EEXIST)
        return ifd_error_set(err, IFD_EIO, "checkpoint_dir: cannot create '%s': %s", h->dir,
                             strerror(errno));
    /* What a killed writer left behind, and checkpoints beyond keep. */
    return ifd_checkpoint_prune(h->dir, h->o.keep, err);
}

static int ck_after_create_session(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    ckpt_hook *h = arg;
    h->start_step = h->prev_step = ifd_run_context_global_step(ctx);
    return IFD_OK;
}

static int ck_after_run(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    ckpt_hook *h = arg;
    int64_t gs = ifd_run_context_global_step(ctx), prev = h->prev_step;
    h->prev_step = gs;
    if (h->o.every > 0 && gs / h->o.every > prev / h->o.every)
        return save(h, ctx, err);
    return IFD_OK;
}

static int ck_end(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    ckpt_hook *h = arg;
    int64_t gs = ifd_run_context_global_step(ctx);
    if (ifd_run_context_failed(ctx)) {
        IFD_LOG_WARN("checkpoint: none at the end: the run failed at global step %lld (the last "
                     "one is at step %lld)",
                     (long long)gs, (long long)h->saved_step);
        return IFD_OK;
    }
    if (gs == h->saved_step || gs == h->start_step)
        return IFD_OK;
    if (ifd_run_context_dropped(ctx) > 0) {
        /* the source counted those batches as handed out: positions now would skip them */
        IFD_LOG_WARN("checkpoint: none at the end: the input ended inside a step, whose %lld "
                     "batches were not trained on (the last checkpoint is at step %lld)",
                     (long long)ifd_run_context_dropped(ctx), (long long)h->saved_step);
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
