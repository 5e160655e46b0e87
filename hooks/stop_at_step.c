/* The seed's _TPUStopAtStepHook. */
#include "infeed/infeed.h"

#include <stdlib.h>

typedef struct stop_at_step {
    int64_t iterations;
    int64_t steps;     /* <= 0: unset */
    int64_t last_step; /* <= 0: unset until after_create_session */
} stop_at_step;

static int64_t next_iterations(const stop_at_step *h, int64_t global_step)
{
    int64_t gap = h->last_step - global_step;
    return gap < h->iterations ? gap : h->iterations;
}

/* Sets the next loop's length, or asks the run to stop once the last step is reached. */
static void schedule(stop_at_step *h, ifd_run_context *ctx)
{
    int64_t gs = ifd_run_context_global_step(ctx);
    if (gs >= h->last_step)
        ifd_run_context_request_stop(ctx, "last_step");
    else
        ifd_run_context_set_next_loop_length(ctx, next_iterations(h, gs));
}

static int sas_after_create_session(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    stop_at_step *h = arg;
    if (h->steps > 0)
        h->last_step = ifd_run_context_global_step(ctx) + h->steps;
    schedule(h, ctx);
    return IFD_OK;
}

static int sas_after_run(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    schedule(arg, ctx);
    return IFD_OK;
}

int ifd_hook_stop_at_step(ifd_hook *out, int64_t iterations_per_loop, int64_t steps,
                          int64_t last_step, ifd_error *err)
{
    if (iterations_per_loop < 1)
        return ifd_error_set(err, IFD_EINVAL,
                             "iterations_per_loop: expected a positive integer, got %lld",
                             (long long)iterations_per_loop);
    int has_num = steps > 0, has_last = last_step > 0;
    if (has_num == has_last)
        return ifd_error_set(err, IFD_EINVAL,
                             "steps and last_step: exactly one must be set (a positive "
                             "integer), got %s (steps=%lld, last_step=%lld)",
                             has_num ? "both" : "neither", (long long)steps, (long long)last_step);
    stop_at_step *h = calloc(1, sizeof *h);
    if (h == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "stop_at_step hook");
    h->iterations = iterations_per_loop;
    h->steps = has_num ? steps : 0;
    h->last_step = has_last ? last_step : 0;
    *out = (ifd_hook){
        .name = "stop_at_step",
        .after_create_session = sas_after_create_session,
        .after_run = sas_after_run,
        .destroy = free,
        .arg = h,
    };
    return IFD_OK;
}
