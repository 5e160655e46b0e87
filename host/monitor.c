#include "host/monitor.h"

#include "core/log.h"
#include "core/thread.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/eventfd.h>

#define HEAP_EVERY_NS 200000000LL    /* heap checks */
#define HEAP_WARN_NS 10000000000LL   /* heap warnings, at most one per this */
#define FREE_TRIM ((size_t)64 << 20) /* free heap above this is given back */

struct ifd_monitor {
    size_t heap_bound;
    int heap_over; /* atomic */
    ifd_mutex spare_mu;
    int spare; /* under spare_mu */
    ifd_thread thread;
    int started;
    int stop; /* atomic */
    int wake; /* eventfd: destroy wakes the thread's poll with it, so exit does not wait for it */
    int64_t heap_checked_ns, heap_warned_ns;
};

int ifd_monitor_create(ifd_monitor **out, int max_connections, size_t heap_bound, ifd_error *err)
{
    ifd_monitor *m = calloc(1, sizeof *m);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "monitor");
    ifd_mutex_init(&m->spare_mu);
    m->heap_bound = heap_bound;
    m->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    m->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m->wake < 0) {
        int e = errno;
        ifd_monitor_destroy(m);
        return ifd_error_set(err, IFD_ENOMEM, "monitor: eventfd: %s", strerror(e));
    }
    IFD_LOG_INFO("at most %d connections a socket; memory bound %zu MiB (docs/protocol.md)",
                 max_connections, heap_bound >> 20);
    *out = m;
    return IFD_OK;
}

int ifd_monitor_heap_over(ifd_monitor *m)
{
    return m && __atomic_load_n(&m->heap_over, __ATOMIC_RELAXED);
}

int ifd_monitor_release_spare(ifd_monitor *m)
{
    ifd_mutex_lock(&m->spare_mu);
    int had = m->spare >= 0;
    if (had)
        close(m->spare);
    m->spare = -1;
    ifd_mutex_unlock(&m->spare_mu);
    return had;
}

void ifd_monitor_restore_spare(ifd_monitor *m)
{
    ifd_mutex_lock(&m->spare_mu);
    if (m->spare < 0)
        m->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ifd_mutex_unlock(&m->spare_mu);
}

static void check_heap(ifd_monitor *m, int64_t now)
{
    if (now - m->heap_checked_ns < HEAP_EVERY_NS)
        return;
    m->heap_checked_ns = now;
    struct mallinfo2 mi = mallinfo2();
    if (mi.fordblks > FREE_TRIM)
        malloc_trim(0);
    size_t used = mi.uordblks + mi.hblkhd;
    int over = m->heap_bound && used > m->heap_bound;
    __atomic_store_n(&m->heap_over, over, __ATOMIC_RELAXED);
    if (over && (m->heap_warned_ns == 0 || now - m->heap_warned_ns >= HEAP_WARN_NS)) {
        m->heap_warned_ns = now;
        IFD_LOG_WARN("memory: %zu MiB of heap in use, above the bound of %zu MiB "
                     "(docs/protocol.md): peers are holding back the last frames of messages, "
                     "which libzmq buffers without limit; connections that are not producers "
                     "are closed",
                     used >> 20, m->heap_bound >> 20);
    }
}

static void *monitor_main(void *arg)
{
    ifd_monitor *m = arg;
    struct pollfd pfd = {.fd = m->wake, .events = POLLIN};
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        poll(&pfd, 1, (int)(HEAP_EVERY_NS / 1000000));
        ifd_monitor_restore_spare(m);
        check_heap(m, ifd_clock_ns());
    }
    return NULL;
}

int ifd_monitor_start(ifd_monitor *m, ifd_error *err)
{
    int rc = ifd_thread_start(&m->thread, "ifd-monitor", monitor_main, m);
    if (rc)
        return ifd_error_set(err, rc, "monitor: cannot start its thread");
    m->started = 1;
    return IFD_OK;
}

void ifd_monitor_destroy(ifd_monitor *m)
{
    if (m == NULL)
        return;
    if (m->started) {
        __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
        uint64_t one = 1;
        if (write(m->wake, &one, sizeof one) < 0) /* never full: a stale poll ends in 200 ms */
            IFD_LOG_DEBUG("monitor: cannot wake its thread: %s", strerror(errno));
        ifd_thread_join(&m->thread);
    }
    if (m->spare >= 0)
        close(m->spare);
    if (m->wake >= 0)
        close(m->wake);
    ifd_mutex_fini(&m->spare_mu);
    free(m);
}
