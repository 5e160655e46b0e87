/*
 * Thin pthread wrappers. A failed lock or unlock is a bug, not a condition to handle: it aborts.
 * Condition variables are always waited on in a loop by the caller.
 */
#ifndef IFD_CORE_THREAD_H
#define IFD_CORE_THREAD_H

#include <pthread.h>
#include <stdint.h>

typedef struct ifd_mutex {
    pthread_mutex_t m;
} ifd_mutex;
/* A mutex with static storage, ready without ifd_mutex_init. */
#define IFD_MUTEX_INITIALIZER                                                                      \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER                                                                  \
    }

typedef struct ifd_cond {
    pthread_cond_t c;
} ifd_cond;

typedef struct ifd_thread {
    pthread_t tid;
    int started;
} ifd_thread;

void ifd_mutex_init(ifd_mutex *m);
void ifd_mutex_fini(ifd_mutex *m);
void ifd_mutex_lock(ifd_mutex *m);
void ifd_mutex_unlock(ifd_mutex *m);

/* Uses CLOCK_MONOTONIC for timed waits. */
void ifd_cond_init(ifd_cond *c);
void ifd_cond_fini(ifd_cond *c);
void ifd_cond_wait(ifd_cond *c, ifd_mutex *m);
/* Waits until the monotonic deadline (ns, ifd_clock_ns). Returns 0 when woken, ETIMEDOUT at the
 * deadline. */
int ifd_cond_wait_until(ifd_cond *c, ifd_mutex *m, int64_t deadline_ns);
void ifd_cond_signal(ifd_cond *c);
void ifd_cond_broadcast(ifd_cond *c);

/* Starts fn(arg) on a new thread named name (at most 15 characters are kept). Returns IFD_OK or
 * IFD_ENOMEM. */
int ifd_thread_start(ifd_thread *t, const char *name, void *(*fn)(void *), void *arg);
/* Joins a started thread; a no-op for one never started. */
void ifd_thread_join(ifd_thread *t);

/*
 * Spin-then-block: before sleeping on a condition variable, a waiter polls a cheap lock-free
 * hint for up to IFD_SPIN_NS, so that a hand-off between two running threads costs no futex
 * wake-up. The budget is short enough that a waiter with nothing coming soon still sleeps almost
 * at once and gives its core away.
 *
 * For the first IFD_SPIN_PAUSE_NS it polls with a pause instruction only (a short wait costs no
 * system call); after that it also yields its core (sched_yield) between polls. On a machine with
 * more runnable threads than cores the thread it waits for, or the daemon's I/O, may be queued
 * behind it on the same core: two replicas on one core otherwise cost a whole IFD_SPIN_NS a barrier
 * (bench/README.md, "bench_outfeed"). With nothing else runnable the yield returns at once (a
 * fraction of a microsecond).
 */
#define IFD_SPIN_NS 50000
#define IFD_SPIN_PAUSE_NS 2000

static inline void ifd_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Calls ready(arg) until it returns non-zero (returns 1) or the budget is spent (returns 0),
 * yielding its core between calls after IFD_SPIN_PAUSE_NS. */
int ifd_spin_until(int (*ready)(void *arg), void *arg, int64_t budget_ns);

/* Monotonic clock in nanoseconds. */
int64_t ifd_clock_ns(void);
/* Wall-clock time (CLOCK_REALTIME) in seconds since the epoch: the "time" of summaries. */
double ifd_wall_seconds(void);
void ifd_sleep_ns(int64_t ns);

#endif
