/* hooks/'s interface for the session: the run context it hands every hook. hooks/ defines it
 * and reads it (the accessors of infeed.h, hooks/run_context.c); the session (loop/) fills it
 * in and backs its snapshot, so hooks reach the session through these fields only, never by
 * calling into loop/. */
#ifndef IFD_HOOKS_RUN_CONTEXT_H
#define IFD_HOOKS_RUN_CONTEXT_H

#include <infeed/infeed.h>

struct ifd_run_context {
    int64_t global_step;
    int64_t loop_length;
    int64_t loop_index;
    int64_t next_loop_length; /* 0: not set by any hook */
    int64_t next_loop_end;    /* 0: not set; else the global step the next loop ends by */
    int stop_requested;
    char stop_reason[200];
    int failed;      /* set before end: the run ends with an error or an abort */
    int64_t dropped; /* set before end: batches the infeed took and released unconsumed */
    /* The session's state as a new checkpoint (ifd_run_context_checkpoint). */
    int (*snapshot)(void *arg, ifd_checkpoint **out, ifd_error *err);
    void *snapshot_arg;
};

#endif
