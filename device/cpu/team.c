/* A replica's team of threads: see team.h. */
#include "device/cpu/team.h"

#include "core/thread.h"
#include <infeed/infeed.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

/*
 * The job word packs the run's generation (high 32 bits), its chunk count (16 bits) and the next
 * chunk to claim (low 16 bits), so that a claim is one compare-and-swap that fails for a run that
 * has since ended: a helper that looked at run g and was descheduled cannot take a chunk of run
 * g + 1 with run g's function. The caller writes fn and arg before it publishes the word
 * (release) and only after every chunk of the previous run is done (acquire on done), so a helper
 * reads them after a successful claim and nobody writes them meanwhile.
 */
#define JOB_GEN(v) ((v) >> 32)
#define JOB_CHUNKS(v) (((v) >> 16) & 0xFFFFu)
#define JOB_NEXT(v) ((v)&0xFFFFu)

struct ifd_team {
    int threads;
    ifd_thread *helpers; /* threads - 1 */
    uint64_t job;        /* atomic */
    ifd_team_fn fn;
    void *arg;
    int64_t done;   /* atomic: chunks of the current run finished */
    int64_t helped; /* atomic: chunks helpers ran, over the team's life */
    int stop;       /* atomic */
    int sleepers;   /* atomic; changed under mu */
    ifd_mutex mu;
    ifd_cond cv;
};

/* Takes the next chunk of the current run into *c; 0 when none is left. *seen: the job word
 * last read. */
static int claim(ifd_team *t, int64_t *c, uint64_t *seen)
{
    uint64_t v = __atomic_load_n(&t->job, __ATOMIC_ACQUIRE);
    for (;;) {
        *seen = v;
        if (JOB_NEXT(v) >= JOB_CHUNKS(v))
            return 0;
        if (__atomic_compare_exchange_n(&t->job, &v, v + 1, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            *c = (int64_t)JOB_NEXT(v);
            return 1;
        }
    }
}

/* Runs chunks until none is left. A helper counts each in `helped` before it counts it done, so
 * that the count is up to date when ifd_team_run returns. */
static void work(ifd_team *t, uint64_t *seen, int helper)
{
    int64_t c;
    while (claim(t, &c, seen)) {
        t->fn(t->arg, c);
        if (helper)
            __atomic_add_fetch(&t->helped, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&t->done, 1, __ATOMIC_RELEASE);
    }
}

typedef struct gen_wait {
    ifd_team *t;
    uint64_t gen;
} gen_wait;

static int new_run(void *arg)
{
    const gen_wait *w = arg;
    return JOB_GEN(__atomic_load_n(&w->t->job, __ATOMIC_ACQUIRE)) != w->gen ||
           __atomic_load_n(&w->t->stop, __ATOMIC_ACQUIRE);
}

/* A helper: take chunks; when none is left, spin for the next run a moment, then sleep. The
 * caller's "publish the run, read sleepers" and a would-be sleeper's "count myself, read the
 * run" are sequentially consistent, and the sleeper re-checks under the mutex the caller takes
 * to broadcast, so no wake-up is lost (the all-reduce barrier's scheme). */
static void *helper_main(void *arg)
{
    ifd_team *t = arg;
    for (;;) {
        uint64_t seen;
        work(t, &seen, 1);
        gen_wait w = {t, JOB_GEN(seen)};
        if (!ifd_spin_until(new_run, &w, IFD_SPIN_NS)) {
            ifd_mutex_lock(&t->mu);
            __atomic_add_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
            while (JOB_GEN(__atomic_load_n(&t->job, __ATOMIC_SEQ_CST)) == w.gen &&
                   !__atomic_load_n(&t->stop, __ATOMIC_SEQ_CST))
                ifd_cond_wait(&t->cv, &t->mu);
            __atomic_sub_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
            ifd_mutex_unlock(&t->mu);
        }
        if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE))
            return NULL;
    }
}

/* Wakes sleeping helpers for a run of `chunks`: as many as there are chunks besides the
 * caller's first, not the whole team, for a short run on a large team. */
static void wake(ifd_team *t, int64_t chunks)
{
    if (__atomic_load_n(&t->sleepers, __ATOMIC_SEQ_CST)) {
        ifd_mutex_lock(&t->mu);
        if (chunks - 1 >= t->threads - 1)
            ifd_cond_broadcast(&t->cv);
        else
            for (int64_t i = 0; i < chunks - 1; i++)
                ifd_cond_signal(&t->cv);
        ifd_mutex_unlock(&t->mu);
    }
}

int ifd_team_create(ifd_team **out, int threads, const char *name)
{
    *out = NULL;
    if (threads < 1)
        return IFD_EINVAL;
    ifd_team *t = calloc(1, sizeof *t);
    if (t == NULL)
        return IFD_ENOMEM;
    t->threads = threads;
    ifd_mutex_init(&t->mu);
    ifd_cond_init(&t->cv);
    if (threads > 1) {
        t->helpers = calloc((size_t)threads - 1, sizeof *t->helpers);
        if (t->helpers == NULL) {
            ifd_team_destroy(t);
            return IFD_ENOMEM;
        }
    }
    for (int i = 1; i < threads; i++) {
        char tname[32];
        snprintf(tname, sizeof tname, "%s+%d", name, i);
        if (ifd_thread_start(&t->helpers[i - 1], tname, helper_main, t)) {
            ifd_team_destroy(t);
            return IFD_ENOMEM;
        }
    }
    *out = t;
    return IFD_OK;
}

void ifd_team_destroy(ifd_team *t)
{
    if (t == NULL)
        return;
    __atomic_store_n(&t->stop, 1, __ATOMIC_SEQ_CST);
    ifd_mutex_lock(&t->mu);
    ifd_cond_broadcast(&t->cv);
    ifd_mutex_unlock(&t->mu);
    for (int i = 0; t->helpers && i < t->threads - 1; i++)
        ifd_thread_join(&t->helpers[i]);
    free(t->helpers);
    ifd_cond_fini(&t->cv);
    ifd_mutex_fini(&t->mu);
    free(t);
}

int ifd_team_threads(const ifd_team *t)
{
    return t ? t->threads : 1;
}

int64_t ifd_team_helped(const ifd_team *t)
{
    return t ? __atomic_load_n(&t->helped, __ATOMIC_RELAXED) : 0;
}

void ifd_team_run(ifd_team *t, int64_t chunks, ifd_team_fn fn, void *arg)
{
    if (t == NULL || t->threads == 1 || chunks <= 1 || chunks > IFD_TEAM_MAX_CHUNKS) {
        for (int64_t c = 0; c < chunks; c++)
            fn(arg, c);
        return;
    }
    t->fn = fn;
    t->arg = arg;
    __atomic_store_n(&t->done, 0, __ATOMIC_RELAXED);
    uint64_t gen = JOB_GEN(__atomic_load_n(&t->job, __ATOMIC_RELAXED)) + 1;
    __atomic_store_n(&t->job, (gen << 32) | ((uint64_t)chunks << 16), __ATOMIC_SEQ_CST);
    wake(t, chunks);
    uint64_t seen;
    work(t, &seen, 0);
    /* What is left runs on a helper now; it was claimed, so it is under way. */
    for (int spins = 0; __atomic_load_n(&t->done, __ATOMIC_ACQUIRE) < chunks; spins++) {
        if (spins < 4096)
            ifd_cpu_relax();
        else
            sched_yield(); /* a helper descheduled mid-chunk: let it have the core */
    }
}
