/* linear: least squares. x float32 [B,D], y float32 [B,K]; pred = x W + b;
 * loss = mean over rows of 0.5 |pred - y|^2. Parameters W [D,K] (Glorot) and b [K] (zeros). */
#include "device/programs/common.h"

static int linear_setup(ifd_program *p, ifd_error *err)
{
    return ifd_dense_setup(p, IFD_F32, 1, 1, 0, err);
}

static void squared_error(const ifd_ops *ops, int64_t rows, int64_t k, const float *pred,
                          const void *y, float scale, float *dpred, ifd_step_out *out)
{
    ops->squared_error(ops->ctx, rows, k, pred, y, scale, dpred, out);
}

static int linear_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                       ifd_error *err)
{
    (void)err;
    ifd_dense_step(p, ops, a, squared_error);
    return IFD_OK;
}

static int linear_predict(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                          ifd_error *err)
{
    (void)err;
    ifd_dense_predict(p, ops, a);
    return IFD_OK;
}

const ifd_program_class ifd_program_linear = {
    .name = "linear",
    .description = "least squares: x float32 [D], y float32 [K]",
    .setup = linear_setup,
    .init_params = ifd_dense_init_params,
    .workspace_floats = ifd_dense_workspace,
    .train_step = linear_step,
    .predict_step = linear_predict,
};
