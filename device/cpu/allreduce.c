#include "device/cpu/allreduce.h"

#include "infeed/error.h"

#include <stdlib.h>
#include <string.h>

int ifd_cpu_allreduce_init(ifd_cpu_allreduce *ar, int replicas, int64_t n)
{
    memset(ar, 0, sizeof *ar);
    ar->replicas = replicas;
    ar->n = n;
    ar->bufs = calloc((size_t)replicas, sizeof *ar->bufs);
    ar->sum = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (ar->bufs == NULL || ar->sum == NULL) {
        free(ar->bufs);
        free(ar->sum);
        return IFD_ENOMEM;
    }
    ifd_mutex_init(&ar->mu);
    ifd_cond_init(&ar->cv);
    return IFD_OK;
}

void ifd_cpu_allreduce_fini(ifd_cpu_allreduce *ar)
{
    ifd_cond_fini(&ar->cv);
    ifd_mutex_fini(&ar->mu);
    free(ar->bufs);
    free(ar->sum);
}

void ifd_cpu_allreduce_bind(ifd_cpu_allreduce *ar, int r, float *buf)
{
    ar->bufs[r] = buf;
}

/* A reusable barrier that can be broken by leave/abort. */
static int barrier(ifd_cpu_allreduce *ar)
{
    ifd_mutex_lock(&ar->mu);
    if (ar->state != IFD_OK) {
        int s = ar->state;
        ifd_mutex_unlock(&ar->mu);
        return s;
    }
    int64_t gen = ar->generation;
    if (++ar->arrived == ar->replicas) {
        ar->arrived = 0;
        ar->generation++;
        ifd_cond_broadcast(&ar->cv);
        ifd_mutex_unlock(&ar->mu);
        return IFD_OK;
    }
    while (gen == ar->generation && ar->state == IFD_OK)
        ifd_cond_wait(&ar->cv, &ar->mu);
    int s = gen == ar->generation ? ar->state : IFD_OK;
    ifd_mutex_unlock(&ar->mu);
    return s;
}

int ifd_cpu_allreduce_run(ifd_cpu_allreduce *ar, int r)
{
    int R = ar->replicas;
    if (R == 1)
        return IFD_OK;
    int rc = barrier(ar);
    if (rc)
        return rc;
    int64_t lo = ar->n * r / R, hi = ar->n * (r + 1) / R;
    for (int64_t i = lo; i < hi; i++) {
        float s = ar->bufs[0][i];
        for (int j = 1; j < R; j++)
            s += ar->bufs[j][i];
        ar->sum[i] = s;
    }
    rc = barrier(ar);
    if (rc)
        return rc;
    memcpy(ar->bufs[r], ar->sum, sizeof(float) * (size_t)ar->n);
    return IFD_OK;
}

static void set_state(ifd_cpu_allreduce *ar, int state)
{
    ifd_mutex_lock(&ar->mu);
    if (ar->state != IFD_ESTOPPED)
        ar->state = state;
    ifd_cond_broadcast(&ar->cv);
    ifd_mutex_unlock(&ar->mu);
}

void ifd_cpu_allreduce_leave(ifd_cpu_allreduce *ar)
{
    set_state(ar, IFD_EEOF);
}

void ifd_cpu_allreduce_abort(ifd_cpu_allreduce *ar)
{
    set_state(ar, IFD_ESTOPPED);
}

void ifd_cpu_allreduce_reset(ifd_cpu_allreduce *ar)
{
    ifd_mutex_lock(&ar->mu);
    if (ar->state == IFD_EEOF)
        ar->state = IFD_OK;
    ar->arrived = 0;
    ifd_mutex_unlock(&ar->mu);
}
