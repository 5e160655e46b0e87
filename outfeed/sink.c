/* Summary sinks: the interface, a JSON Lines file and an in-memory list. */
#include "core/thread.h"
#include <infeed/infeed.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ifd_sink {
    const ifd_sink_ops *ops;
    void *ctx;
};

int ifd_sink_create(ifd_sink **out, const ifd_sink_ops *ops, void *ctx)
{
    *out = NULL;
    if (ops == NULL || ops->write == NULL)
        return IFD_EINVAL;
    ifd_sink *s = calloc(1, sizeof *s);
    if (s == NULL)
        return IFD_ENOMEM;
    s->ops = ops;
    s->ctx = ctx;
    *out = s;
    return IFD_OK;
}

int ifd_sink_write(ifd_sink *s, const char *json, size_t len, ifd_error *err)
{
    return s->ops->write(s->ctx, json, len, err);
}

int ifd_sink_flush(ifd_sink *s, ifd_error *err)
{
    return s->ops->flush ? s->ops->flush(s->ctx, err) : IFD_OK;
}

void ifd_sink_destroy(ifd_sink *s)
{
    if (s == NULL)
        return;
    if (s->ops->destroy)
        s->ops->destroy(s->ctx);
    free(s);
}

/* ---- JSON Lines file ---- */

typedef struct jsonl_sink {
    FILE *f;
    char path[4096];
} jsonl_sink;

static int jsonl_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    jsonl_sink *js = ctx;
    if (fwrite(json, 1, len, js->f) != len || fputc('\n', js->f) == EOF || fflush(js->f) != 0)
        return ifd_error_set(err, IFD_EIO, "summaries file '%s': %s", js->path, strerror(errno));
    return IFD_OK;
}

static int jsonl_flush(void *ctx, ifd_error *err)
{
    jsonl_sink *js = ctx;
    if (fflush(js->f) != 0)
        return ifd_error_set(err, IFD_EIO, "summaries file '%s': %s", js->path, strerror(errno));
    return IFD_OK;
}

static void jsonl_destroy(void *ctx)
{
    jsonl_sink *js = ctx;
    fclose(js->f);
    free(js);
}

static const ifd_sink_ops jsonl_ops = {
    .write = jsonl_write, .flush = jsonl_flush, .destroy = jsonl_destroy};

int ifd_sink_jsonl_create(ifd_sink **out, const char *path, ifd_error *err)
{
    *out = NULL;
    jsonl_sink *js = calloc(1, sizeof *js);
    if (js == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "summaries file '%s'", path);
    snprintf(js->path, sizeof js->path, "%s", path);
    js->f = fopen(path, "a");
    if (js->f == NULL) {
        int e = errno;
        free(js);
        return ifd_error_set(err, IFD_EIO, "summaries file '%s': cannot open for appending: %s",
                             path, strerror(e));
    }
    int rc = ifd_sink_create(out, &jsonl_ops, js);
    if (rc) {
        jsonl_destroy(js);
        return ifd_error_set(err, rc, "summaries file '%s'", path);
    }
    return IFD_OK;
}

/* ---- in memory ---- */

typedef struct memory_sink {
    ifd_mutex mu;
    char **items;
    size_t n, cap;
} memory_sink;

static int memory_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    memory_sink *ms = ctx;
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "memory sink: %zu bytes", len);
    memcpy(copy, json, len);
    copy[len] = '\0';
    ifd_mutex_lock(&ms->mu);
    if (ms->n == ms->cap) {
        size_t cap = ms->cap ? 2 * ms->cap : 16;
        char **items = realloc(ms->items, cap * sizeof *items);
        if (items == NULL) {
            ifd_mutex_unlock(&ms->mu);
            free(copy);
            return ifd_error_set(err, IFD_ENOMEM, "memory sink: %zu summaries", cap);
        }
        ms->items = items;
        ms->cap = cap;
    }
    ms->items[ms->n++] = copy;
    ifd_mutex_unlock(&ms->mu);
    return IFD_OK;
}

static void memory_destroy(void *ctx)
{
    memory_sink *ms = ctx;
    for (size_t i = 0; i < ms->n; i++)
        free(ms->items[i]);
    free(ms->items);
    ifd_mutex_fini(&ms->mu);
    free(ms);
}

static const ifd_sink_ops memory_ops = {.write = memory_write, .destroy = memory_destroy};

int ifd_sink_memory_create(ifd_sink **out)
{
    *out = NULL;
    memory_sink *ms = calloc(1, sizeof *ms);
    if (ms == NULL)
        return IFD_ENOMEM;
    ifd_mutex_init(&ms->mu);
    int rc = ifd_sink_create(out, &memory_ops, ms);
    if (rc)
        memory_destroy(ms);
    return rc;
}

size_t ifd_sink_memory_count(ifd_sink *s)
{
    memory_sink *ms = s->ctx;
    ifd_mutex_lock(&ms->mu);
    size_t n = ms->n;
    ifd_mutex_unlock(&ms->mu);
    return n;
}

char *ifd_sink_memory_get(ifd_sink *s, size_t i)
{
    memory_sink *ms = s->ctx;
    char *copy = NULL;
    ifd_mutex_lock(&ms->mu);
    if (i < ms->n)
        copy = strdup(ms->items[i]);
    ifd_mutex_unlock(&ms->mu);
    return copy;
}
