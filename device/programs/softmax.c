/* softmax: multinomial logistic regression. x float32 [B,D], y int32 [B] in [0,K);
 * logits = x W + b; loss = mean softmax cross-entropy. W [D,K] (Glorot), b [K] (zeros). */
#include "device/programs/common.h"

static int softmax_setup(ifd_program *p, ifd_error *err)
{
    int rc = ifd_dense_setup(p, IFD_I32, 0, 2, 1, err);
    return rc ? rc : ifd_classifier_outfeeds_setup(p);
}

static int softmax_check(const ifd_program *p, const ifd_tensor *in, int64_t rows, ifd_error *err)
{
    return ifd_program_check_labels(p, in, 1, rows, err);
}

static int softmax_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                        ifd_error *err)
{
    (void)err;
    ifd_dense_step(p, ops, a, NULL); /* the classifier's loss and outfeeds */
    return IFD_OK;
}

static int softmax_predict(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                           ifd_error *err)
{
    (void)err;
    ifd_dense_predict(p, ops, a);
    return IFD_OK;
}

const ifd_program_class ifd_program_softmax = {
    .name = "softmax",
    .description = "multinomial logistic regression: x float32 [D], y int32 [] in [0, K)",
    .setup = softmax_setup,
    .init_params = ifd_dense_init_params,
    .workspace_floats = ifd_dense_workspace,
    .check_batch = softmax_check,
    .train_step = softmax_step,
    .predict_step = softmax_predict,
};
