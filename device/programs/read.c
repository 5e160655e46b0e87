/* read: a benchmark program that reads its whole input and learns nothing, so that an ingest
 * benchmark measures the path to the device rather than a model. x float32 [D]; one parameter
 * vector w [D] (zeros). Each step computes p = x w (every input float is read once), a zero loss
 * against p itself, and a zero gradient (the column sum of no rows, which reads nothing). */
#include "device/programs/common.h"

static int read_setup(ifd_program *p, ifd_error *err)
{
    int64_t d = p->settings.features;
    int rc = ifd_program_need(p, "features", d, 1, IFD_PROGRAM_MAX_DIM, err);
    if (rc)
        return rc;
    int64_t wdims[2] = {d, 1};
    ifd_program_add_input(p, "x", IFD_F32, 1, &d);
    ifd_program_add_param(p, "w", 2, wdims);
    return IFD_OK;
}

static void read_init_params(const ifd_program *p, float *params, uint64_t seed)
{
    (void)seed;
    memset(params, 0, sizeof(float) * (size_t)p->nparam_floats);
}

/* p [rows] and its gradient [rows]. */
static int64_t read_workspace(const ifd_program *p, int64_t rows)
{
    (void)p;
    return 2 * rows;
}

static int read_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                     ifd_error *err)
{
    (void)err;
    int64_t d = p->settings.features, rows = a->rows;
    const float *x = a->inputs[0].data;
    float *pred = a->workspace, *dpred = a->workspace + rows; /* dpred: all zeros */
    ops->gemm(ops->ctx, 0, 0, rows, 1, d, 1.0f, x, a->params, 0.0f, pred);
    ops->squared_error(ops->ctx, rows, 1, pred, pred, a->scale, dpred, a->out);
    if (a->grads)
        ops->col_sum(ops->ctx, 0, d, x, a->grads);
    return IFD_OK;
}

const ifd_program_class ifd_program_read = {
    .name = "read",
    .description = "benchmark: reads x float32 [D] and learns nothing (loss 0)",
    .setup = read_setup,
    .init_params = read_init_params,
    .workspace_floats = read_workspace,
    .train_step = read_step,
};
