/*
 * The stop relay of a train or eval run on several hosts (docs/multihost.md, "Stop"): a thread
 * that makes one small all-reduce on the STOP channel every IFD_STOP_RELAY_PERIOD_NS while the
 * run goes, carrying whether a stop was asked on this host and whether this host's loops are
 * over. A stop asked on any host so reaches every host within a round or two, even a host whose
 * session thread is inside a loop that waits for input: that host never reaches the loop
 * boundary's collective, where stops otherwise agree, and without the relay it would never learn
 * of the stop. The relay sets the session's stop (*stop_host: the host that asked); the embedding
 * program sees it with ifd_session_stop_requested (infeedd then closes its input after its
 * grace, so that a loop waiting for input ends on every host at the same step).
 *
 * The thread ends once every host's loops are over (ifd_stop_relay_finish on each host), or when
 * this host's run stops for an error (its collective gives up: the hosts cannot go on together,
 * and the embedding program ends the job, as for any error on several hosts).
 *
 * The struct is embedded in the session, so that ifd_session_request_stop may poke it from any
 * thread at any time while the session exists.
 */
#ifndef IFD_LOOP_STOP_RELAY_H
#define IFD_LOOP_STOP_RELAY_H

#include "core/rendezvous.h"
#include "core/thread.h"
#include <infeed/hosts.h>

/* Between rounds: a stop asked elsewhere reaches this host within about one period. */
#define IFD_STOP_RELAY_PERIOD_NS (20 * 1000000LL)

typedef struct ifd_stop_relay {
    const ifd_hosts *hosts;
    ifd_rendezvous *rv;
    int *stop_host; /* atomic: -1, or the rank of the host that asked; the relay sets it from -1 */
    ifd_mutex mu;
    ifd_cond cv;
    int poked;    /* under mu: start the next round now */
    int finished; /* under mu: this host's loops are over */
    ifd_thread thread;
    int64_t rounds; /* atomic: rounds completed (tests) */
} ifd_stop_relay;

void ifd_stop_relay_init(ifd_stop_relay *r, const ifd_hosts *hosts, ifd_rendezvous *rv,
                         int *stop_host);
/* Starts the thread. IFD_OK or IFD_ENOMEM. */
int ifd_stop_relay_start(ifd_stop_relay *r);
/* A stop was asked on this host: the next round starts at once. Any thread; never blocks on a
 * collective. */
void ifd_stop_relay_poke(ifd_stop_relay *r);
/* This host's loops are over: the rounds go on until every host's are (or the run stops for an
 * error), then the thread is joined. A no-op when the thread never started. */
void ifd_stop_relay_finish(ifd_stop_relay *r);
void ifd_stop_relay_fini(ifd_stop_relay *r);

#endif
