#include "loop/watchdog.h"

#include "core/log.h"
#include "core/thread.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SOURCE "watchdog"
#define MAX_LISTED 8 /* replicas named in one list; the rest are counted */

struct ifd_watchdog {
    ifd_watchdog_config cfg;
    ifd_thread thread;
    ifd_mutex mu;
    ifd_cond cv;
    int quit;
};

/* "replica 2", "replicas 0 and 3", "replicas 0, 1 and 2", "replicas 0, 1, ... 7 and 5 more". */
static void list_replicas(char *buf, size_t len, const int *idx, int n)
{
    size_t off = (size_t)snprintf(buf, len, "replica%s", n == 1 ? "" : "s");
    int shown = n > MAX_LISTED ? MAX_LISTED : n;
    for (int i = 0; i < shown && off < len; i++) {
        const char *sep = i == 0 ? " " : (i == n - 1 ? " and " : ", ");
        off += (size_t)snprintf(buf + off, len - off, "%s%d", sep, idx[i]);
    }
    if (n > shown && off < len)
        snprintf(buf + off, len - off, " and %d more", n - shown);
}

/* The sentence: how long, at which step, which infeeds are empty, which outfeeds are full, and
 * the caller's context. */
static void describe(ifd_watchdog *w, const ifd_device_stats *st, int n, char *msg, size_t len)
{
    int *empty = calloc((size_t)n, sizeof *empty), *full = calloc((size_t)n, sizeof *full);
    int nempty = 0, nfull = 0;
    for (int r = 0; empty && full && r < n; r++) {
        if (st[r].infeed_len == 0)
            empty[nempty++] = r;
        if (st[r].outfeed_cap > 0 && st[r].outfeed_len >= st[r].outfeed_cap)
            full[nfull++] = r;
    }
    char in[192], out[256], who[128];
    if (nempty == 0) {
        snprintf(in, sizeof in, "no replica's infeed is empty");
    } else {
        list_replicas(who, sizeof who, empty, nempty);
        snprintf(in, sizeof in, "the infeed%s of %s %s empty (waiting for input)",
                 nempty == 1 ? "" : "s", who, nempty == 1 ? "is" : "are");
    }
    if (nfull == 0) {
        snprintf(out, sizeof out, "no outfeed ring is full");
    } else {
        list_replicas(who, sizeof who, full, nfull);
        snprintf(out, sizeof out,
                 "the outfeed ring%s of %s %s full (%lld records: the outfeed thread is not "
                 "draining %s)",
                 nfull == 1 ? "" : "s", who, nfull == 1 ? "is" : "are",
                 (long long)st[full[0]].outfeed_cap, nfull == 1 ? "it" : "them");
    }
    char extra[160] = "";
    if (w->cfg.context) {
        w->cfg.context(w->cfg.context_arg, extra, sizeof extra);
        extra[sizeof extra - 1] = '\0';
    }
    snprintf(msg, len, "no step completed for %g s (global step %lld): %s; %s%s%s", w->cfg.secs,
             (long long)ifd_device_global_step(w->cfg.dev), in, out, extra[0] ? "; " : "", extra);
    free(empty);
    free(full);
}

static void *watchdog_main(void *arg)
{
    ifd_watchdog *w = arg;
    int n = ifd_device_replicas(w->cfg.dev);
    ifd_device_stats *st = calloc((size_t)n, sizeof *st);
    int64_t limit = (int64_t)(w->cfg.secs * 1e9);
    int64_t period = limit / 10;
    period = period < 10 * 1000000LL ? 10 * 1000000LL : period > 250000000LL ? 250000000LL : period;
    int64_t grace_end = ifd_clock_ns() + (int64_t)(w->cfg.grace_secs * 1e9);
    int64_t since = grace_end, last_steps = -1;
    ifd_mutex_lock(&w->mu);
    while (!w->quit && st) {
        ifd_mutex_unlock(&w->mu);
        int64_t steps = 0;
        int busy = 0;
        for (int r = 0; r < n; r++) {
            ifd_device_stats_get(w->cfg.dev, r, &st[r]);
            steps += st[r].steps;
            busy |= st[r].in_loop;
        }
        int64_t now = ifd_clock_ns();
        /* Progress, or no loop to run: the clock starts again (not before the grace ends). */
        if (steps != last_steps || !busy)
            since = now > grace_end ? now : grace_end;
        last_steps = steps;
        if (busy && now - since >= limit) {
            char msg[IFD_ERROR_MSG_MAX];
            describe(w, st, n, msg, sizeof msg);
            ifd_rendezvous_error(w->cfg.rv, SOURCE, IFD_ETIMEDOUT, "%s", msg);
            ifd_mutex_lock(&w->mu);
            break;
        }
        ifd_mutex_lock(&w->mu);
        int64_t deadline = ifd_clock_ns() + period;
        while (!w->quit && ifd_clock_ns() < deadline)
            ifd_cond_wait_until(&w->cv, &w->mu, deadline);
    }
    ifd_mutex_unlock(&w->mu);
    free(st);
    return NULL;
}

int ifd_watchdog_start(ifd_watchdog **out, const ifd_watchdog_config *cfg)
{
    *out = NULL;
    ifd_watchdog *w = calloc(1, sizeof *w);
    if (w == NULL)
        return IFD_ENOMEM;
    w->cfg = *cfg;
    ifd_mutex_init(&w->mu);
    ifd_cond_init(&w->cv);
    int rc = ifd_thread_start(&w->thread, "ifd-watchdog", watchdog_main, w);
    if (rc) {
        ifd_cond_fini(&w->cv);
        ifd_mutex_fini(&w->mu);
        free(w);
        return rc;
    }
    IFD_LOG_DEBUG("watchdog: a run with no step for %g s ends", cfg->secs);
    *out = w;
    return IFD_OK;
}

void ifd_watchdog_stop(ifd_watchdog *w)
{
    if (w == NULL)
        return;
    ifd_mutex_lock(&w->mu);
    w->quit = 1;
    ifd_cond_broadcast(&w->cv);
    ifd_mutex_unlock(&w->mu);
    ifd_thread_join(&w->thread);
    ifd_cond_fini(&w->cv);
    ifd_mutex_fini(&w->mu);
    free(w);
}
