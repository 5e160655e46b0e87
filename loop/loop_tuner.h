/*
 * Loop lengths chosen for the user (ifd_config.loop_kind IFD_LOOP_AUTO or IFD_LOOP_SECONDS;
 * docs/design.md, "Loop lengths"). The tuner only computes: the session measures each loop and
 * tells it, so tests drive it with numbers of their own (no clock inside).
 *
 * A loop of n steps costs n x s + c: s the time of a steady step (on the slowest replica), c the
 * cost of a loop boundary (everything between two loops' steady steps: the session's hooks and
 * signals, the per-loop collective on several hosts, waking the replicas, the infeed refilling
 * the rings for the loop's first step). A loop of n >= 2 steps gives one sample of each:
 *
 *   s = (run_ns - first_ns) / (n - 1)   run_ns: the replica's loop, first_ns: its first step
 *   c = cycle_ns - n x s                cycle_ns: from the end of the previous loop to the end
 *                                       of this one (this loop's run, the boundary before it)
 *
 * and a loop of one step a high sample of s (run_ns: the step and its refill), no c.
 *
 * so c is measured where it happens, not fitted. Over the last IFD_TUNER_WINDOW samples the
 * step's estimate is their median and the boundary's their second largest: a high estimate
 * (a sample of c carries the noise of two steps, which can be larger than c itself when a step
 * is long), yet one slow boundary, such as a checkpoint's write, moves neither. The next length
 * is then:
 *
 *   auto:     the least n whose boundary costs at most IFD_TUNER_COST of the loop (half of the
 *             1 % promised, for the noise of the estimates): n = c (1 - f) / (f s), at least 2
 *             (a loop of one step has no steady step to measure), capped so that n x s stays
 *             within max_loop_seconds (a stop, a summary on cuda and a checkpoint come within it),
 *             and kept when the current length is between that n and twice it (so that lengths
 *             do not flicker with the noise);
 *   seconds:  n = loop_secs / s, kept within 10 %.
 *
 * At least 1; the first loop runs 1 step and the second 2 (the first sample of s); a length grows
 * to at most IFD_TUNER_GROWTH times the longest loop so far, and shrinks at once. The session
 * caps the result further: the stop-at-step hook's distance to the last step, the checkpoint
 * hook's next multiple, and on several hosts the least length any host proposes.
 */
#ifndef IFD_LOOP_LOOP_TUNER_H
#define IFD_LOOP_LOOP_TUNER_H

#include "infeed/infeed.h"

#define IFD_TUNER_WINDOW 5
#define IFD_TUNER_COST 0.005
#define IFD_TUNER_GROWTH 8

typedef struct ifd_loop_tuner {
    ifd_loop_kind kind; /* IFD_LOOP_AUTO or IFD_LOOP_SECONDS */
    double target_ns;   /* seconds: a loop's time */
    double max_ns;      /* auto: a loop's longest */
    int64_t n;          /* the length of the last loop observed (0: none yet) */
    int64_t most;       /* the longest loop observed (growth is counted from it) */
    int64_t loops;      /* loops observed */
    double s[IFD_TUNER_WINDOW], c[IFD_TUNER_WINDOW];
    int ns, nc; /* samples held, up to IFD_TUNER_WINDOW */
    int is, ic; /* where the next sample goes */
} ifd_loop_tuner;

/* kind IFD_LOOP_AUTO (max_secs the bound) or IFD_LOOP_SECONDS (secs the target). */
void ifd_loop_tuner_init(ifd_loop_tuner *t, ifd_loop_kind kind, double secs, double max_secs);
/* The next loop's length, >= 1. */
int64_t ifd_loop_tuner_next(const ifd_loop_tuner *t);
/* A loop of n steps ran (the length the session actually used): run_ns, first_ns, cycle_ns as
 * above (cycle_ns <= 0: unknown, as for the first loop). */
void ifd_loop_tuner_observe(ifd_loop_tuner *t, int64_t n, int64_t run_ns, int64_t first_ns,
                            int64_t cycle_ns);
/* The current estimates (0 before their first sample): a steady step's and a boundary's ns. */
double ifd_loop_tuner_step_ns(const ifd_loop_tuner *t);
double ifd_loop_tuner_boundary_ns(const ifd_loop_tuner *t);

#endif
