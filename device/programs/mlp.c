/* mlp: one hidden layer with ReLU. x float32 [B,D], y int32 [B] in [0,K);
 * h = relu(x W1 + b1), logits = h W2 + b2; loss = mean softmax cross-entropy.
 * W1 [D,H] and W2 [H,K] Glorot-uniform from two seed streams, b1 [H] and b2 [K] zeros. */
#include "core/rng.h"
#include "device/programs/common.h"

enum { MLP_W1, MLP_B1, MLP_W2, MLP_B2 };

static int mlp_setup(ifd_program *p, ifd_error *err)
{
    int rc = ifd_dense_io_setup(p, IFD_I32, 0, 2, err);
    if (rc == IFD_OK)
        rc = ifd_program_need(p, "hidden", p->settings.hidden, 1, IFD_PROGRAM_MAX_DIM, err);
    if (rc)
        return rc;
    int64_t d = p->settings.features, h = p->settings.hidden, k = p->settings.classes;
    int64_t w1[2] = {d, h}, w2[2] = {h, k};
    rc = ifd_program_add_param(p, "W1", 2, w1);
    if (rc == IFD_OK)
        rc = ifd_program_add_bias(p, "b1", h);
    if (rc == IFD_OK)
        rc = ifd_program_add_param(p, "W2", 2, w2);
    if (rc == IFD_OK)
        rc = ifd_program_add_bias(p, "b2", k);
    p->classifier = 1;
    return rc ? rc : ifd_classifier_outfeeds_setup(p);
}

/* W2's seed: a hash of seed, so that W2 is not W1's sequence shifted by a few numbers. */
static uint64_t mlp_w2_seed(uint64_t seed)
{
    ifd_rng r;
    ifd_rng_seed(&r, seed ^ 0x6D6C7032ull); /* "mlp2" */
    return ifd_rng_next(&r);
}

static void mlp_init_params(const ifd_program *p, float *params, uint64_t seed)
{
    const ifd_param_spec *w1 = &p->params[MLP_W1], *w2 = &p->params[MLP_W2];
    ifd_program_init_glorot(params + w1->offset, w1->dims[0], w1->dims[1], seed);
    ifd_program_init_glorot(params + w2->offset, w2->dims[0], w2->dims[1], mlp_w2_seed(seed));
    memset(params + p->params[MLP_B1].offset, 0, sizeof(float) * (size_t)p->params[MLP_B1].count);
    memset(params + p->params[MLP_B2].offset, 0, sizeof(float) * (size_t)p->params[MLP_B2].count);
}

/* h and its gradient [rows, H], logits and theirs [rows, K]. */
static int64_t mlp_workspace(const ifd_program *p, int64_t rows)
{
    return 2 * rows * (p->settings.hidden + p->settings.classes);
}

static int mlp_check(const ifd_program *p, const ifd_tensor *in, int64_t rows, ifd_error *err)
{
    return ifd_program_check_labels(p, in, 1, rows, err);
}

/* h = relu(x W1 + b1) and logits = h W2 + b2 into the workspace. */
static void mlp_forward(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a, float *h,
                        float *logits)
{
    int64_t d = p->settings.features, nh = p->settings.hidden, k = p->settings.classes;
    int64_t n = a->rows;
    const float *pr = a->params;
    ifd_dense_forward(ops, n, d, nh, a->inputs[0].data, pr + p->params[MLP_W1].offset,
                      pr + p->params[MLP_B1].offset, h);
    ops->relu(ops->ctx, n * nh, h, h);
    ifd_dense_forward(ops, n, nh, k, h, pr + p->params[MLP_W2].offset,
                      pr + p->params[MLP_B2].offset, logits);
}

/* The loss, and unless a->grads is NULL (eval) the gradients, through the op set only:
 * dW2 = h^T dlogits, db2 = colsum(dlogits), dh = dlogits W2^T masked where h = 0,
 * dW1 = x^T dh, db1 = colsum(dh). */
static int mlp_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                    ifd_error *err)
{
    (void)err;
    int64_t d = p->settings.features, nh = p->settings.hidden, k = p->settings.classes;
    int64_t n = a->rows;
    float *h = a->workspace, *dh = h + n * nh, *logits = dh + n * nh, *dlogits = logits + n * k;
    mlp_forward(p, ops, a, h, logits);
    ifd_classifier_loss(ops, a, k, logits, dlogits);
    if (a->grads == NULL)
        return IFD_OK;
    float *g = a->grads;
    ifd_dense_backward(ops, n, nh, k, h, dlogits, g + p->params[MLP_W2].offset,
                       g + p->params[MLP_B2].offset);
    ops->gemm(ops->ctx, 0, 1, n, nh, k, 1.0f, dlogits, a->params + p->params[MLP_W2].offset, 0.0f,
              dh);
    ops->relu_grad(ops->ctx, n * nh, h, dh, dh);
    ifd_dense_backward(ops, n, d, nh, a->inputs[0].data, dh, g + p->params[MLP_W1].offset,
                       g + p->params[MLP_B1].offset);
    return IFD_OK;
}

/* Class probabilities: softmax(logits) into a->predictions [rows, K]. */
static int mlp_predict(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                       ifd_error *err)
{
    (void)err;
    float *h = a->workspace, *logits = h + a->rows * p->settings.hidden;
    mlp_forward(p, ops, a, h, logits);
    ops->softmax(ops->ctx, a->rows, p->settings.classes, logits, a->predictions);
    return IFD_OK;
}

const ifd_program_class ifd_program_mlp = {
    .name = "mlp",
    .description = "one hidden layer with ReLU (width H = hidden) and a softmax output: x float32 "
                   "[D], y int32 [] in [0, K)",
    .setup = mlp_setup,
    .init_params = mlp_init_params,
    .workspace_floats = mlp_workspace,
    .check_batch = mlp_check,
    .train_step = mlp_step,
    .predict_step = mlp_predict,
};
