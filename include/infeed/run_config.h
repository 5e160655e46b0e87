/*
 * A run's configuration (ifd_config): program, mode, batch, loop lengths, optimizer, threads,
 * the watchdog, several hosts. Part of the runtime API (<infeed/infeed.h> includes it); implemented
 * in loop/run_config.c. docs/config.md names each field's infeedd key.
 */
#ifndef IFD_RUN_CONFIG_H
#define IFD_RUN_CONFIG_H

#include <infeed/error.h>
#include <infeed/modes.h>
#include <infeed/program.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
    float beta1;    /* adam, adamw */
    float beta2;    /* adam, adamw */
    float epsilon;  /* adam, adamw */
    /* adamw: decoupled weight decay (Loshchilov and Hutter; Keras's AdamW): before the Adam
     * update, p -= p * weight_decay * lr (lr: the schedule's rate at this update), except in
     * the parameters a program flags IFD_PARAM_NO_DECAY. */
    float weight_decay;
    /* > 0: the all-reduced gradients are scaled by clip_norm / their global L2 norm when that
     * is above clip_norm (TensorFlow's clip_by_global_norm); 0: no clipping. */
    float clip_norm;
    /* The rate of update t (t = 0, 1, ...: the optimizer's own count, as Adam's) is
     * learning_rate * t / warmup_steps while t < warmup_steps, then: constant, learning_rate;
     * cosine or linear, from learning_rate down to min_learning_rate at t = decay_steps (which
     * counts the warmup, as Optax's warmup_cosine_decay_schedule), and min_learning_rate after. */
    ifd_lr_schedule lr_schedule;
    int64_t warmup_steps;
    int64_t decay_steps;
    float min_learning_rate;
} ifd_optimizer;

/* A built-in host call (docs/config.md, "Host calls"): a reducer, by its spec ("mean",
 * "histogram", "top_k:5", ...), over one outfeed tensor, by name. Both strings are borrowed. */
#define IFD_MAX_HOST_CALLS 32
typedef struct ifd_host_call {
    const char *tensor;
    const char *spec;
} ifd_host_call;

/* A training run's saved state: <infeed/checkpoint.h>. */
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
    /* Several hosts (<infeed/hosts.h>, docs/multihost.md), borrowed: NULL or size 1 is one host.
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
    /* Train, eval: the built-in host calls, each over one outfeed tensor of the step
     * (include/infeed/sinks.h, ifd_step_tensors). Train: over each summary window; eval: over
     * the whole run. Their values are the summary's "host_calls" (docs/summaries.md). */
    ifd_host_call host_calls[IFD_MAX_HOST_CALLS];
    int nhost_calls;
} ifd_config;

/* Fills every field with its default (see docs/config.md). */
void ifd_config_defaults(ifd_config *cfg);
/* One validation pass; the error names the field, the allowed values and what was given. */
int ifd_config_validate(const ifd_config *cfg, ifd_error *err);

#ifdef __cplusplus
}
#endif

#endif
