/*
 * A controller thread fed by a signal queue (the seed's _OpQueueContext). The session sends each
 * loop's iteration count, a positive integer; STOP ends the thread. The thread body calls
 * ifd_opq_next until it returns 0.
 *
 * If the body returns early (an error), the wrapper keeps reading signals until STOP so that the
 * sender never blocks on a full signal queue and join always works.
 *
 * signal_once: only the first ifd_opq_signal is queued, later ones are dropped (the seed's
 * _OpSignalOnceQueueContext, used by predict mode whose infeed runs until a stopping signal).
 */
#ifndef IFD_CORE_OPQUEUE_H
#define IFD_CORE_OPQUEUE_H

#include <stdint.h>

#define IFD_SIGNAL_STOP (-2)

typedef struct ifd_opq ifd_opq;
typedef void (*ifd_opq_fn)(ifd_opq *q, void *arg);

/* Starts the thread. Returns IFD_OK or IFD_ENOMEM. */
int ifd_opq_start(ifd_opq **out, const char *name, ifd_opq_fn fn, void *arg, int signal_once);
/* From the session: the next loop runs iterations (> 0) steps. IFD_EINVAL for iterations <= 0. */
int ifd_opq_signal(ifd_opq *q, int64_t iterations);
/* From the thread body: 1 and *iterations for the next loop, 0 on STOP. */
int ifd_opq_next(ifd_opq *q, int64_t *iterations);
/* Sends STOP and joins the thread. Safe to call once the thread is started; idempotent. */
void ifd_opq_join(ifd_opq *q);
/* Joins if needed, then frees. NULL is a no-op. */
void ifd_opq_destroy(ifd_opq *q);
const char *ifd_opq_name(const ifd_opq *q);

#endif
