/* Helpers of the suites of the built-in programs (tests/device/test_program_*.c,
 * test_step_train.c, test_allreduce.c, test_plugin.c): seeds that replay a loop test, programs
 * made or the test fails, one step straight on the cpu op set, and a double-precision reference of
 * the linear, softmax and mlp programs' outputs and losses. */
#ifndef IFD_TEST_PROGRAM_REF_H
#define IFD_TEST_PROGRAM_REF_H

#include "device/step.h"
#include <infeed/program.h>

#include <stddef.h>
#include <stdint.h>

#ifndef BASE_SEED /* -DBASE_SEED=... replays a suite with other draws */
#define BASE_SEED 0x7E57B10Cull
#endif

/* The seed of loop iteration i of the test tagged tag (each test its own tag). */
static inline uint64_t tu_test_seed(int tag, int i)
{
    return BASE_SEED + 1000003ull * (uint64_t)tag + (uint64_t)i;
}

/* For test programs that are set up and never stepped: rows floats of workspace, and a step that
 * does nothing. */
int64_t tu_program_rows_workspace(const ifd_program *p, int64_t rows);
int tu_program_no_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                       ifd_error *err);

/* ifd_program_init over D features, K classes and (mlp) H hidden units, or the test fails. */
void tu_make_program_h(ifd_program *p, const char *name, int64_t d, int64_t h, int64_t k);
void tu_make_program(ifd_program *p, const char *name, int64_t d, int64_t k);
int tu_is_mlp(const ifd_program *p);

/* One direct step on the cpu ops, over a fresh NaN-filled workspace: train_step (eval when
 * grads is NULL), or predict_step when pred is not NULL (in: the non-label inputs). Fails the
 * test unless the step returns IFD_OK. */
void tu_run_any_step(const ifd_program *p, const ifd_tensor *in, int64_t rows, const float *params,
                     float *grads, float scale, ifd_step_out *out, float *pred);
/* tu_run_any_step's train (or eval) step. */
void tu_run_step(const ifd_program *p, const ifd_tensor *in, int64_t rows, const float *params,
                 float *grads, float scale, ifd_step_out *out);

/* The name of flat parameter j ("W[2][1]", "b1[0]") for messages. */
const char *tu_param_name(const ifd_program *p, int64_t j, char *buf, size_t len);

/* The logits (or linear outputs) z [K] of one row x [D], in double. mlp: through the hidden
 * layer, and active[j] (when not NULL) says whether hidden unit j is positive. */
void tu_ref_logits(const ifd_program *p, const float *x, const float *params, double *z,
                   unsigned char *active);
/* The double-precision reference loss of one batch (mean over rows of the softmax cross-entropy,
 * or of 0.5 |pred - y|^2). For classifiers, *correct counts rows whose argmax is clearly the label
 * and *ambiguous the rows whose top two logits are too close for float32 to decide. mlp: active
 * (when not NULL) receives the [rows, H] mask of positive hidden units. */
double tu_ref_loss_active(const ifd_program *p, const ifd_tensor *in, int64_t rows,
                          const float *params, int64_t *correct, int64_t *ambiguous,
                          unsigned char *active);
double tu_ref_loss(const ifd_program *p, const ifd_tensor *in, int64_t rows, const float *params,
                   int64_t *correct, int64_t *ambiguous);

#endif
