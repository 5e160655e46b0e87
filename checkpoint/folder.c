/* The checkpoint folder (docs/checkpoint.md): checkpoints named by their step, the last few kept,
 * the newest that loads found. */
#include "core/log.h"
#include "checkpoint/format.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME_PREFIX "ckpt-"
#define TMP_PREFIX ".ckpt-"

/* ---- the folder ------------------------------------------------------------------------------ */

/* ckpt-<digits>.ifdckpt: 1 and the step; else 0. */
static int parse_name(const char *name, int64_t *step)
{
    size_t plen = strlen(NAME_PREFIX), slen = strlen(IFD_CHECKPOINT_SUFFIX), len = strlen(name);
    if (len <= plen + slen || len - plen - slen > 18 || strncmp(name, NAME_PREFIX, plen) != 0 ||
        strcmp(name + len - slen, IFD_CHECKPOINT_SUFFIX) != 0)
        return 0;
    int64_t v = 0;
    for (const char *p = name + plen; p < name + len - slen; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        v = v * 10 + (*p - '0');
    }
    *step = v;
    return 1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The steps of dir's checkpoints, ascending (malloc'd; *n may be 0). With remove_tmp, also
 * removes the temporary files of killed writers. */
static int list_steps(const char *dir, int64_t **steps, size_t *n, int remove_tmp, ifd_error *err)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (d == NULL)
        return ifd_error_set(err, errno == ENOENT ? IFD_ENOTFOUND : IFD_EIO,
                             "checkpoint folder '%s': %s", dir, strerror(errno));
    size_t cap = 0;
    int rc = IFD_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step;
        if (remove_tmp && strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0 &&
            strstr(e->d_name, CKPT_TMP_MARK)) {
            char path[4096 + 256];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) == 0)
                IFD_LOG_INFO("checkpoint: removed '%s', left by an interrupted write", path);
            continue;
        }
        if (!parse_name(e->d_name, &step))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *s = realloc(*steps, cap * sizeof *s);
            if (s == NULL) {
                rc = ifd_error_set(err, IFD_ENOMEM, "checkpoint folder '%s'", dir);
                break;
            }
            *steps = s;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    if (rc) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return rc;
    }
    if (*n)
        qsort(*steps, *n, sizeof **steps, cmp_i64);
    return IFD_OK;
}

static int step_path(char *path, size_t len, const char *dir, int64_t step, ifd_error *err)
{
    int n = snprintf(path, len, "%s/" NAME_PREFIX "%012" PRId64 IFD_CHECKPOINT_SUFFIX, dir, step);
    if (n < 0 || (size_t)n >= len)
        return ifd_error_set(err, IFD_ERANGE,
                             "checkpoint folder '%s': the path of a checkpoint does not fit in "
                             "%zu bytes",
                             dir, len);
    return IFD_OK;
}

int ifd_checkpoint_latest_step(const char *dir, int64_t *step, ifd_error *err)
{
    int64_t *steps;
    size_t n;
    int rc = list_steps(dir, &steps, &n, 0, err);
    if (rc)
        return rc;
    if (n == 0)
        return ifd_error_set(err, IFD_ENOTFOUND,
                             "checkpoint folder '%s': no checkpoint (" NAME_PREFIX
                             "<step>" IFD_CHECKPOINT_SUFFIX ") in it",
                             dir);
    *step = steps[n - 1];
    free(steps);
    return IFD_OK;
}

int ifd_checkpoint_latest(const char *dir, char *path, size_t len, ifd_error *err)
{
    int64_t step;
    int rc = ifd_checkpoint_latest_step(dir, &step, err);
    return rc ? rc : step_path(path, len, dir, step, err);
}

/* Removes the checkpoints of dir beyond the newest keep, except the one of step spare (-1:
 * none), and the temporary files of killed writers. */
static int prune(const char *dir, int keep, int64_t spare, ifd_error *err)
{
    if (keep < 1)
        return ifd_error_set(err, IFD_EINVAL, "keep_checkpoints: expected 1 or more, got %d", keep);
    int64_t *steps;
    size_t n;
    int rc = list_steps(dir, &steps, &n, 1, err);
    if (rc)
        return rc;
    for (size_t i = 0; i + (size_t)keep < n && rc == IFD_OK; i++) {
        if (steps[i] == spare)
            continue;
        char path[4096 + 64];
        rc = step_path(path, sizeof path, dir, steps[i], err);
        if (rc == IFD_OK && unlink(path) != 0 && errno != ENOENT)
            rc = ifd_error_set(err, IFD_EIO, "checkpoint: cannot remove '%s': %s", path,
                               strerror(errno));
    }
    free(steps);
    return rc;
}

int ifd_checkpoint_prune(const char *dir, int keep, ifd_error *err)
{
    return prune(dir, keep, -1, err);
}

int ifd_checkpoint_save(const ifd_checkpoint *c, const char *dir, int keep, char *path, size_t len,
                        ifd_error *err)
{
    char buf[4096 + 64];
    int rc = step_path(buf, sizeof buf, dir, c->global_step, err);
    if (rc == IFD_OK)
        rc = ifd_checkpoint_write(c, buf, err);
    if (rc == IFD_OK)
        rc = prune(dir, keep, c->global_step, err);
    if (rc == IFD_OK && path && snprintf(path, len, "%s", buf) >= (int)len)
        rc = ifd_error_set(err, IFD_ERANGE, "checkpoint: the path '%s' does not fit in %zu bytes",
                           buf, len);
    return rc;
}
/* The newest of the n checkpoints (steps, ascending) that loads, into *out and path; *good is
 * its index (n: none), bad[i] the problem of each newer one (code IFD_OK: gone since the
 * listing), *newest_bad the newest with a problem (n: none). An error other than a checkpoint's
 * own problem (IFD_EPROTO, IFD_EIO) ends the search. */
static int load_newest(const char *dir, const int64_t *steps, size_t n, ifd_checkpoint **out,
                       char *path, size_t len, ifd_error *bad, size_t *good, size_t *newest_bad,
                       ifd_error *err)
{
    *good = *newest_bad = n;
    for (size_t i = n; i-- > 0;) {
        char p[4096 + 64];
        int rc = step_path(p, sizeof p, dir, steps[i], err);
        if (rc)
            return rc;
        int lrc = ifd_checkpoint_load(p, out, &bad[i]);
        if (lrc == IFD_OK) {
            *good = i;
            if (snprintf(path, len, "%s", p) >= (int)len)
                return ifd_error_set(err, IFD_ERANGE,
                                     "checkpoint folder '%s': the path of a checkpoint does not "
                                     "fit in %zu bytes",
                                     dir, len);
            return IFD_OK;
        }
        if (lrc == IFD_ENOTFOUND) { /* pruned by a writer since the listing: a newer one exists */
            bad[i].code = IFD_OK;
            continue;
        }
        if (lrc != IFD_EPROTO && lrc != IFD_EIO)
            return ifd_error_set(err, lrc, "%s", bad[i].msg);
        if (*newest_bad == n)
            *newest_bad = i;
    }
    return IFD_OK;
}

/* The error when none of the n checkpoints loaded: the newest's problem in one sentence. */
static int none_loaded(const char *dir, size_t n, const ifd_error *newest, ifd_error *err)
{
    if (newest == NULL)
        return ifd_error_set(err, IFD_ENOTFOUND,
                             "checkpoint folder '%s': its checkpoints vanished while read", dir);
    if (n == 1)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint folder '%s': its only checkpoint does not load: %s", dir,
                             newest->msg);
    return ifd_error_set(err, IFD_EPROTO,
                         "checkpoint folder '%s': none of its %zu checkpoints loads; the "
                         "newest: %s",
                         dir, n, newest->msg);
}

/* Tells each damaged checkpoint newer than the one that loaded (index good), renaming it to
 * <name>.damaged with set_aside. */
static void skip_damaged(const char *dir, const int64_t *steps, size_t n, size_t good,
                         const ifd_error *bad, int set_aside)
{
    for (size_t i = good + 1; i < n; i++) {
        if (bad[i].code == IFD_OK)
            continue;
        char p[4096 + 64], q[4096 + 80];
        if (!set_aside || step_path(p, sizeof p, dir, steps[i], NULL) != IFD_OK) {
            IFD_LOG_WARN("checkpoint: skipped a damaged checkpoint: %s", bad[i].msg);
            continue;
        }
        snprintf(q, sizeof q, "%s" IFD_CHECKPOINT_DAMAGED, p);
        if (rename(p, q) == 0)
            IFD_LOG_WARN("checkpoint: skipped a damaged checkpoint, renamed to '%s': %s", q,
                         bad[i].msg);
        else
            IFD_LOG_WARN("checkpoint: skipped a damaged checkpoint (cannot rename it to '%s': %s): "
                         "%s",
                         q, strerror(errno), bad[i].msg);
    }
}

int ifd_checkpoint_load_latest(const char *dir, int set_aside, ifd_checkpoint **out, char *path,
                               size_t len, ifd_error *err)
{
    *out = NULL;
    int64_t *steps;
    size_t n;
    int rc = list_steps(dir, &steps, &n, 0, err);
    if (rc)
        return rc;
    if (n == 0) {
        free(steps);
        return ifd_error_set(err, IFD_ENOTFOUND,
                             "checkpoint folder '%s': no checkpoint (" NAME_PREFIX
                             "<step>" IFD_CHECKPOINT_SUFFIX ") in it",
                             dir);
    }
    /* Newest first. The problems are told once one loads (when none does, the one sentence of
     * the error names the newest's). */
    ifd_error *bad = calloc(n, sizeof *bad);
    size_t good = n, newest_bad = n;
    if (bad == NULL)
        rc = ifd_error_set(err, IFD_ENOMEM, "checkpoint folder '%s'", dir);
    else
        rc = load_newest(dir, steps, n, out, path, len, bad, &good, &newest_bad, err);
    if (rc == IFD_OK && good == n)
        rc = none_loaded(dir, n, newest_bad == n ? NULL : &bad[newest_bad], err);
    if (rc == IFD_OK)
        skip_damaged(dir, steps, n, good, bad, set_aside);
    if (rc) {
        ifd_checkpoint_free(*out);
        *out = NULL;
    }
    free(bad);
    free(steps);
    return rc;
}
