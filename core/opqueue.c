#include "core/opqueue.h"

#include "core/log.h"
#include "core/queue.h"
#include "core/thread.h"
#include <infeed/error.h>

#include <stdio.h>
#include <stdlib.h>

/* The session sends one signal per loop and waits for the loop, so a handful of slots is
 * plenty; the queue is bounded like every queue here. */
#define OPQ_DEPTH 16

struct ifd_opq {
    char name[32];
    ifd_queue *signals;
    ifd_thread thread;
    ifd_opq_fn fn;
    void *arg;
    int signal_once;
    int has_signaled; /* only touched by the sending thread */
    int joined;
    int saw_stop; /* only touched by the controller thread */
};

static void *opq_main(void *p)
{
    ifd_opq *q = p;
    IFD_LOG_DEBUG("%s: starting", q->name);
    q->fn(q, q->arg);
    int64_t n;
    while (!q->saw_stop && ifd_opq_next(q, &n))
        IFD_LOG_DEBUG("%s: dropping signal %lld after the body ended", q->name, (long long)n);
    IFD_LOG_DEBUG("%s: received STOP, exiting", q->name);
    return NULL;
}

int ifd_opq_start(ifd_opq **out, const char *name, ifd_opq_fn fn, void *arg, int signal_once)
{
    *out = NULL;
    ifd_opq *q = calloc(1, sizeof *q);
    if (q == NULL)
        return IFD_ENOMEM;
    snprintf(q->name, sizeof q->name, "%s", name);
    q->fn = fn;
    q->arg = arg;
    q->signal_once = signal_once;
    int rc = ifd_queue_create(&q->signals, sizeof(int64_t), OPQ_DEPTH);
    if (rc)
        goto fail_queue;
    rc = ifd_thread_start(&q->thread, q->name, opq_main, q);
    if (rc)
        goto fail_thread;
    *out = q;
    return IFD_OK;

fail_thread:
    ifd_queue_destroy(q->signals);
fail_queue:
    free(q);
    return rc;
}

int ifd_opq_signal(ifd_opq *q, int64_t iterations)
{
    if (iterations <= 0)
        return IFD_EINVAL;
    if (q->signal_once && q->has_signaled)
        return IFD_OK;
    q->has_signaled = 1;
    return ifd_queue_push(q->signals, &iterations);
}

int ifd_opq_next(ifd_opq *q, int64_t *iterations)
{
    int64_t v;
    if (q->saw_stop)
        return 0;
    if (ifd_queue_pop(q->signals, &v) != IFD_OK || v == IFD_SIGNAL_STOP) {
        q->saw_stop = 1;
        return 0;
    }
    *iterations = v;
    return 1;
}

void ifd_opq_join(ifd_opq *q)
{
    if (q == NULL || q->joined)
        return;
    IFD_LOG_DEBUG("shutting down %s", q->name);
    int64_t stop = IFD_SIGNAL_STOP;
    if (ifd_queue_push(q->signals, &stop) != IFD_OK)
        ifd_queue_close(q->signals);
    ifd_thread_join(&q->thread);
    q->joined = 1;
}

void ifd_opq_destroy(ifd_opq *q)
{
    if (q == NULL)
        return;
    ifd_opq_join(q);
    ifd_queue_destroy(q->signals);
    free(q);
}

const char *ifd_opq_name(const ifd_opq *q)
{
    return q->name;
}
