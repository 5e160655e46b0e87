#include "tests/util/live_session.h"

#include "tests/util/testutil.h"

#include <stdlib.h>
#include <time.h>

/* Summary i of the memory sink, parsed (the caller decrefs it). */
json_t *tu_summary_at(ifd_sink *sink, size_t i)
{
    char *line = ifd_sink_memory_get(sink, i);
    json_t *j = line ? json_loads(line, 0, NULL) : NULL;
    ck_assert_msg(j != NULL, "summary %zu: '%s'", i, line ? line : "(none)");
    free(line);
    return j;
}

static void *live_run(void *arg)
{
    tu_live *l = arg;
    l->rc = ifd_session_run(l->s, &l->err);
    return NULL;
}

void tu_live_start(tu_live *l, const ifd_hook *hook)
{
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&l->prog, l->cfg.program, &l->cfg.settings, &err), IFD_OK);
    ifd_rng_seed(&l->rng, 4242);
    ck_assert_int_eq(ifd_batch_queue_create(&l->q, 4), IFD_OK);
    ck_assert_int_eq(ifd_sink_memory_create(&l->sink), IFD_OK);
    int rc = ifd_session_create(&l->s, &l->cfg, ifd_batch_queue_source(l->q), &err);
    ck_assert_msg(rc == IFD_OK, "%s", ifd_error_text(&err));
    ifd_session_add_sink(l->s, l->sink);
    if (hook)
        ifd_session_add_hook(l->s, hook);
    pthread_create(&l->runner, NULL, live_run, l);
}

void tu_live_push(tu_live *l)
{
    tu_batch *tb = tu_batch_random(&l->prog, l->cfg.batch_size, l->pushed++, &l->rng);
    ck_assert_int_eq(ifd_batch_queue_push(l->q, &tb->b), IFD_OK);
}

/* Waits up to 5 s for at least n summaries; returns how many there are. */
size_t tu_live_wait_summaries(tu_live *l, size_t n)
{
    size_t have = ifd_sink_memory_count(l->sink);
    for (int i = 0; i < 5000 && have < n; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        have = ifd_sink_memory_count(l->sink);
    }
    return have;
}

void tu_live_finish(tu_live *l)
{
    ifd_batch_queue_close(l->q);
    if (!l->joined)
        pthread_join(l->runner, NULL);
    ifd_session_destroy(l->s);
    ifd_program_free(&l->prog);
    ifd_batch_queue_destroy(l->q);
    ifd_sink_destroy(l->sink);
}
