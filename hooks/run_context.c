#include "hooks/run_context.h"
#include <infeed/checkpoint.h>

#include <stdio.h>

int64_t ifd_run_context_global_step(const ifd_run_context *ctx)
{
    return ctx->global_step;
}

int64_t ifd_run_context_loop_length(const ifd_run_context *ctx)
{
    return ctx->loop_length;
}

int64_t ifd_run_context_loop_index(const ifd_run_context *ctx)
{
    return ctx->loop_index;
}

void ifd_run_context_set_next_loop_length(ifd_run_context *ctx, int64_t n)
{
    ctx->next_loop_length = n;
}

void ifd_run_context_end_next_loop_by(ifd_run_context *ctx, int64_t step)
{
    if (step > ctx->global_step && (ctx->next_loop_end == 0 || step < ctx->next_loop_end))
        ctx->next_loop_end = step;
}

void ifd_run_context_request_stop(ifd_run_context *ctx, const char *reason)
{
    if (!ctx->stop_requested)
        snprintf(ctx->stop_reason, sizeof ctx->stop_reason, "%s", reason ? reason : "stopped");
    ctx->stop_requested = 1;
}

int ifd_run_context_checkpoint(ifd_run_context *ctx, ifd_checkpoint **out, ifd_error *err)
{
    *out = NULL;
    if (ctx->snapshot == NULL)
        return ifd_error_set(err, IFD_ENOTSUP, "checkpoint: this run context has no state to save");
    return ctx->snapshot(ctx->snapshot_arg, out, err);
}

int ifd_run_context_failed(const ifd_run_context *ctx)
{
    return ctx->failed;
}

int64_t ifd_run_context_dropped(const ifd_run_context *ctx)
{
    return ctx->dropped;
}
