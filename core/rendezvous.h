/*
 * The error rendezvous (the seed's ErrorRendezvous). Every thread of a run reports its errors
 * here under a source name ("infeed", "outfeed", "replica 2", "hook stop_at_step"). The first
 * error triggers the stop actions once (abort the device, close the batch source, ...), so every
 * blocked thread wakes and the run ends within a bounded time.
 *
 * Errors are kept per source; the cause reported is the first *real* error: codes for which
 * ifd_error_is_secondary() is true (stopped, canceled, closed) are caused by the stop itself and
 * win only when nothing else was recorded.
 */
#ifndef IFD_CORE_RENDEZVOUS_H
#define IFD_CORE_RENDEZVOUS_H

#include <infeed/error.h>

#include <stddef.h>

#define IFD_RENDEZVOUS_MAX_ACTIONS 8

typedef struct ifd_rendezvous ifd_rendezvous;
typedef void (*ifd_stop_action)(void *arg);

int ifd_rendezvous_create(ifd_rendezvous **out);
void ifd_rendezvous_destroy(ifd_rendezvous *rv);

/* Registers an action run once, on the thread that records the first error (or calls
 * ifd_rendezvous_abort). Actions run in registration order, outside any lock, and must not
 * block: they close or abort queues and set flags. Register before the threads start. */
int ifd_rendezvous_on_stop(ifd_rendezvous *rv, ifd_stop_action fn, void *arg);

/* Records err (code != IFD_OK) from source and triggers the stop actions if none ran yet. */
void ifd_rendezvous_record_error(ifd_rendezvous *rv, const char *source, const ifd_error *err);
/* Convenience: record a code with a sentence. Returns code. */
int ifd_rendezvous_error(ifd_rendezvous *rv, const char *source, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Runs the stop actions without recording an error (an abort from outside). */
void ifd_rendezvous_abort(ifd_rendezvous *rv);
void ifd_rendezvous_record_done(ifd_rendezvous *rv, const char *source);

/* 1 once the stop has been triggered (the actions may still be running on the triggering
 * thread). */
int ifd_rendezvous_stopping(ifd_rendezvous *rv);
/* The cause: IFD_OK when no error was recorded; else the code, with *out filled as
 * "<source>: <sentence>" when out is not NULL. */
int ifd_rendezvous_cause(ifd_rendezvous *rv, ifd_error *out);
/* The error recorded for one source, IFD_OK if none. */
int ifd_rendezvous_source_error(ifd_rendezvous *rv, const char *source, ifd_error *out);

#endif
