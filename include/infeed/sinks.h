/*
 * Where a run's output goes: summary sinks (JSON Lines, memory, your own) and, in predict mode,
 * prediction sinks. Part of the runtime API (<infeed/infeed.h> includes it).
 */
#ifndef IFD_SINKS_H
#define IFD_SINKS_H

#include <infeed/batches.h>
#include <infeed/error.h>
#include <infeed/tensor.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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
/* The most summary sinks and prediction sinks one session takes. */
#define IFD_MAX_SINKS 8
#define IFD_MAX_PREDICTION_SINKS 8

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

/* ---- outfeed tensors (train and eval) ---------------------------------------------------- */

#define IFD_MAX_TENSOR_SINKS 8

/*
 * One step's outfeed tensors on the host: the program's (ifd_program_add_outfeed), each
 * replica's concatenated along axis 0 in replica order (broadcast input mode: replica 0's), then
 * every host's in rank order; then the runtime's: "loss", "correct", "count" (float32, one value
 * a replica-step, concatenated alike) and in train mode "grad_norm", "param_norm",
 * "learning_rate" (float32 [1]). A per-row tensor has the step's rows as dims[0].
 */
typedef struct ifd_step_tensors {
    int64_t global_step; /* train: after the step; eval: the eval step (1, 2, ...) */
    int skipped;         /* the step was skipped (non-finite; docs/design.md) */
    int ntensors;
    const char *const *names;
    const ifd_tensor *tensors;
} ifd_step_tensors;

/* Receives every train or eval step's tensors, on the outfeed thread, in step order. The tensors
 * are valid during the call only. An error ends the run.
 *
 * flush (optional) says that a device loop's steps have all been written: the outfeed thread
 * calls it after the last step of each loop, and once more when the run's steps end (the input
 * ended or the run stopped); a sink that holds steps back to send them together sends them then,
 * so that they go out within a loop. An error ends the run. NULL: never called.
 *
 * wants (optional) says whether the sink takes tensors now: the infeed asks it once a step (on
 * its thread; make it cheap), and a step nobody takes writes no program outfeed (no op, no
 * copy) and reaches the sink only for a program without outfeed tensors of its own. NULL:
 * always. With several hosts a sink takes them at every step (every host must exchange the
 * same tensors). */
typedef struct ifd_tensor_sink {
    int (*write)(void *ctx, const ifd_step_tensors *t, ifd_error *err);
    void *ctx;
    int (*wants)(void *ctx);
    int (*flush)(void *ctx, ifd_error *err);
} ifd_tensor_sink;

#ifdef __cplusplus
}
#endif

#endif
