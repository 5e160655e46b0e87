/* The seed's _SetEvalIterationsHook: eval runs all its steps in one device loop. */
#include "infeed/infeed.h"

#include <stdint.h>

static int eval_after_create_session(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    ifd_run_context_set_next_loop_length(ctx, (int64_t)(intptr_t)arg);
    return IFD_OK;
}

static int eval_after_run(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)arg;
    (void)err;
    ifd_run_context_request_stop(ctx, "last_step");
    return IFD_OK;
}

int ifd_hook_eval_iterations(ifd_hook *out, int64_t steps, ifd_error *err)
{
    if (steps < 1)
        return ifd_error_set(err, IFD_EINVAL,
                             "steps: eval runs steps steps in one loop; expected a positive "
                             "integer, got %lld",
                             (long long)steps);
    *out = (ifd_hook){
        .name = "eval_iterations",
        .after_create_session = eval_after_create_session,
        .after_run = eval_after_run,
        .arg = (void *)(intptr_t)steps,
    };
    return IFD_OK;
}
