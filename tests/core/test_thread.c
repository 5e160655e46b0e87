/*
 * The thread wrappers (core/thread.h): names set before a thread runs, timed waits on condition
 * variables and the deadlines they end at, mutexes, the clock and sleep, and ifd_spin_until.
 *
 * Counts and times are random. The seed comes from IFD_TEST_SEED when set, else from the clock,
 * and every failure message names it so that a failing run can be repeated.
 */
#include "tests/util/testutil.h"

#include "core/rng.h"
#include "core/thread.h"
#include "tests/util/wait.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct name_ctx {
    atomic_int ready;
    atomic_int go;
    char name[32];
} name_ctx;

static void *name_main(void *arg)
{
    name_ctx *c = arg;
    /* Our own name, first thing; then stay alive until the starter has read it from outside. */
    pthread_getname_np(pthread_self(), c->name, sizeof c->name);
    atomic_store(&c->ready, 1);
    while (!atomic_load(&c->go))
        ifd_sleep_ns(MS / 10);
    return NULL;
}

START_TEST(test_thread_names)
{
    static const struct {
        const char *given, *kept;
    } k[] = {{"ifd-infeed", "ifd-infeed"},
             {"x", "x"},
             {"exactly-15-char", "exactly-15-char"},
             {"a-name-longer-than-fifteen", "a-name-longer-t"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        name_ctx c;
        memset(&c, 0, sizeof c);
        atomic_init(&c.go, 0);
        atomic_init(&c.ready, 0);
        ifd_thread t;
        ck_assert_int_eq(ifd_thread_start(&t, k[i].given, name_main, &c), IFD_OK);
        ck_assert_int_eq(t.started, 1);
        while (!atomic_load(&c.ready))
            ifd_sleep_ns(MS / 10);
        char from_outside[32] = "";
        ck_assert_int_eq(pthread_getname_np(t.tid, from_outside, sizeof from_outside), 0);
        ck_assert_str_eq(from_outside, k[i].kept);
        atomic_store(&c.go, 1);
        ifd_thread_join(&t);
        ck_assert_str_eq(c.name, k[i].kept);
        ck_assert_int_eq(t.started, 0);
        ifd_thread_join(&t); /* joined twice: a no-op */
    }
    ifd_thread never;
    memset(&never, 0, sizeof never);
    ifd_thread_join(&never);
}
END_TEST

START_TEST(test_cond_wait_until_timeout)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_mutex m;
    ifd_cond c;
    ifd_mutex_init(&m);
    ifd_cond_init(&c);
    for (int i = 0; i < 4; i++) {
        int64_t wait = rand_between(&rng, 5, 60) * MS;
        ifd_mutex_lock(&m);
        int64_t t0 = ifd_clock_ns(), deadline = t0 + wait;
        int rc;
        do /* spurious wake-ups are allowed */
            rc = ifd_cond_wait_until(&c, &m, deadline);
        while (rc == 0 && ifd_clock_ns() < deadline);
        int64_t back = ifd_clock_ns();
        ifd_mutex_unlock(&m);
        RASSERT(rc == ETIMEDOUT, "wait_until returned %d, expected ETIMEDOUT", rc);
        /* The order of the events: the deadline passed, then the wait returned. */
        RASSERT(back >= deadline, "timed out %" PRId64 " ns before its deadline", deadline - back);
        RASSERT(back - t0 < wait + 5000 * MS,
                "timed out after %" PRId64 " ns, deadline %" PRId64 " ns", back - t0, wait);
    }
    /* A deadline in the past times out at once. */
    int64_t past[] = {0, ifd_clock_ns() - 1, ifd_clock_ns() - 1000 * MS};
    for (size_t i = 0; i < sizeof past / sizeof past[0]; i++) {
        ifd_mutex_lock(&m);
        int64_t t0 = ifd_clock_ns();
        int rc = ifd_cond_wait_until(&c, &m, past[i]);
        int64_t el = ifd_clock_ns() - t0;
        ifd_mutex_unlock(&m);
        ck_assert_int_eq(rc, ETIMEDOUT);
        ck_assert_msg(el < 1000 * MS, "a past deadline waited %" PRId64 " ns", el);
    }
    ifd_cond_fini(&c);
    ifd_mutex_fini(&m);
}
END_TEST

typedef struct wake_ctx {
    ifd_mutex m;
    ifd_cond c;
    int ready;
    atomic_int waiter; /* the waiting thread's kernel id */
    atomic_int woken;  /* the waiter is past its wait */
    int seen_blocked;  /* tu_thread_blocked's answer before the signal */
} wake_ctx;

/* Signals once the waiter sleeps in its timed wait (a handshake, not a guess of time). */
static void *waker_main(void *arg)
{
    wake_ctx *w = arg;
    w->seen_blocked = tu_thread_blocked(&w->waiter, &w->woken, 10000 * MS);
    ifd_mutex_lock(&w->m);
    w->ready = 1;
    ifd_cond_signal(&w->c);
    ifd_mutex_unlock(&w->m);
    return NULL;
}

START_TEST(test_cond_wait_until_woken)
{
    wake_ctx w;
    ifd_mutex_init(&w.m);
    ifd_cond_init(&w.c);
    w.ready = 0;
    atomic_init(&w.waiter, tu_self_tid());
    atomic_init(&w.woken, 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, waker_main, &w), 0);
    int64_t t0 = ifd_clock_ns(), deadline = t0 + 20000 * MS;
    ifd_mutex_lock(&w.m);
    int rc = 0;
    while (!w.ready && rc == 0)
        rc = ifd_cond_wait_until(&w.c, &w.m, deadline);
    int ready = w.ready;
    ifd_mutex_unlock(&w.m);
    atomic_store(&w.woken, 1);
    int64_t el = ifd_clock_ns() - t0;
    pthread_join(t, NULL);
    ck_assert_msg(w.seen_blocked == 1, "the waiter was not seen asleep before the signal (%d)",
                  w.seen_blocked);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(ready, 1);
    ck_assert_msg(el < 10000 * MS, "woken after %" PRId64 " ns", el);
    ifd_cond_fini(&w.c);
    ifd_mutex_fini(&w.m);
}
END_TEST

typedef struct count_ctx {
    ifd_mutex m;
    int64_t n;
    int iters;
} count_ctx;

static void *counter_main(void *arg)
{
    count_ctx *c = arg;
    for (int i = 0; i < c->iters; i++) {
        ifd_mutex_lock(&c->m);
        c->n++;
        ifd_mutex_unlock(&c->m);
    }
    return NULL;
}

START_TEST(test_mutex_and_clock)
{
    ifd_rng rng;
    seed_rng(&rng);
    count_ctx c = {.n = 0, .iters = (int)rand_between(&rng, 1000, 20000)};
    ifd_mutex_init(&c.m);
    int n = (int)rand_between(&rng, 2, 8);
    ifd_thread t[8];
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(ifd_thread_start(&t[i], "counter", counter_main, &c), IFD_OK);
    for (int i = 0; i < n; i++)
        ifd_thread_join(&t[i]);
    RASSERT(c.n == (int64_t)n * c.iters, "count %" PRId64 ", expected %" PRId64, c.n,
            (int64_t)n * c.iters);
    ifd_mutex_fini(&c.m);

    /* The clock is monotonic and sleep sleeps at least as asked. */
    int64_t prev = ifd_clock_ns();
    for (int i = 0; i < 1000; i++) {
        int64_t now = ifd_clock_ns();
        ck_assert_int_ge(now, prev);
        prev = now;
    }
    int64_t ns = rand_between(&rng, 1, 30) * MS;
    int64_t until = ifd_clock_ns() + ns;
    ifd_sleep_ns(ns);
    int64_t back = ifd_clock_ns();
    RASSERT(back >= until, "woke %" PRId64 " ns before the end of a sleep of %" PRId64 " ns",
            until - back, ns);

    /* The wall clock (summaries' "time") is the system's: between two readings of time(),
     * which counts whole seconds, and with a fraction of a second. */
    double before = (double)time(NULL), wall = 0.0;
    int fractional = 0;
    for (int i = 0; i < 1000 && !fractional; i++) {
        wall = ifd_wall_seconds();
        fractional = wall != (double)(int64_t)wall;
    }
    double after = (double)time(NULL) + 1.0;
    RASSERT(wall >= before && wall < after, "ifd_wall_seconds %.3f, time() from %.0f to %.0f", wall,
            before, after);
    ck_assert(fractional);
}
END_TEST

/* A flag and how often ifd_spin_until asked for it. */
typedef struct spin_flag {
    atomic_int up;
    atomic_int polls;
} spin_flag;

static int flag_ready(void *arg)
{
    spin_flag *f = arg;
    atomic_fetch_add(&f->polls, 1);
    return atomic_load(&f->up);
}

/* Raises the flag once the spinner has found it down twice: it is raised while spinning. */
static void *raise_while_spinning(void *arg)
{
    spin_flag *f = arg;
    int64_t deadline = ifd_clock_ns() + 10000 * MS;
    while (atomic_load(&f->polls) < 2 && ifd_clock_ns() < deadline)
        sched_yield();
    atomic_store(&f->up, 1);
    return NULL;
}

/* ifd_spin_until: at once when ready, 0 after about the budget when never ready, and it sees a
 * flag raised by another thread while spinning. */
START_TEST(test_spin_until)
{
    ifd_rng rng;
    seed_rng(&rng);
    spin_flag flag;
    atomic_init(&flag.up, 1);
    atomic_init(&flag.polls, 0);
    ck_assert_int_eq(ifd_spin_until(flag_ready, &flag, 0), 1);
    ck_assert_int_eq(ifd_spin_until(flag_ready, &flag, 1000 * MS), 1);

    atomic_store(&flag.up, 0);
    int64_t budget = rand_between(&rng, 1, 20) * MS;
    int64_t t0 = ifd_clock_ns();
    int rc = ifd_spin_until(flag_ready, &flag, budget);
    int64_t back = ifd_clock_ns();
    ck_assert_int_eq(rc, 0);
    /* The order of the events: the budget ran out, then the spin gave up. */
    RASSERT(back >= t0 + budget,
            "gave up %" PRId64 " ns before its budget of %" PRId64 " ns ran out",
            t0 + budget - back, budget);
    RASSERT(back - t0 < budget + 2000 * MS, "spun %" PRId64 " ns, budget %" PRId64, back - t0,
            budget);

    atomic_store(&flag.polls, 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, raise_while_spinning, &flag), 0);
    rc = ifd_spin_until(flag_ready, &flag, 10000 * MS);
    pthread_join(t, NULL);
    ck_assert_int_eq(rc, 1);
    RASSERT(atomic_load(&flag.polls) > 2, "the flag was up before the spin began (%d polls)",
            atomic_load(&flag.polls));
}
END_TEST

/* ifd_spin_until gives its core to a thread queued behind it on the same core (the thread it
 * waits for, on a machine with more runnable threads than cores). Made certain with real-time
 * scheduling: the spinner and the thread that raises the flag run SCHED_FIFO at one priority on
 * one CPU, where the raiser runs only when the spinner yields or blocks; a spinner that never
 * yields spins its whole budget and finds the flag down. Needs CAP_SYS_NICE (and real-time time
 * in this cgroup): without, the test says so and checks nothing. */
START_TEST(test_spin_until_yields_its_core)
{
    cpu_set_t was, one;
    ck_assert_int_eq(sched_getaffinity(0, sizeof was, &was), 0);
    int cpu = sched_getcpu();
    ck_assert_int_ge(cpu, 0);
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0);
    struct sched_param fifo = {.sched_priority = sched_get_priority_min(SCHED_FIFO)}, other = {0};
    int rc = pthread_setschedparam(pthread_self(), SCHED_FIFO, &fifo);
    if (rc != 0) {
        fprintf(stderr, "test_spin_until_yields_its_core: not checked: SCHED_FIFO refused (%s)\n",
                strerror(rc));
        ck_assert_int_eq(sched_setaffinity(0, sizeof was, &was), 0);
        return;
    }
    spin_flag flag;
    atomic_init(&flag.up, 0);
    atomic_init(&flag.polls, 0);
    pthread_t t; /* inherits the policy, the priority and the CPU; raises the flag once the
                  * spinner has found it down twice (it may run first, as under TSan, whose
                  * pthread_create waits for the thread: it yields until then) */
    ck_assert_int_eq(pthread_create(&t, NULL, raise_while_spinning, &flag), 0);
    int64_t budget = 1000 * MS;
    rc = ifd_spin_until(flag_ready, &flag, budget);
    int polls = atomic_load(&flag.polls);
    ck_assert_int_eq(pthread_setschedparam(pthread_self(), SCHED_OTHER, &other), 0);
    pthread_join(t, NULL);
    ck_assert_int_eq(sched_setaffinity(0, sizeof was, &was), 0);
    RASSERT(rc == 1,
            "the raiser never ran on the spinner's CPU %d while it spun %" PRId64 " ns (%d polls)",
            cpu, budget, polls);
    RASSERT(polls > 2, "the flag was up before the spin began (%d polls)", polls);
}
END_TEST

START_TEST(test_cond_wait_until_past_deadlines)
{
    /* Any deadline in the past, negative included, times out at once instead of failing. */
    ifd_mutex m;
    ifd_cond c;
    ifd_mutex_init(&m);
    ifd_cond_init(&c);
    int64_t deadlines[] = {-1, -1000000000ll * 5 - 7, 0, ifd_clock_ns() - 1};
    ifd_mutex_lock(&m);
    for (size_t i = 0; i < sizeof deadlines / sizeof deadlines[0]; i++)
        ck_assert_int_eq(ifd_cond_wait_until(&c, &m, deadlines[i]), ETIMEDOUT);
    ifd_mutex_unlock(&m);
    ifd_cond_fini(&c);
    ifd_mutex_fini(&m);
}
END_TEST

static void *report_own_name(void *arg)
{
    /* The very first thing the thread does: its name must already be set. */
    pthread_getname_np(pthread_self(), arg, 16);
    return NULL;
}

START_TEST(test_thread_named_before_it_runs)
{
    for (int i = 0; i < 20; i++) {
        char seen[16] = "";
        char want[16];
        snprintf(want, sizeof want, "ifd-early%d", i);
        ifd_thread t;
        ck_assert_int_eq(ifd_thread_start(&t, want, report_own_name, seen), IFD_OK);
        ifd_thread_join(&t);
        ck_assert_str_eq(seen, want);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("thread");
    TCase *tc = tu_tcase(s, "thread", 30);
    tcase_add_test(tc, test_thread_names);
    tcase_add_test(tc, test_cond_wait_until_timeout);
    tcase_add_test(tc, test_cond_wait_until_woken);
    tcase_add_test(tc, test_mutex_and_clock);
    tcase_add_test(tc, test_spin_until);
    tcase_add_test(tc, test_spin_until_yields_its_core);
    tcase_add_test(tc, test_cond_wait_until_past_deadlines);
    tcase_add_test(tc, test_thread_named_before_it_runs);
    return tu_run_suite(s);
}
