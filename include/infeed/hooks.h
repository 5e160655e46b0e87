/*
 * Hooks: what decides how long each device loop runs and when the run ends (the seed's
 * SessionRunHooks), and the run context they see. Part of the runtime API (<infeed/infeed.h>
 * includes it).
 */
#ifndef IFD_HOOKS_H
#define IFD_HOOKS_H

#include <infeed/error.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- hooks ------------------------------------------------------------------------------- */

/* What a hook may see and change of a running session. */
typedef struct ifd_run_context ifd_run_context;
int64_t ifd_run_context_global_step(const ifd_run_context *ctx);
/* The length of the loop that just ran (in after_run) or is about to run (in before_run). */
int64_t ifd_run_context_loop_length(const ifd_run_context *ctx);
/* 0-based index of the current loop. */
int64_t ifd_run_context_loop_index(const ifd_run_context *ctx);
void ifd_run_context_set_next_loop_length(ifd_run_context *ctx, int64_t n);
/* Asks that the next loop end at global step `step` at the latest, when the session picks loop
 * lengths itself (loop_kind IFD_LOOP_AUTO or IFD_LOOP_SECONDS): the checkpoint hook asks for
 * its next multiple, so that checkpoints fall on exact multiples. Loops of a fixed length
 * (IFD_LOOP_STEPS) keep it. The earliest step asked for the next loop wins; a step at or before
 * the global step is ignored. With automatic lengths a length set_next_loop_length gives is
 * likewise the most the next loop runs (the stop-at-step hook's distance to the last step). */
void ifd_run_context_end_next_loop_by(ifd_run_context *ctx, int64_t step);
/* Ends the run after the current loop. The end summary says reason "last_step" when reason is
 * "last_step" (the stop-at-step hook), reason "early_stopping" with this reason as its message
 * when it begins with "early_stopping" (infeedd's --early-stopping), else reason "stopped" with
 * this reason as its message. */
void ifd_run_context_request_stop(ifd_run_context *ctx, const char *reason);

/* Every callback is optional and returns IFD_OK or an error (which ends the run). */
typedef struct ifd_hook {
    const char *name;
    int (*begin)(void *arg, ifd_run_context *ctx, ifd_error *err);
    int (*after_create_session)(void *arg, ifd_run_context *ctx, ifd_error *err);
    int (*before_run)(void *arg, ifd_run_context *ctx, ifd_error *err);
    int (*after_run)(void *arg, ifd_run_context *ctx, ifd_error *err);
    int (*end)(void *arg, ifd_run_context *ctx, ifd_error *err);
    void (*destroy)(void *arg); /* called when the session is destroyed */
    void *arg;
} ifd_hook;

/* The seed's _TPUStopAtStepHook: exactly one of steps and last_step is > 0 (the other
 * <= 0); each loop runs min(last_step - global_step, iterations_per_loop) steps; the global step
 * is re-read after every loop and the run stops once it reaches last_step. */
int ifd_hook_stop_at_step(ifd_hook *out, int64_t iterations_per_loop, int64_t steps,
                          int64_t last_step, ifd_error *err);

/* The seed's _SetEvalIterationsHook: the first loop runs steps (> 0) steps, and the run ends
 * after it. Eval sessions install it themselves. */
int ifd_hook_eval_iterations(ifd_hook *out, int64_t steps, ifd_error *err);

#ifdef __cplusplus
}
#endif

#endif
