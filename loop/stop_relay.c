#include "loop/stop_relay.h"

#include "core/log.h"

#include <string.h>

void ifd_stop_relay_init(ifd_stop_relay *r, const ifd_hosts *hosts, ifd_rendezvous *rv,
                         int *stop_host)
{
    memset(r, 0, sizeof *r);
    r->hosts = hosts;
    r->rv = rv;
    r->stop_host = stop_host;
    ifd_mutex_init(&r->mu);
    ifd_cond_init(&r->cv);
}

void ifd_stop_relay_fini(ifd_stop_relay *r)
{
    ifd_stop_relay_finish(r);
    ifd_cond_fini(&r->cv);
    ifd_mutex_fini(&r->mu);
}

static int giving_up(void *arg)
{
    return ifd_rendezvous_stopping(arg);
}

static void *relay_main(void *arg)
{
    ifd_stop_relay *r = arg;
    const ifd_hosts *h = r->hosts;
    for (;;) {
        ifd_mutex_lock(&r->mu);
        int finished = r->finished;
        r->poked = 0;
        ifd_mutex_unlock(&r->mu);
        /* [0]: 1 + the rank of a host that was asked to stop itself (the highest, as the loop
         * boundary's collective names it), 0: none; [1]: 1 while some host's loops go on */
        int asked = __atomic_load_n(r->stop_host, __ATOMIC_ACQUIRE);
        int64_t v[2] = {asked == h->rank ? h->rank + 1 : 0, finished ? 0 : 1};
        ifd_error e;
        ifd_error_clear(&e);
        int rc = h->ops->allreduce_i64(h->ctx, IFD_HOSTS_STOP, v, 2, IFD_HOSTS_MAX, giving_up,
                                       r->rv, &e);
        if (rc) {
            if (rc != IFD_ESTOPPED)
                ifd_rendezvous_record_error(r->rv, "hosts", &e);
            break;
        }
        __atomic_add_fetch(&r->rounds, 1, __ATOMIC_RELAXED);
        int none = -1;
        if (v[0] > 0 && __atomic_compare_exchange_n(r->stop_host, &none, (int)(v[0] - 1), 0,
                                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            IFD_LOG_INFO("stop requested on host %lld: this host stops too", (long long)(v[0] - 1));
        if (v[1] == 0)
            break;
        ifd_mutex_lock(&r->mu);
        int64_t deadline = ifd_clock_ns() + IFD_STOP_RELAY_PERIOD_NS;
        while (!r->poked && ifd_clock_ns() < deadline)
            ifd_cond_wait_until(&r->cv, &r->mu, deadline);
        ifd_mutex_unlock(&r->mu);
    }
    return NULL;
}

int ifd_stop_relay_start(ifd_stop_relay *r)
{
    return ifd_thread_start(&r->thread, "ifd-stop-relay", relay_main, r);
}

void ifd_stop_relay_poke(ifd_stop_relay *r)
{
    ifd_mutex_lock(&r->mu);
    r->poked = 1;
    ifd_cond_signal(&r->cv);
    ifd_mutex_unlock(&r->mu);
}

void ifd_stop_relay_finish(ifd_stop_relay *r)
{
    ifd_mutex_lock(&r->mu);
    r->finished = 1;
    r->poked = 1;
    ifd_cond_signal(&r->cv);
    ifd_mutex_unlock(&r->mu);
    ifd_thread_join(&r->thread);
}
