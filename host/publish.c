#include "host/ingest_internal.h"

#include "core/log.h"
#include "core/thread.h"
#include "core/wire.h"
#include "infeed/checkpoint.h"
#include "infeed/infeed_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

/* ---- the PUB sink ----------------------------------------------------------------------- */

static int pub_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    (void)err;
    ifd_ingest *g = ctx;
    outmsg *m = malloc(sizeof *m + len + 1);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "publish");
    m->next = NULL;
    m->len = len;
    memcpy(m->json, json, len);
    m->json[len] = '\0';
    ifd_mutex_lock(&g->omu);
    if (g->olen == OUTBOX_MAX) { /* the I/O thread is behind: the oldest is not published */
        outmsg *old = g->ohead;
        g->ohead = old->next;
        g->olen--;
        g->odropped++;
        free(old);
        if (g->ohead == NULL)
            g->otail = NULL;
    }
    if (g->otail)
        g->otail->next = m;
    else
        g->ohead = m;
    g->otail = m;
    g->olen++;
    ifd_mutex_unlock(&g->omu);
    ifd_ingest_wake(g);
    return IFD_OK;
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

const ifd_sink_ops ingest_pub_ops = {
    .write = pub_write, .flush = pub_flush, .destroy = pub_destroy};

ifd_sink *ifd_ingest_pub_sink(ifd_ingest *g)
{
    return g->pub_sink;
}

void ingest_publish(ifd_ingest *g)
{
    ifd_mutex_lock(&g->omu);
    outmsg *m = g->ohead;
    g->ohead = g->otail = NULL;
    g->olen = 0;
    ifd_mutex_unlock(&g->omu);
    while (m) {
        outmsg *next = m->next;
        if (g->pub)
            zmq_send(g->pub, m->json, m->len, ZMQ_DONTWAIT); /* drops for a slow subscriber */
        free(m);
        m = next;
    }
}
