/*
 * A replica's team: the replica thread plus helpers that share its large products and updates,
 * so that fewer replicas than cores still use every core (issue 12: one replica of an MLP on two
 * cores). The caller splits a piece of work into chunks that do not overlap (blocks of a product's
 * output rows or columns, ranges of an update); the caller and the helpers take chunks in turn
 * from one counter until none is left, and the call returns when every chunk is done.
 *
 * Chunks are claimed, not assigned: a helper whose core is busy with something else (the
 * producer, the daemon's I/O) takes fewer, and the caller never waits for a chunk nobody
 * started. A chunk's result does not depend on which thread ran it, so a run is repeatable.
 *
 * Helpers spin for IFD_SPIN_NS after their last chunk, then sleep: a team that gets no work
 * (a small model) costs no CPU.
 */
#ifndef IFD_DEVICE_CPU_TEAM_H
#define IFD_DEVICE_CPU_TEAM_H

#include <stdint.h>

typedef struct ifd_team ifd_team;

/* The most chunks one ifd_team_run takes. */
#define IFD_TEAM_MAX_CHUNKS 65535

/* Work item c of a run (0 <= c < chunks). */
typedef void (*ifd_team_fn)(void *arg, int64_t c);

/* A team of `threads` (>= 1): the caller of ifd_team_run and threads - 1 helpers, named
 * "<name>+<i>". Returns IFD_OK, IFD_EINVAL (threads < 1) or IFD_ENOMEM. */
int ifd_team_create(ifd_team **out, int threads, const char *name);
/* Stops and joins the helpers; NULL is a no-op. */
void ifd_team_destroy(ifd_team *t);
/* Threads in the team, the caller included; 1 for NULL. */
int ifd_team_threads(const ifd_team *t);
/* fn(arg, c) for every c in [0, chunks), on the caller and the helpers; returns when all are
 * done. One caller at a time. chunks <= IFD_TEAM_MAX_CHUNKS; with a NULL team or one thread, runs
 * them in order on the caller. */
void ifd_team_run(ifd_team *t, int64_t chunks, ifd_team_fn fn, void *arg);
/* Chunks the helpers (not the caller) have run so far: for tests and the log. */
int64_t ifd_team_helped(const ifd_team *t);

#endif
