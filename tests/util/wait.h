/* Waiting for events in tests, never for a fixed time: a flag raised by another thread, and a
 * thread blocked in the kernel (a pop on an empty queue, a wait on a condition variable). */
#ifndef IFD_TEST_WAIT_H
#define IFD_TEST_WAIT_H

#include <stdatomic.h>
#include <stdint.h>

/* How long a thread seen asleep must then stay unfinished to count as blocked. */
#define TU_BLOCK_CHECK_NS (INT64_C(50) * 1000000)

/* Waits up to timeout_ns for *flag to become nonzero (polling every millisecond). Returns its
 * value. */
int tu_wait_flag(atomic_int *flag, int64_t timeout_ns);

/* The kernel's id of the calling thread: a thread publishes it for tu_wait_blocked. */
int tu_self_tid(void);

/* Whether the thread that publishes its kernel id in *tid (0 until it does) is blocked: seen
 * asleep in the kernel twice in a row, then, TU_BLOCK_CHECK_NS later, still not finished (*done
 * still 0; done may be NULL). Waiting for the sleep first means that a thread slow to start is not
 * mistaken for a blocked one. Returns 1 when blocked, 0 when it finished instead, -1 when it was
 * not seen asleep within timeout_ns. Fails no test: for helper threads. */
int tu_thread_blocked(atomic_int *tid, atomic_int *done, int64_t timeout_ns);

/* As tu_thread_blocked with 10 s, failing the test (naming what) unless the thread blocks. */
void tu_wait_blocked(atomic_int *tid, atomic_int *done, const char *what);

#endif
