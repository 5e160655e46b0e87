/* What a run of infeedd starts from (host/start.h): the checkpoint, the folder it writes, and on
 * several hosts this host's part of the config. */
#include "host/start.h"
#include "host/hosts.h"
#include "infeed/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --resume or --checkpoint (eval and predict: or the latest in --checkpoint-dir): the
 * checkpoint to start from, checked against the config. --checkpoint names one file, which must
 * load; from a folder, the newest that loads is taken, damaged newer ones skipped with a warning
 * (and, when training, set aside as <name>.damaged: the run's own checkpoints replace them). */
int ifd_daemon_load_start(const ifd_daemon_config *c, ifd_checkpoint **out, ifd_error *err)
{
    char path[4096 + 64];
    int rc;
    if (c->checkpoint) {
        snprintf(path, sizeof path, "%s", c->checkpoint);
        rc = ifd_checkpoint_load(path, out, err);
    } else {
        /* only the host that writes the folder sets damaged files aside */
        rc = ifd_checkpoint_load_latest(c->checkpoint_dir,
                                        c->run.mode == IFD_MODE_TRAIN && c->checkpoint_writer, out,
                                        path, sizeof path, err);
        if (rc && c->resume)
            return ifd_error_prefix(err, "--resume");
        if (rc) {
            ifd_error_prefix(err, "checkpoint_dir");
            return ifd_error_mark_key(err, "checkpoint_dir", 0, 14);
        }
    }
    if (rc == IFD_OK && (rc = ifd_checkpoint_check(*out, &c->run, err)) != IFD_OK)
        ifd_error_prefix(err, "%s", path);
    /* Training resumes each host's producers from its own table: the same hosts only. */
    int hosts = c->run.hosts ? c->run.hosts->size : 1;
    if (rc == IFD_OK && c->run.mode == IFD_MODE_TRAIN && ifd_checkpoint_hosts(*out) != hosts)
        rc = ifd_error_set(err, IFD_EINVAL,
                           "%s: checkpoint '%s' holds the producer positions of %d host%s, this "
                           "run has %d: resume it on %d host%s",
                           c->checkpoint ? "--checkpoint" : "--resume", path,
                           ifd_checkpoint_hosts(*out), ifd_checkpoint_hosts(*out) == 1 ? "" : "s",
                           hosts, ifd_checkpoint_hosts(*out),
                           ifd_checkpoint_hosts(*out) == 1 ? "" : "s");
    if (rc == IFD_OK && c->run.mode == IFD_MODE_TRAIN && hosts > 1)
        rc = ifd_checkpoint_select_host(*out, c->run.hosts->rank, err);
    if (rc && *out) {
        ifd_checkpoint_free(*out);
        *out = NULL;
    }
    return rc;
}

/* A train run writes into checkpoint_dir only when nothing there is ahead of where it starts:
 * checkpoints of another timeline beside its own would be pruned for them, or taken by a later
 * --resume. */
int ifd_daemon_check_dir(const ifd_daemon_config *c, const ifd_checkpoint *start, ifd_error *err)
{
    int64_t latest, from = start ? ifd_checkpoint_global_step(start) : c->run.initial_global_step;
    int rc = ifd_checkpoint_latest_step(c->checkpoint_dir, &latest, err);
    if (rc == IFD_ENOTFOUND)
        return IFD_OK;
    if (rc)
        return rc;
    if (latest > from)
        return ifd_error_set_key(err, IFD_EINVAL, "checkpoint_dir",
                                 "'%s' holds a checkpoint at global step %lld, ahead of this run's "
                                 "start at %lld: pass --resume to continue from it, or use another "
                                 "folder",
                                 c->checkpoint_dir, (long long)latest, (long long)from);
    return IFD_OK;
}

/* Several hosts: "{rank}" in the endpoints and paths becomes this host's rank; the global batch
 * becomes this host's share; outputs named without "{rank}" are rank 0's alone (summaries, the
 * PUB socket, checkpoints). An error is a config error. */
int ifd_daemon_apply_hosts(ifd_daemon_config *c, ifd_hosts *h, ifd_error *err)
{
    const char **fields[] = {&c->listen,      &c->publish,        &c->control,    &c->summaries,
                             &c->predictions, &c->checkpoint_dir, &c->checkpoint, &c->ready_file};
    int had_rank[sizeof fields / sizeof fields[0]];
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char *v = ifd_daemon_hosts_subst(*fields[i], h->rank);
        had_rank[i] = v != NULL;
        if (v == NULL)
            continue;
        if (c->nstrings == (int)(sizeof c->strings / sizeof c->strings[0])) {
            free(v);
            return ifd_error_set(err, IFD_ENOMEM, "too many string settings");
        }
        c->strings[c->nstrings++] = v;
        *fields[i] = v;
    }
    if (h->size == 1)
        return IFD_OK;
    if (c->control == c->default_control) { /* one a host, as hosts may share a machine */
        size_t n = strlen(c->default_control);
        snprintf(c->default_control + n, sizeof c->default_control - n, "-%d", h->rank);
    }
    int64_t b = c->run.batch_size, per = (int64_t)h->size * c->run.replicas;
    if (b % per != 0)
        return ifd_error_set_key(err, IFD_EINVAL, "batch_size",
                                 "%lld is not divisible by %d hosts x %d replicas (the global "
                                 "batch is split over every host's replicas)",
                                 (long long)b, h->size, c->run.replicas);
    c->run.batch_size = b / h->size;
    c->run.hosts = h;
    if (h->rank != 0) {
        if (!had_rank[1])
            c->publish = "";
        if (!had_rank[3])
            c->summaries = NULL;
        if (!had_rank[7])
            c->ready_file = NULL;
    }
    /* A shared folder is rank 0's to write; every host gathers its positions into it. */
    if (h->rank != 0 && !had_rank[5])
        c->checkpoint_writer = 0;
    return IFD_OK;
}
