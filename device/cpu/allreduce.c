#include "device/cpu/allreduce.h"

#include "core/log.h"
#include <infeed/error.h>

#include <stdlib.h>
#include <string.h>

int ifd_cpu_allreduce_init(ifd_cpu_allreduce *ar, int replicas, int64_t n)
{
    memset(ar, 0, sizeof *ar);
    ar->replicas = replicas;
    ar->n = n;
    ar->small = (int64_t)replicas * n <= IFD_ALLREDUCE_SMALL;
    size_t nn = (size_t)(n > 0 ? n : 1);
    ar->bufs = calloc((size_t)replicas, sizeof *ar->bufs);
    ar->call = calloc((size_t)replicas, sizeof *ar->call);
    if (ar->small)
        ar->stage = malloc(sizeof(float) * 2 * (size_t)replicas * nn);
    else
        ar->sum = malloc(sizeof(float) * nn);
    if (ar->bufs == NULL || ar->call == NULL || (ar->stage == NULL && ar->sum == NULL)) {
        free(ar->bufs);
        free(ar->call);
        free(ar->stage);
        free(ar->sum);
        return IFD_ENOMEM;
    }
    ifd_mutex_init(&ar->mu);
    ifd_cond_init(&ar->cv);
    return IFD_OK;
}

int ifd_cpu_allreduce_set_hosts(ifd_cpu_allreduce *ar, const ifd_hosts *hosts)
{
    ar->ended_host = -1;
    if (!ifd_hosts_many(hosts))
        return IFD_OK;
    size_t block = (size_t)ar->replicas * (size_t)ar->n + 1;
    ar->send = calloc(block, sizeof(float));
    ar->gathered = calloc(block * (size_t)hosts->size, sizeof(float));
    ar->total = calloc((size_t)(ar->n > 0 ? ar->n : 1), sizeof(float));
    if (ar->send == NULL || ar->gathered == NULL || ar->total == NULL)
        return IFD_ENOMEM; /* fini frees what was allocated */
    ar->hosts = hosts;
    return IFD_OK;
}

void ifd_cpu_allreduce_fini(ifd_cpu_allreduce *ar)
{
    ifd_cond_fini(&ar->cv);
    ifd_mutex_fini(&ar->mu);
    free(ar->send);
    free(ar->gathered);
    free(ar->total);
    free(ar->bufs);
    free(ar->call);
    free(ar->stage);
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

/*
 * A reusable barrier that leave/abort can break. Arrival is one atomic add; peers usually
 * arrive within microseconds of each other, so a waiter spins (IFD_SPIN_NS) before it sleeps.
 * The last arriver and a would-be sleeper order "bump generation, read sleepers" against
 * "count myself a sleeper, read generation" with sequentially consistent operations, and the
 * sleeper re-checks under the mutex the waker takes to broadcast, so no wake-up is lost.
 */
static int barrier(ifd_cpu_allreduce *ar)
{
    int64_t gen = __atomic_load_n(&ar->generation, __ATOMIC_ACQUIRE);
    int s = __atomic_load_n(&ar->state, __ATOMIC_ACQUIRE);
    if (s != IFD_OK)
        return s;
    if (__atomic_add_fetch(&ar->arrived, 1, __ATOMIC_ACQ_REL) == ar->replicas) {
        __atomic_store_n(&ar->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ar->generation, gen + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&ar->sleepers, __ATOMIC_SEQ_CST)) {
            ifd_mutex_lock(&ar->mu);
            ifd_cond_broadcast(&ar->cv);
            ifd_mutex_unlock(&ar->mu);
        }
        return IFD_OK;
    }
    barrier_wait w = {ar, gen};
    if (!ifd_spin_until(barrier_passed, &w, IFD_SPIN_NS)) {
        ifd_mutex_lock(&ar->mu);
        __atomic_add_fetch(&ar->sleepers, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&ar->generation, __ATOMIC_SEQ_CST) == gen &&
               __atomic_load_n(&ar->state, __ATOMIC_ACQUIRE) == IFD_OK)
            ifd_cond_wait(&ar->cv, &ar->mu);
        __atomic_sub_fetch(&ar->sleepers, 1, __ATOMIC_SEQ_CST);
        ifd_mutex_unlock(&ar->mu);
    }
    if (__atomic_load_n(&ar->generation, __ATOMIC_ACQUIRE) != gen)
        return IFD_OK;
    return __atomic_load_n(&ar->state, __ATOMIC_ACQUIRE);
}

static int run_small(ifd_cpu_allreduce *ar, int r)
{
    int R = ar->replicas;
    size_t n = (size_t)ar->n;
    float *set = ar->stage + (size_t)(ar->call[r]++ & 1) * (size_t)R * n;
    memcpy(set + (size_t)r * n, ar->bufs[r], sizeof(float) * n);
    int rc = barrier(ar);
    if (rc)
        return rc;
    float *out = ar->bufs[r];
    memcpy(out, set, sizeof(float) * n);
    for (int j = 1; j < R; j++) {
        const float *in = set + (size_t)j * n;
        for (size_t i = 0; i < n; i++)
            out[i] += in[i];
    }
    return IFD_OK;
}

static int run_large(ifd_cpu_allreduce *ar, int r)
{
    int R = ar->replicas;
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
    if (__atomic_load_n(&ar->state, __ATOMIC_ACQUIRE) != IFD_ESTOPPED)
        __atomic_store_n(&ar->state, state, __ATOMIC_SEQ_CST);
    ifd_cond_broadcast(&ar->cv);
    ifd_mutex_unlock(&ar->mu);
}

static int host_stopped(void *arg)
{
    ifd_cpu_allreduce *ar = arg;
    return __atomic_load_n(&ar->state, __ATOMIC_ACQUIRE) == IFD_ESTOPPED;
}

/* Replica 0, between the barriers: every host's block into gathered. IFD_OK, IFD_EEOF (a host's
 * input ended: ended_host says which), IFD_ESTOPPED or the hosts' error in host_err. */
static int host_exchange(ifd_cpu_allreduce *ar)
{
    const ifd_hosts *h = ar->hosts;
    size_t block = (size_t)ar->replicas * (size_t)ar->n + 1;
    ar->send[block - 1] = 1.0f;
    ifd_error_clear(&ar->host_err);
    int64_t t0 = ifd_clock_ns();
    int rc = h->ops->allgather(h->ctx, IFD_HOSTS_STEP, ar->send, ar->gathered,
                               block * sizeof(float), host_stopped, ar, &ar->host_err);
    ar->host_ns += ifd_clock_ns() - t0;
    ar->host_calls++;
    if (rc) {
        __atomic_store_n(&ar->hosts_done, 1, __ATOMIC_RELEASE);
        return rc;
    }
    for (int k = 0; k < h->size; k++)
        if (ar->gathered[(size_t)k * block + block - 1] != 1.0f) {
            ar->ended_host = k;
            __atomic_store_n(&ar->hosts_done, 1, __ATOMIC_RELEASE);
            return IFD_EEOF;
        }
    return IFD_OK;
}

static int run_hosts(ifd_cpu_allreduce *ar, int r)
{
    int R = ar->replicas;
    size_t n = (size_t)ar->n, block = (size_t)R * n + 1;
    if (n) /* eval mode's collective carries no vector (its buffers may be NULL) */
        memcpy(ar->send + (size_t)r * n, ar->bufs[r], sizeof(float) * n);
    int rc = barrier(ar);
    if (rc)
        return rc;
    if (r == 0) {
        rc = host_exchange(ar);
        if (rc) {
            set_state(ar, rc == IFD_EEOF ? IFD_EEOF : IFD_ESTOPPED);
            return rc;
        }
    }
    rc = barrier(ar);
    if (rc)
        return rc;
    int H = ar->hosts->size;
    int64_t lo = ar->n * r / R, hi = ar->n * (r + 1) / R;
    for (int64_t i = lo; i < hi; i++) {
        float s = ar->gathered[i];
        for (int k = 0; k < H; k++) {
            const float *hb = ar->gathered + (size_t)k * block;
            for (int j = k == 0 ? 1 : 0; j < R; j++)
                s += hb[(size_t)j * n + (size_t)i];
        }
        ar->total[i] = s;
    }
    rc = barrier(ar);
    if (rc)
        return rc;
    if (n)
        memcpy(ar->bufs[r], ar->total, sizeof(float) * n);
    return IFD_OK;
}

int ifd_cpu_allreduce_run(ifd_cpu_allreduce *ar, int r)
{
    if (ar->hosts)
        return run_hosts(ar, r);
    if (ar->replicas == 1)
        return IFD_OK;
    return ar->small ? run_small(ar, r) : run_large(ar, r);
}

void ifd_cpu_allreduce_leave(ifd_cpu_allreduce *ar)
{
    set_state(ar, IFD_EEOF);
    if (ar->hosts == NULL || __atomic_exchange_n(&ar->hosts_done, 1, __ATOMIC_ACQ_REL))
        return;
    /* The other hosts are in (or will enter) this step's collective: send them flag 0. */
    size_t block = (size_t)ar->replicas * (size_t)ar->n + 1;
    float *zeros = calloc(block, sizeof(float));
    ifd_error e;
    ifd_error_clear(&e);
    int rc = zeros ? ar->hosts->ops->allgather(ar->hosts->ctx, IFD_HOSTS_STEP, zeros, ar->gathered,
                                               block * sizeof(float), host_stopped, ar, &e)
                   : IFD_ENOMEM;
    free(zeros);
    if (rc && rc != IFD_ESTOPPED)
        IFD_LOG_WARN("host %d: cannot tell the other hosts that its input ended: %s",
                     ar->hosts->rank, ifd_error_text(&e));
}

void ifd_cpu_allreduce_abort(ifd_cpu_allreduce *ar)
{
    set_state(ar, IFD_ESTOPPED);
}
