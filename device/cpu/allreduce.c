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

typedef struct barrier_wait {
    ifd_cpu_allreduce *ar;
    int64_t gen;
} barrier_wait;

static int barrier_passed(void *arg)
{
    barrier_wait *w = arg;
    return __atomic_load_n(&w->ar->generation, __ATOMIC_ACQUIRE) != w->gen ||
           __atomic_load_n(&w->ar->state, __ATOMIC_ACQUIRE) != IFD_OK;
}

/* A reusable barrier that can be broken by leave/abort. Peers usually arrive within
 * microseconds of each other, so a waiter spins briefly before it sleeps. */
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
        __atomic_store_n(&ar->generation, gen + 1, __ATOMIC_RELEASE);
        if (ar->sleepers)
            ifd_cond_broadcast(&ar->cv);
        ifd_mutex_unlock(&ar->mu);
        return IFD_OK;
    }
    ifd_mutex_unlock(&ar->mu);
    barrier_wait w = {ar, gen};
    ifd_spin_until(barrier_passed, &w, IFD_SPIN_NS);
    ifd_mutex_lock(&ar->mu);
    ar->sleepers++;
    while (gen == ar->generation && ar->state == IFD_OK)
        ifd_cond_wait(&ar->cv, &ar->mu);
    ar->sleepers--;
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
        __atomic_store_n(&ar->state, state, __ATOMIC_RELEASE);
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
        __atomic_store_n(&ar->state, IFD_OK, __ATOMIC_RELEASE);
    ar->arrived = 0;
    ifd_mutex_unlock(&ar->mu);
}
