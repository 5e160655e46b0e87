/* linear: least squares. x float32 [B,D], y float32 [B,K]; pred = x W + b;
 * loss = mean over rows of 0.5 |pred - y|^2. Parameters W [D,K] (Glorot) and b [K] (zeros). */
#include "device/programs/common.h"

#include <string.h>

static int linear_setup(ifd_program *p, ifd_error *err)
{
    int64_t d = p->settings.features, k = p->settings.classes;
    int rc = ifd_program_need(p, "features", d, IFD_PROGRAM_MAX_DIM, err);
    if (rc == IFD_OK)
        rc = ifd_program_need(p, "classes", k, IFD_PROGRAM_MAX_DIM, err);
    if (rc)
        return rc;
    ifd_program_add_input(p, "x", IFD_F32, 1, &d);
    ifd_program_add_input(p, "y", IFD_F32, 1, &k);
    int64_t wdims[2] = {d, k};
    ifd_program_add_param(p, "W", 2, wdims);
    ifd_program_add_param(p, "b", 1, &k);
    p->classifier = 0;
    return IFD_OK;
}

static void linear_init_params(const ifd_program *p, float *params, uint64_t seed)
{
    const ifd_param_spec *w = &p->params[0], *b = &p->params[1];
    ifd_program_init_glorot(params + w->offset, w->dims[0], w->dims[1], seed);
    memset(params + b->offset, 0, sizeof(float) * (size_t)b->count);
}

static int64_t linear_workspace(const ifd_program *p, int64_t rows)
{
    return 2 * rows * p->settings.classes;
}

static int linear_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                       ifd_error *err)
{
    (void)err;
    int64_t d = p->settings.features, k = p->settings.classes, n = a->rows;
    const float *x = a->inputs[0].data, *y = a->inputs[1].data;
    const float *w = a->params + p->params[0].offset, *b = a->params + p->params[1].offset;
    float *dw = a->grads + p->params[0].offset, *db = a->grads + p->params[1].offset;
    float *pred = a->workspace, *dpred = a->workspace + n * k;

    ops->gemm(ops->ctx, 0, 0, n, k, d, 1.0f, x, w, 0.0f, pred);
    ops->bias_add(ops->ctx, n, k, b, pred);
    ops->squared_error(ops->ctx, n, k, pred, y, a->scale, dpred, a->out);
    ops->gemm(ops->ctx, 1, 0, d, k, n, 1.0f, x, dpred, 0.0f, dw);
    ops->col_sum(ops->ctx, n, k, dpred, db);
    return IFD_OK;
}

const ifd_program_class ifd_program_linear = {
    .name = "linear",
    .description = "least squares: x float32 [D], y float32 [K]",
    .setup = linear_setup,
    .init_params = linear_init_params,
    .workspace_floats = linear_workspace,
    .train_step = linear_step,
};
