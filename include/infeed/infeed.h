/*
 * libinfeed: the runtime, usable in-process with no network.
 *
 * A session owns a device backend with R replicas, an infeed controller thread that takes
 * batches from a batch source and shards them to the replicas, an outfeed controller thread that
 * turns every step's outfeed into metrics and JSON summaries, and the hooks that decide how long
 * each device loop runs and when the run ends. ifd_session_run drives it all from the calling
 * thread:
 *
 *   begin -> after_create_session -> { before_run -> device loop of n steps -> after_run }* -> end
 *
 * Threading: a session is driven by one thread; ifd_session_request_stop may be called from any
 * thread. Batch sources and sinks are borrowed and must outlive the session.
 */
#ifndef IFD_INFEED_H
#define IFD_INFEED_H

#include "infeed/batches.h"
#include "infeed/error.h"
#include "infeed/logging.h"
#include "infeed/modes.h"
#include "infeed/program.h"
#include "infeed/tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IFD_VERSION_STRING "0.1.0"

/* ---- configuration ----------------------------------------------------------------------- */

/* A setting has one name in infeedd and in ifd_config (infeedd's key). A field's old name stays
 * for one release, as the other member of an anonymous union: code that uses it compiles, with a
 * warning that names the new one; infeed 0.2 drops it. docs/config.md lists them. */
#if defined(__GNUC__) || defined(__clang__)
#define IFD_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define IFD_DEPRECATED(msg)
#endif
#define IFD_RENAMED(type, name, old)                                                               \
    union {                                                                                        \
        type name;                                                                                 \
        type old IFD_DEPRECATED("ifd_config." #old " is renamed ifd_config." #name                 \
                                " (infeed 0.2 drops the old name)");                               \
    }

/* How the session picks each device loop's length (docs/design.md, "Loop lengths"). */
typedef enum {
    IFD_LOOP_STEPS = 0, /* iterations_per_loop steps */
    IFD_LOOP_AUTO,      /* measured: a loop boundary costs under 1 % of a loop, which lasts at most
                           max_loop_seconds */
    IFD_LOOP_SECONDS    /* measured: loops of about loop_secs */
} ifd_loop_kind;

typedef struct ifd_optimizer {
    ifd_optimizer_kind kind;
    float learning_rate;
    float momentum; /* momentum */
    float beta1;    /* adam */
    float beta2;    /* adam */
    float epsilon;  /* adam */
} ifd_optimizer;

/* A training run's saved state: infeed/checkpoint.h. */
typedef struct ifd_checkpoint ifd_checkpoint;

typedef struct ifd_config {
    const char *backend; /* "cpu" */
    int replicas;
    const char *program; /* "linear", "softmax", or a registered program */
    ifd_program_settings settings;
    ifd_mode mode;
    ifd_input_mode input_mode;
    int64_t batch_size;          /* rows per host batch (several hosts: this host's share) */
    int64_t iterations_per_loop; /* loop_kind IFD_LOOP_STEPS: steps per loop */
    /* IFD_LOOP_STEPS (the default): every loop runs iterations_per_loop steps (the stop-at-step
     * hook shortens the last). IFD_LOOP_AUTO, IFD_LOOP_SECONDS: the session measures the step
     * time and the cost of a loop boundary and picks each loop's length itself; stop at step,
     * checkpoints (which then fall on exact multiples of their interval), eval's one loop and the
     * lengths several hosts agree on keep their meaning. Summaries say the length in use. */
    ifd_loop_kind loop_kind;
    double loop_secs; /* IFD_LOOP_SECONDS: how long a loop should take, (0, 86400] s */
    /* IFD_LOOP_AUTO: the longest a loop may take, (0, 86400] s; 0.5 */
    IFD_RENAMED(double, max_loop_seconds, max_loop_secs);
    /* steps to run; exactly one of steps and last_step is > 0 in train mode */
    IFD_RENAMED(int64_t, steps, num_steps);
    int64_t last_step;
    int64_t initial_global_step;
    ifd_optimizer optimizer;
    ifd_loss_reduction loss_reduction;
    int64_t summary_every; /* steps between train summaries; 0: only at the end */
    uint64_t seed;
    int infeed_depth;  /* shards buffered per replica */
    int outfeed_depth; /* step records buffered per replica */
    /* The state to start from (infeed/checkpoint.h), borrowed during ifd_session_create only; it
     * must fit the program, settings and (train mode) optimizer: ifd_checkpoint_check. Every
     * mode takes its parameters; train mode also its optimizer slots and update count, and its
     * global step (initial_global_step must then be 0 or equal to it). NULL: parameters from
     * seed, zeroed slots. */
    const ifd_checkpoint *restore;
    /* The seed's initial_infeed_sleep_secs: the infeed thread waits this long (0 to 86400 s)
     * before it takes its first batch; an abort or an error ends the wait at once. */
    IFD_RENAMED(double, initial_infeed_sleep, initial_infeed_sleep_secs);
    /* > 0: a run in which no step completes for this long (0 to 86400 s) while a device loop
     * is running ends with IFD_ETIMEDOUT from source "watchdog", naming the replicas whose
     * infeed is empty and the outfeed rings that are full. 0: off. */
    IFD_RENAMED(double, watchdog, watchdog_secs);
    /* Several hosts (infeed/hosts.h, docs/multihost.md), borrowed: NULL or size 1 is one host.
     * With H hosts batch_size is this host's part of the global batch (the global batch / H),
     * the MEAN loss scale is 1 / (H x replicas), gradients are summed over every host's
     * replicas, hosts agree on each loop's length and on stopping, and summaries carry the
     * global step's metrics and "host". */
    const struct ifd_hosts *hosts;
    /* cpu: the OpenBLAS kernel, process-wide and chosen when the first cpu backend of the
     * process opens (docs/design.md, "The BLAS kernel"): NULL or "auto" replaces a generic
     * fallback below what the CPU runs (OPENBLAS_CORETYPE, when set, is obeyed instead); "keep"
     * leaves the library's pick; a kernel name ("SkylakeX", "Haswell", ...) asks for that one. */
    const char *blas_kernel;
    /* Train, eval: a step whose all-reduced gradients (train) or a replica's loss is not finite
     * is skipped on every replica and host: no parameter or optimizer slot changes, and the
     * summaries count it (skipped_steps) and name the batches whose loss was not finite. This
     * many skipped steps in a row end the run with IFD_ENUMERIC (0: never). */
    int64_t max_skipped_steps;
    /* cpu: the threads a replica's large products and its optimizer update run on, its own and
     * replica_threads - 1 helpers, 0 to 1024; 0: the CPUs this process may use over the
     * replicas, 1 to 8 (1 when OPENBLAS_NUM_THREADS is set). */
    int replica_threads;
    /* cuda: 1 (the default) captures each step in a CUDA Graph launched n times a loop; 0 runs
     * the step's kernels one by one. */
    int cuda_graphs;
} ifd_config;

/* Fills every field with its default (see docs/config.md). */
void ifd_config_defaults(ifd_config *cfg);
/* One validation pass; the error names the field, the allowed values and what was given. */
int ifd_config_validate(const ifd_config *cfg, ifd_error *err);

/* ---- summary sinks ----------------------------------------------------------------------- */

/* A sink receives each summary as one JSON object without a newline. Called from one thread at
 * a time (the outfeed thread while the run goes, the session's thread at the end). */
typedef struct ifd_sink_ops {
    int (*write)(void *ctx, const char *json, size_t len, ifd_error *err);
    int (*flush)(void *ctx, ifd_error *err);
    void (*destroy)(void *ctx);
} ifd_sink_ops;

typedef struct ifd_sink ifd_sink;
int ifd_sink_create(ifd_sink **out, const ifd_sink_ops *ops, void *ctx);
/* JSON Lines, appended to path; flushed after every summary. */
int ifd_sink_jsonl_create(ifd_sink **out, const char *path, ifd_error *err);
/* Keeps every summary in memory (tests, embedding). */
int ifd_sink_memory_create(ifd_sink **out);
size_t ifd_sink_memory_count(ifd_sink *s);
/* The i-th summary (a copy the caller frees), NULL past the end. */
char *ifd_sink_memory_get(ifd_sink *s, size_t i);
int ifd_sink_write(ifd_sink *s, const char *json, size_t len, ifd_error *err);
int ifd_sink_flush(ifd_sink *s, ifd_error *err);
void ifd_sink_destroy(ifd_sink *s);

/* ---- predictions (predict mode) --------------------------------------------------------- */

#define IFD_MAX_PREDICTION_TENSORS 2

/*
 * One batch's predictions, padding removed, the replicas' rows concatenated in row order: every
 * tensor has `rows` rows (the batch's valid rows). Classifiers: "probabilities" float32 [rows, K]
 * and "classes" int32 [rows] (the argmax); linear: "outputs" float32 [rows, K].
 */
typedef struct ifd_predictions {
    int64_t rows;
    int ntensors;
    const char *names[IFD_MAX_PREDICTION_TENSORS];
    ifd_tensor tensors[IFD_MAX_PREDICTION_TENSORS];
} ifd_predictions;

/* Receives each batch's predictions, on the outfeed thread, batch by batch in the order the steps
 * ran (so each producer's batches in their order). The batch and the tensors are valid during the
 * call only; the batch is released after it. An error ends the run. */
typedef struct ifd_prediction_sink {
    int (*write)(void *ctx, const ifd_batch *batch, const ifd_predictions *p, ifd_error *err);
    void *ctx;
} ifd_prediction_sink;

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
 * "last_step" (the stop-at-step hook), else reason "stopped" with this reason as its message. */
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

/* ---- the session ------------------------------------------------------------------------- */

typedef struct ifd_session ifd_session;

typedef enum {
    IFD_END_NONE = 0,
    IFD_END_LAST_STEP,   /* reached the last step */
    IFD_END_INPUT_ENDED, /* the batch source ended before the last step */
    IFD_END_STOPPED,     /* ifd_session_request_stop or a hook asked */
    IFD_END_ERROR
} ifd_end_reason;
const char *ifd_end_reason_name(ifd_end_reason r);

/* Validates cfg, opens the backend and initialises the parameters from cfg->seed. In train
 * mode, installs the stop-at-step hook from steps/last_step. src is borrowed. */
int ifd_session_create(ifd_session **out, const ifd_config *cfg, ifd_batch_source src,
                       ifd_error *err);
/* Before ifd_session_run. The hook is copied; its destroy runs in ifd_session_destroy. */
int ifd_session_add_hook(ifd_session *s, const ifd_hook *hook);
/* Before ifd_session_run. Borrowed. */
int ifd_session_add_sink(ifd_session *s, ifd_sink *sink);
/* Before ifd_session_run, predict mode. Copied; at most IFD_MAX_SINKS. */
int ifd_session_add_prediction_sink(ifd_session *s, const ifd_prediction_sink *sink);
/* Runs until the last step, the end of the input, a stop request or an error. Returns IFD_OK
 * when the run ended well (including the input ending early), else the first real error, with
 * err filled as "<source>: <sentence>". Every thread is joined before it returns. Once only.
 * The batch source is left as it is: a producer still blocked pushing into an ifd_batch_queue
 * stays blocked until the queue is closed, so close it after the run before joining such a
 * producer. */
int ifd_session_run(ifd_session *s, ifd_error *err);
/* Any thread: end the run at the end of the current loop. When the loop then ends early because
 * the input ended, the end reason is still "stopped". */
void ifd_session_request_stop(ifd_session *s);
/* Any thread: whether a stop was asked, here (ifd_session_request_stop) or, in train and eval on
 * several hosts, on another host (the stop relay brings it within tens of milliseconds, even
 * while this host's loop waits for input: docs/multihost.md). *host (when not NULL) is the rank
 * of the host that asked (0 on one host), -1 when none did. A program that closes its input when
 * a stop waits too long for it (infeedd: a second) should do so for either. */
int ifd_session_stop_requested(ifd_session *s, int *host);
/* Any thread: end the run now, as an error (IFD_ECANCELED, source "abort", with why as its
 * sentence) unless a real error came first. Every thread wakes; ifd_session_run returns soon. */
void ifd_session_abort(ifd_session *s, const char *why);
/* Writes what the watchdog's sentence should add about the input ("2 producers connected, 1
 * ended") into buf (len bytes). Called on the watchdog's thread; must not block. */
typedef void (*ifd_watchdog_context_fn)(void *arg, char *buf, size_t len);
/* Before ifd_session_run: the watchdog (cfg->watchdog) asks fn for context when it fires. */
int ifd_session_set_watchdog_context(ifd_session *s, ifd_watchdog_context_fn fn, void *arg);

/* A replica's rings as they are now: shards staged and not yet taken by a step, step records the
 * outfeed has not taken yet, and both capacities. */
typedef struct ifd_ring_depths {
    int64_t infeed, infeed_capacity;
    int64_t outfeed, outfeed_capacity;
} ifd_ring_depths;
/* Any thread, while the session exists. IFD_EINVAL for a replica out of range. */
int ifd_session_ring_depths(ifd_session *s, int replica, ifd_ring_depths *out);

/* Any thread: 0-based index of the loop running now (or the number of loops run). */
int64_t ifd_session_loop_index(ifd_session *s);
/* Any thread: whether the infeed thread is blocked waiting for the batch source now. When it
 * is, *replica (when not NULL) is the replica whose batch it waits for (per-host-v2: replica i
 * for the i-th batch of a step; per-core: the replica whose stream is empty, the one starving
 * the step), or -1 when the batch is for every replica (per-host, broadcast); *since_ns (when
 * not NULL) is when the wait began, in CLOCK_MONOTONIC nanoseconds. */
int ifd_session_infeed_waiting(ifd_session *s, int *replica, int64_t *since_ns);
int64_t ifd_session_global_step(ifd_session *s);
ifd_end_reason ifd_session_end_reason(ifd_session *s);
const ifd_program *ifd_session_program(ifd_session *s);
/* Copies replica's parameters (program->nparam_floats floats) to host memory. Not while
 * ifd_session_run is in a device loop. */
int ifd_session_read_params(ifd_session *s, int replica, float *out);
/* Registers [p, p + len) of host memory (page-aligned, mapped at least for reading) with the
 * session's device, so that batches in it (flagged IFD_BATCH_PINNED) are copied to the device
 * without a host copy (cuda: cudaHostRegister, read-only); unregister it before it is unmapped,
 * and before the session is destroyed. IFD_ENOTSUP when the backend has no use for it (cpu).
 * Any thread. */
int ifd_session_register_host_memory(ifd_session *s, void *p, size_t len, ifd_error *err);
void ifd_session_unregister_host_memory(ifd_session *s, void *p);
void ifd_session_destroy(ifd_session *s);

#ifdef __cplusplus
}
#endif

#endif
