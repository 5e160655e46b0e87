/* softmax: multinomial logistic regression. x float32 [B,D], y int32 [B] in [0,K);
 * logits = x W + b; loss = mean softmax cross-entropy. W [D,K] (Glorot), b [K] (zeros). */
#include "device/programs/common.h"

#include <string.h>

static int softmax_setup(ifd_program *p, ifd_error *err)
{
    int64_t d = p->settings.features, k = p->settings.classes;
    int rc = ifd_program_need(p, "features", d, IFD_PROGRAM_MAX_DIM, err);
    if (rc == IFD_OK)
        rc = ifd_program_need(p, "classes", k, IFD_PROGRAM_MAX_DIM, err);
    if (rc == IFD_OK && k < 2)
        rc = ifd_error_set(err, IFD_EINVAL,
                           "program 'softmax': setting 'classes' must be at least 2, got %lld",
                           (long long)k);
    if (rc)
        return rc;
    ifd_program_add_input(p, "x", IFD_F32, 1, &d);
    ifd_program_add_input(p, "y", IFD_I32, 0, NULL);
    int64_t wdims[2] = {d, k};
    ifd_program_add_param(p, "W", 2, wdims);
    ifd_program_add_param(p, "b", 1, &k);
    p->classifier = 1;
    return IFD_OK;
}

static void softmax_init_params(const ifd_program *p, float *params, uint64_t seed)
{
    const ifd_param_spec *w = &p->params[0], *b = &p->params[1];
    ifd_program_init_glorot(params + w->offset, w->dims[0], w->dims[1], seed);
    memset(params + b->offset, 0, sizeof(float) * (size_t)b->count);
}

static int64_t softmax_workspace(const ifd_program *p, int64_t rows)
{
    return 2 * rows * p->settings.classes;
}

static int softmax_check(const ifd_program *p, const ifd_tensor *in, int64_t rows, ifd_error *err)
{
    const int32_t *y = in[1].data;
    int64_t k = p->settings.classes;
    for (int64_t r = 0; r < rows; r++)
        if (y[r] < 0 || y[r] >= k)
            return ifd_error_set(err, IFD_ERANGE,
                                 "tensor 'y' row %lld: label %d is out of range, expected 0 <= "
                                 "label < %lld",
                                 (long long)r, (int)y[r], (long long)k);
    return IFD_OK;
}

static int softmax_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                        ifd_error *err)
{
    (void)err;
    int64_t d = p->settings.features, k = p->settings.classes, n = a->rows;
    const float *x = a->inputs[0].data;
    const int32_t *y = a->inputs[1].data;
    const float *w = a->params + p->params[0].offset, *b = a->params + p->params[1].offset;
    float *dw = a->grads + p->params[0].offset, *db = a->grads + p->params[1].offset;
    float *logits = a->workspace, *dlogits = a->workspace + n * k;

    ops->gemm(ops->ctx, 0, 0, n, k, d, 1.0f, x, w, 0.0f, logits);
    ops->bias_add(ops->ctx, n, k, b, logits);
    ops->softmax_xent(ops->ctx, n, k, logits, y, a->scale, dlogits, a->out);
    ops->gemm(ops->ctx, 1, 0, d, k, n, 1.0f, x, dlogits, 0.0f, dw);
    ops->col_sum(ops->ctx, n, k, dlogits, db);
    return IFD_OK;
}

const ifd_program_class ifd_program_softmax = {
    .name = "softmax",
    .description = "multinomial logistic regression: x float32 [D], y int32 [] in [0, K)",
    .setup = softmax_setup,
    .init_params = softmax_init_params,
    .workspace_floats = softmax_workspace,
    .check_batch = softmax_check,
    .train_step = softmax_step,
};
