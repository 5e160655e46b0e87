/*
 * The session's state, private to loop/: shared by loop/session.c (creating, configuring,
 * querying and destroying a session) and loop/session_run.c (ifd_session_run: the hooks, the
 * device loops, the hosts' agreement, the end).
 */
#ifndef IFD_LOOP_SESSION_STATE_H
#define IFD_LOOP_SESSION_STATE_H

#include "core/rendezvous.h"
#include "device/device.h"
#include "hooks/run_context.h"
#include "intake/infeed_thread.h"
#include "loop/loop_tuner.h"
#include "loop/stop_relay.h"
#include "outfeed/outfeed_thread.h"

#define MAX_HOOKS 16

struct ifd_session {
    ifd_config cfg;
    ifd_program program;
    ifd_batch_source src;
    ifd_device *dev;
    ifd_rendezvous *rv;
    ifd_infeed *infeed;
    ifd_outfeed *outfeed;
    ifd_summary_writer writer;
    ifd_hook hooks[MAX_HOOKS];
    int nhooks;
    ifd_prediction_sink pred_sinks[IFD_MAX_PREDICTION_SINKS];
    int npred_sinks;
    ifd_tensor_sink tensor_sinks[IFD_MAX_TENSOR_SINKS];
    int ntensor_sinks;
    ifd_run_context ctx;
    int stop_host; /* atomic: -1, or the host whose stop was asked (this one's rank: 0 alone) */
    ifd_stop_relay relay;
    int ended_by_eof; /* the last loop ended because the input ended (or was closed) */
    /* Loop lengths chosen by the session (cfg.loop_kind auto or seconds; not in eval, which runs
     * one loop): the tuner, and each replica's loop clock at the last loop's end. */
    int tuned;
    ifd_loop_tuner tuner;
    int64_t *clock_run, *clock_first;
    int64_t last_end_ns; /* when the last loop returned; 0 before the first */
    int ran;
    ifd_end_reason reason;
    char message[256];
    ifd_watchdog_context_fn watchdog_context;
    void *watchdog_context_arg;
};

/* The host whose stop was asked (this host's rank, or another's that the relay brought), or -1.
 * Any thread. */
static inline int ifd_session_stop_host(ifd_session *s)
{
    return __atomic_load_n(&s->stop_host, __ATOMIC_ACQUIRE);
}

#endif
