#include "core/thread.h"

#include <infeed/error.h>

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what, int rc)
{
    fprintf(stderr, "infeed: fatal: %s failed: %s\n", what, strerror(rc));
    abort();
}

void ifd_mutex_init(ifd_mutex *m)
{
    int rc = pthread_mutex_init(&m->m, NULL);
    if (rc)
        die("pthread_mutex_init", rc);
}

void ifd_mutex_fini(ifd_mutex *m)
{
    pthread_mutex_destroy(&m->m);
}

void ifd_mutex_lock(ifd_mutex *m)
{
    int rc = pthread_mutex_lock(&m->m);
    if (rc)
        die("pthread_mutex_lock", rc);
}

void ifd_mutex_unlock(ifd_mutex *m)
{
    int rc = pthread_mutex_unlock(&m->m);
    if (rc)
        die("pthread_mutex_unlock", rc);
}

void ifd_cond_init(ifd_cond *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&c->c, &a);
    pthread_condattr_destroy(&a);
    if (rc)
        die("pthread_cond_init", rc);
}

void ifd_cond_fini(ifd_cond *c)
{
    pthread_cond_destroy(&c->c);
}

void ifd_cond_wait(ifd_cond *c, ifd_mutex *m)
{
    int rc = pthread_cond_wait(&c->c, &m->m);
    if (rc)
        die("pthread_cond_wait", rc);
}

int ifd_cond_wait_until(ifd_cond *c, ifd_mutex *m, int64_t deadline_ns)
{
    if (deadline_ns < 0)
        deadline_ns = 0; /* long past: times out at once */
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    int rc = pthread_cond_timedwait(&c->c, &m->m, &ts);
    if (rc && rc != ETIMEDOUT)
        die("pthread_cond_timedwait", rc);
    return rc;
}

void ifd_cond_signal(ifd_cond *c)
{
    pthread_cond_signal(&c->c);
}

void ifd_cond_broadcast(ifd_cond *c)
{
    pthread_cond_broadcast(&c->c);
}

typedef struct thread_boot {
    char name[16];
    void *(*fn)(void *);
    void *arg;
} thread_boot;

/* The new thread names itself before it runs fn, so that its first log line carries the name. */
static void *thread_trampoline(void *p)
{
    thread_boot boot = *(thread_boot *)p;
    free(p);
    pthread_setname_np(pthread_self(), boot.name);
    return boot.fn(boot.arg);
}

int ifd_thread_start(ifd_thread *t, const char *name, void *(*fn)(void *), void *arg)
{
    t->started = 0;
    thread_boot *boot = malloc(sizeof *boot);
    if (boot == NULL)
        return IFD_ENOMEM;
    snprintf(boot->name, sizeof boot->name, "%s", name);
    boot->fn = fn;
    boot->arg = arg;
    if (pthread_create(&t->tid, NULL, thread_trampoline, boot) != 0) {
        free(boot);
        return IFD_ENOMEM;
    }
    t->started = 1;
    return IFD_OK;
}

void ifd_thread_join(ifd_thread *t)
{
    if (!t->started)
        return;
    int rc = pthread_join(t->tid, NULL);
    if (rc)
        die("pthread_join", rc);
    t->started = 0;
}

int64_t ifd_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double ifd_wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ifd_sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int ifd_spin_until(int (*ready)(void *arg), void *arg, int64_t budget_ns)
{
    int64_t start = 0;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (ready(arg))
                return 1;
            ifd_cpu_relax();
        }
        int64_t now = ifd_clock_ns();
        if (start == 0)
            start = now;
        else if (now - start >= budget_ns)
            return ready(arg);
        else if (now - start >= IFD_SPIN_PAUSE_NS)
            sched_yield(); /* a thread waiting for this core (maybe the one spun for) runs now */
    }
}
