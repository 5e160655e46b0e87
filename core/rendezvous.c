#include "core/rendezvous.h"

#include "core/log.h"
#include "core/thread.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rv_entry {
    char source[48];
    ifd_error err;
    int done;
    long order; /* when the error was recorded; 0 for none */
} rv_entry;

struct ifd_rendezvous {
    ifd_mutex mu;
    rv_entry *entries; /* grows as sources report */
    int nentries, cap;
    long next_order;
    int triggered;
    struct {
        ifd_stop_action fn;
        void *arg;
    } actions[IFD_RENDEZVOUS_MAX_ACTIONS];
    int nactions;
};

int ifd_rendezvous_create(ifd_rendezvous **out)
{
    ifd_rendezvous *rv = calloc(1, sizeof *rv);
    *out = rv;
    if (rv == NULL)
        return IFD_ENOMEM;
    rv->cap = 16;
    rv->entries = calloc((size_t)rv->cap, sizeof *rv->entries);
    if (rv->entries == NULL) {
        free(rv);
        *out = NULL;
        return IFD_ENOMEM;
    }
    ifd_mutex_init(&rv->mu);
    rv->next_order = 1;
    return IFD_OK;
}

void ifd_rendezvous_destroy(ifd_rendezvous *rv)
{
    if (rv == NULL)
        return;
    ifd_mutex_fini(&rv->mu);
    free(rv->entries);
    free(rv);
}

int ifd_rendezvous_on_stop(ifd_rendezvous *rv, ifd_stop_action fn, void *arg)
{
    ifd_mutex_lock(&rv->mu);
    int rc = IFD_OK;
    if (rv->nactions == IFD_RENDEZVOUS_MAX_ACTIONS) {
        rc = IFD_ENOMEM;
    } else {
        rv->actions[rv->nactions].fn = fn;
        rv->actions[rv->nactions].arg = arg;
        rv->nactions++;
    }
    ifd_mutex_unlock(&rv->mu);
    return rc;
}

/* Called with the lock held. */
static rv_entry *entry_for(ifd_rendezvous *rv, const char *source)
{
    for (int i = 0; i < rv->nentries; i++)
        if (strcmp(rv->entries[i].source, source) == 0)
            return &rv->entries[i];
    if (rv->nentries == rv->cap) {
        rv_entry *more = realloc(rv->entries, sizeof *more * (size_t)rv->cap * 2);
        if (more == NULL) /* out of memory: keep the error under the last source's name */
            return &rv->entries[rv->nentries - 1];
        memset(more + rv->cap, 0, sizeof *more * (size_t)rv->cap);
        rv->entries = more;
        rv->cap *= 2;
    }
    rv_entry *e = &rv->entries[rv->nentries++];
    snprintf(e->source, sizeof e->source, "%s", source);
    return e;
}

static void trigger(ifd_rendezvous *rv)
{
    ifd_mutex_lock(&rv->mu);
    int first = !rv->triggered;
    rv->triggered = 1;
    int n = rv->nactions;
    ifd_mutex_unlock(&rv->mu);
    if (!first)
        return;
    /* Registration happens before any thread starts, so the array is stable here. */
    for (int i = 0; i < n; i++)
        rv->actions[i].fn(rv->actions[i].arg);
}

void ifd_rendezvous_record_error(ifd_rendezvous *rv, const char *source, const ifd_error *err)
{
    if (err == NULL || err->code == IFD_OK)
        return;
    ifd_mutex_lock(&rv->mu);
    rv_entry *e = entry_for(rv, source);
    /* Keep a source's first real error; a later real error replaces only a secondary one. */
    if (e->order == 0 ||
        (ifd_error_is_secondary(e->err.code) && !ifd_error_is_secondary(err->code))) {
        e->err = *err;
        e->order = rv->next_order++;
    }
    ifd_mutex_unlock(&rv->mu);
    if (ifd_error_is_secondary(err->code))
        IFD_LOG_DEBUG("%s: %s", source, ifd_error_text(err));
    else
        IFD_LOG_ERROR("%s: %s", source, ifd_error_text(err));
    trigger(rv);
}

int ifd_rendezvous_error(ifd_rendezvous *rv, const char *source, int code, const char *fmt, ...)
{
    ifd_error e = {.code = code}; /* a sentence about no key */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    ifd_rendezvous_record_error(rv, source, &e);
    return code;
}

void ifd_rendezvous_abort(ifd_rendezvous *rv)
{
    trigger(rv);
}

void ifd_rendezvous_record_done(ifd_rendezvous *rv, const char *source)
{
    ifd_mutex_lock(&rv->mu);
    entry_for(rv, source)->done = 1;
    ifd_mutex_unlock(&rv->mu);
}

int ifd_rendezvous_stopping(ifd_rendezvous *rv)
{
    ifd_mutex_lock(&rv->mu);
    int t = rv->triggered;
    ifd_mutex_unlock(&rv->mu);
    return t;
}

int ifd_rendezvous_cause(ifd_rendezvous *rv, ifd_error *out)
{
    ifd_mutex_lock(&rv->mu);
    const rv_entry *best = NULL;
    for (int i = 0; i < rv->nentries; i++) {
        const rv_entry *e = &rv->entries[i];
        if (e->order == 0)
            continue;
        if (best == NULL) {
            best = e;
            continue;
        }
        int es = ifd_error_is_secondary(e->err.code), bs = ifd_error_is_secondary(best->err.code);
        if ((bs && !es) || (es == bs && e->order < best->order))
            best = e;
    }
    int code = IFD_OK;
    if (best) {
        code = best->err.code;
        if (out) {
            ifd_error_clear(out);
            out->code = code;
            snprintf(out->msg, sizeof out->msg, "%s: %.*s", best->source,
                     (int)(sizeof out->msg - sizeof best->source - 3), ifd_error_text(&best->err));
        }
    } else if (out) {
        ifd_error_clear(out);
    }
    ifd_mutex_unlock(&rv->mu);
    return code;
}

int ifd_rendezvous_source_error(ifd_rendezvous *rv, const char *source, ifd_error *out)
{
    ifd_mutex_lock(&rv->mu);
    int code = IFD_OK;
    for (int i = 0; i < rv->nentries; i++) {
        if (strcmp(rv->entries[i].source, source) == 0 && rv->entries[i].order) {
            code = rv->entries[i].err.code;
            if (out)
                *out = rv->entries[i].err;
        }
    }
    if (code == IFD_OK && out)
        ifd_error_clear(out);
    ifd_mutex_unlock(&rv->mu);
    return code;
}
