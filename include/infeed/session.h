/*
 * The session: one run of a program on a backend's replicas, fed by a batch source, reporting to
 * sinks, its loops decided by hooks. Part of the runtime API (<infeed/infeed.h> includes it);
 * implemented in loop/session.c. Threading: driven by one thread; ifd_session_request_stop and
 * the other functions marked "any thread" may be called from any thread.
 */
#ifndef IFD_SESSION_H
#define IFD_SESSION_H

#include <infeed/batches.h>
#include <infeed/error.h>
#include <infeed/hooks.h>
#include <infeed/program.h>
#include <infeed/run_config.h>
#include <infeed/sinks.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the session ------------------------------------------------------------------------- */

typedef struct ifd_session ifd_session;

typedef enum {
    IFD_END_NONE = 0,
    IFD_END_LAST_STEP,   /* reached the last step */
    IFD_END_INPUT_ENDED, /* the batch source ended before the last step */
    IFD_END_STOPPED,     /* ifd_session_request_stop or a hook asked */
    IFD_END_ERROR,
    IFD_END_EARLY_STOPPING /* a hook's stop reason began with "early_stopping" (infeedd's
                              --early-stopping) */
} ifd_end_reason;
const char *ifd_end_reason_name(ifd_end_reason r);

/* Validates cfg, opens the backend and initialises the parameters from cfg->seed. In train
 * mode, installs the stop-at-step hook from steps/last_step. src is borrowed. */
int ifd_session_create(ifd_session **out, const ifd_config *cfg, ifd_batch_source src,
                       ifd_error *err);
/* Before ifd_session_run. The hook is copied; its destroy runs in ifd_session_destroy. */
int ifd_session_add_hook(ifd_session *s, const ifd_hook *hook);
/* Before ifd_session_run. Borrowed; at most IFD_MAX_SINKS. */
int ifd_session_add_sink(ifd_session *s, ifd_sink *sink);
/* Before ifd_session_run, predict mode. Copied; at most IFD_MAX_PREDICTION_SINKS. */
int ifd_session_add_prediction_sink(ifd_session *s, const ifd_prediction_sink *sink);
/* Train and eval: every step's outfeed tensors go to sink too (include/infeed/sinks.h); at most
 * IFD_MAX_TENSOR_SINKS (IFD_EINVAL). */
int ifd_session_add_tensor_sink(ifd_session *s, const ifd_tensor_sink *sink);
/* Runs until the last step, the end of the input, a stop request or an error. Returns IFD_OK
 * when the run ended well (including the input ending early), else the first real error, with
 * err filled as "<source>: <sentence>". Every thread is joined before it returns. Once only.
 * The batch source is left as it is: a producer still blocked pushing into an ifd_batch_queue
 * stays blocked until the queue is closed, so close it after the run before joining such a
 * producer. */
int ifd_session_run(ifd_session *s, ifd_error *err);
/* Any thread: end the run at the end of the current loop. When the loop then ends early because
 * the input ended, the end reason is still "stopped". */
void ifd_session_request_stop(ifd_session *s);
/* Any thread: whether a stop was asked, here (ifd_session_request_stop) or, in train and eval on
 * several hosts, on another host (the stop relay brings it within tens of milliseconds, even
 * while this host's loop waits for input: docs/multihost.md). *host (when not NULL) is the rank
 * of the host that asked (0 on one host), -1 when none did. A program that closes its input when
 * a stop waits too long for it (infeedd: a second) should do so for either. */
int ifd_session_stop_requested(ifd_session *s, int *host);
/* Any thread: end the run now, as an error (IFD_ECANCELED, source "abort", with why as its
 * sentence) unless a real error came first. Every thread wakes; ifd_session_run returns soon. */
void ifd_session_abort(ifd_session *s, const char *why);
/* Writes what the watchdog's sentence should add about the input ("2 producers connected, 1
 * ended") into buf (len bytes). Called on the watchdog's thread; must not block. */
typedef void (*ifd_watchdog_context_fn)(void *arg, char *buf, size_t len);
/* Before ifd_session_run: the watchdog (cfg->watchdog) asks fn for context when it fires. */
int ifd_session_set_watchdog_context(ifd_session *s, ifd_watchdog_context_fn fn, void *arg);

/* A replica's rings as they are now: shards staged and not yet taken by a step, step records the
 * outfeed has not taken yet, and both capacities. */
typedef struct ifd_ring_depths {
    int64_t infeed, infeed_capacity;
    int64_t outfeed, outfeed_capacity;
} ifd_ring_depths;
/* Any thread, while the session exists. IFD_EINVAL for a replica out of range. */
int ifd_session_ring_depths(ifd_session *s, int replica, ifd_ring_depths *out);

/* Any thread: 0-based index of the loop running now (or the number of loops run). */
int64_t ifd_session_loop_index(ifd_session *s);
/* Any thread: whether the infeed thread is blocked waiting for the batch source now. When it
 * is, *replica (when not NULL) is the replica whose batch it waits for (per-host-v2: replica i
 * for the i-th batch of a step; per-core: the replica whose stream is empty, the one starving
 * the step), or -1 when the batch is for every replica (per-host, broadcast); *since_ns (when
 * not NULL) is when the wait began, in CLOCK_MONOTONIC nanoseconds. */
int ifd_session_infeed_waiting(ifd_session *s, int *replica, int64_t *since_ns);
int64_t ifd_session_global_step(ifd_session *s);
ifd_end_reason ifd_session_end_reason(ifd_session *s);
const ifd_program *ifd_session_program(ifd_session *s);
/* Copies replica's parameters (program->nparam_floats floats) to host memory. Not while
 * ifd_session_run is in a device loop. */
int ifd_session_read_params(ifd_session *s, int replica, float *out);
/* Registers [p, p + len) of host memory (page-aligned, mapped at least for reading) with the
 * session's device, so that batches in it (flagged IFD_BATCH_PINNED) are copied to the device
 * without a host copy (cuda: cudaHostRegister, read-only); unregister it before it is unmapped,
 * and before the session is destroyed. IFD_ENOTSUP when the backend has no use for it (cpu).
 * Any thread. */
int ifd_session_register_host_memory(ifd_session *s, void *p, size_t len, ifd_error *err);
void ifd_session_unregister_host_memory(ifd_session *s, void *p);
void ifd_session_destroy(ifd_session *s);

#ifdef __cplusplus
}
#endif

#endif
