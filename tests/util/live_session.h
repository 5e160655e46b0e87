/* A session driven by hand: it runs on a thread of its own while the test pushes batches one by
 * one into its queue and reads the summaries of its memory sink as they come. */
#ifndef IFD_TEST_LIVE_SESSION_H
#define IFD_TEST_LIVE_SESSION_H

#include "core/rng.h"
#include <infeed/infeed.h>

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tu_live {
    ifd_config cfg; /* set by the test before tu_live_start */
    ifd_program prog;
    ifd_batch_queue *q;
    ifd_sink *sink; /* a memory sink */
    ifd_session *s;
    pthread_t runner;
    int rc; /* ifd_session_run's, once the runner ended */
    ifd_error err;
    ifd_rng rng;
    int64_t pushed;
    int joined; /* the test joined the runner thread already */
} tu_live;

/* Creates the session over l->cfg (and hook, when not NULL) and starts its run. */
void tu_live_start(tu_live *l, const ifd_hook *hook);
/* Pushes one random batch of cfg.batch_size rows (sequence numbers from 0). */
void tu_live_push(tu_live *l);
/* Waits up to 5 s for at least n summaries (polling every millisecond); returns how many. */
size_t tu_live_wait_summaries(tu_live *l, size_t n);
/* Closes the input, joins the run (unless joined) and frees everything. */
void tu_live_finish(tu_live *l);
/* Summary i of a memory sink, parsed; fails the test unless it is JSON. The caller decrefs. */
json_t *tu_summary_at(ifd_sink *sink, size_t i);

#endif
