/*
 * The run's watchdog (ifd_config.watchdog): a thread that samples the device's per-replica
 * counters and, when a device loop is running and no step has completed for `secs`, records
 * IFD_ETIMEDOUT from source "watchdog" in the rendezvous, which stops the run. The sentence says
 * what is starving: the replicas whose infeed ring is empty, the outfeed rings that are full, and
 * the caller's context (the daemon: how many producers are connected).
 *
 * Time outside device loops (hooks between loops) does not count, and neither does the infeed's
 * initial sleep (grace_secs) at the start of the run.
 */
#ifndef IFD_LOOP_WATCHDOG_H
#define IFD_LOOP_WATCHDOG_H

#include "core/rendezvous.h"
#include "device/device.h"

typedef struct ifd_watchdog ifd_watchdog;

typedef struct ifd_watchdog_config {
    ifd_device *dev;
    ifd_rendezvous *rv;
    double secs;                     /* > 0 */
    double grace_secs;               /* added once, at the start */
    ifd_watchdog_context_fn context; /* may be NULL */
    void *context_arg;
} ifd_watchdog_config;

/* Starts the thread. IFD_OK or IFD_ENOMEM. */
int ifd_watchdog_start(ifd_watchdog **out, const ifd_watchdog_config *cfg);
/* Stops and joins the thread and frees it; NULL is a no-op. */
void ifd_watchdog_stop(ifd_watchdog *w);

#endif
