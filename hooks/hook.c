#include "hooks/hook_internal.h"

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

void ifd_run_context_request_stop(ifd_run_context *ctx, const char *reason)
{
    if (!ctx->stop_requested)
        snprintf(ctx->stop_reason, sizeof ctx->stop_reason, "%s", reason ? reason : "stopped");
    ctx->stop_requested = 1;
}
