/*
 * mlp2: a program plugin (include/infeed/program.h), built out of infeed's tree and loaded by
 * infeedd --program-lib. Two hidden layers of width H = hidden, the first tanh, the second ReLU,
 * a softmax output, and L2 weight decay on the weights:
 *
 *   x float32 [D], y int32 [] in [0, K)
 *   h1 = tanh(x W1 + b1)      W1 [D,H], b1 [H]
 *   h2 = relu(h1 W2 + b2)     W2 [H,H], b2 [H]
 *   logits = h2 W3 + b3       W3 [H,K], b3 [K]
 *   loss = mean softmax cross-entropy + decay / 2 * (|W1|^2 + |W2|^2 + |W3|^2)
 *
 * decay is the program's own setting weight_decay (infeedd --program-config '{"weight_decay":
 * 0.01}', a number in [0, 1]; MLP2_WEIGHT_DECAY by default), read in setup and kept in the
 * program's state for the steps (program ABI 4).
 *
 * Every train and eval step outfeeds three tensors a row (ifd_program_add_outfeed): "class", the
 * argmax of the logits (int32), "confidence", its softmax probability (float32), and "label", a
 * copy of y (int32), which infeedd's host calls turn into summary values (docs/config.md).
 *
 * Like the built-in programs it only does pointer arithmetic on device memory and calls the op
 * set, so the same plugin runs on the cpu and the cuda backend.
 */
#include "mlp2.h"

#include <infeed/program.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MLP2_MAX_DIM (1 << 20)

enum { W1, B1, W2, B2, W3, B3 };

/* What the steps read of the settings (p->state). */
typedef struct mlp2_state {
    float decay;
} mlp2_state;

static void mlp2_free_state(ifd_program *p)
{
    free(p->state);
}

/* A setting in [min, MLP2_MAX_DIM]; 0 is a setting the daemon was not given. The library's check
 * names the setting so that infeedd can say which flag or key it was. */
static int need(const char *key, int64_t v, int64_t min, ifd_error *err)
{
    return ifd_program_check_setting("mlp2", key, v, min, MLP2_MAX_DIM, err);
}

static int mlp2_setup(ifd_program *p, ifd_error *err)
{
    int64_t d = p->settings.features, h = p->settings.hidden, k = p->settings.classes;
    int rc = need("features", d, 1, err);
    if (rc == IFD_OK)
        rc = need("classes", k, 2, err);
    if (rc == IFD_OK)
        rc = need("hidden", h, 1, err);
    double decay;
    if (rc == IFD_OK)
        rc = ifd_program_config_float(p, "weight_decay", MLP2_WEIGHT_DECAY, 0.0, 1.0, &decay, err);
    if (rc)
        return rc;
    mlp2_state *st = malloc(sizeof *st);
    if (st == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "mlp2: state");
    st->decay = (float)decay;
    p->state = st;
    ifd_program_add_input(p, "x", IFD_F32, 1, &d);
    ifd_program_add_label(p, "y", IFD_I32, 0, NULL);
    /* Weights from mlp2_init_params; biases zeros, initialised by the runtime and left out of
     * the optimizer's decoupled weight decay (ABI 4's per-parameter initializers and flags). */
    int64_t w1[2] = {d, h}, w2[2] = {h, h}, w3[2] = {h, k};
    ifd_param_init zeros = {.kind = IFD_INIT_ZEROS};
    if (ifd_program_add_param(p, "W1", 2, w1) ||
        ifd_program_add_param_with(p, "b1", 1, &h, zeros, IFD_PARAM_NO_DECAY) ||
        ifd_program_add_param(p, "W2", 2, w2) ||
        ifd_program_add_param_with(p, "b2", 1, &h, zeros, IFD_PARAM_NO_DECAY) ||
        ifd_program_add_param(p, "W3", 2, w3) ||
        ifd_program_add_param_with(p, "b3", 1, &k, zeros, IFD_PARAM_NO_DECAY))
        return ifd_error_set(err, IFD_ENOMEM, "mlp2: cannot declare its parameters");
    p->classifier = 1;
    p->predict_cols = k;
    if (ifd_program_add_outfeed(p, "class", IFD_I32, 1, 0, NULL) ||
        ifd_program_add_outfeed(p, "confidence", IFD_F32, 1, 0, NULL) ||
        ifd_program_add_outfeed(p, "label", IFD_I32, 1, 0, NULL))
        return ifd_error_set(err, IFD_EINTERNAL, "mlp2: cannot declare its outfeed tensors");
    return IFD_OK;
}

/* splitmix64: one seed per weight matrix, so that no two share a sequence. */
static uint64_t derive_seed(uint64_t seed, uint64_t layer)
{
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (layer + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void mlp2_init_params(const ifd_program *p, float *params, uint64_t seed)
{
    for (int i = 0; i < p->nparams; i++) {
        const ifd_param_spec *ps = &p->params[i];
        if (ps->rank == 2)
            ifd_program_init_glorot(params + ps->offset, ps->dims[0], ps->dims[1],
                                    derive_seed(seed, (uint64_t)i));
        else
            memset(params + ps->offset, 0, sizeof(float) * (size_t)ps->count);
    }
}

/* h1, h2 and their gradients [rows, H]; logits and theirs [rows, K]. */
static int64_t mlp2_workspace(const ifd_program *p, int64_t rows)
{
    return rows * (4 * p->settings.hidden + 2 * p->settings.classes);
}

/* Host memory: every label in [0, K). */
static int mlp2_check(const ifd_program *p, const ifd_tensor *in, int64_t rows, ifd_error *err)
{
    const int32_t *y = in[1].data;
    for (int64_t r = 0; r < rows; r++)
        if (y[r] < 0 || y[r] >= p->settings.classes)
            return ifd_error_set(err, IFD_ERANGE,
                                 "tensor 'y' row %lld: label %d is out of range, expected 0 <= "
                                 "label < %lld",
                                 (long long)r, (int)y[r], (long long)p->settings.classes);
    return IFD_OK;
}

static const float *param(const ifd_program *p, const float *v, int i)
{
    return v + p->params[i].offset;
}

/* out [n, n_out] = in [n, n_in] W + b: one gemm_bias (program ABI 5), no residual */
static void dense(const ifd_ops *ops, int64_t n, int64_t n_in, int64_t n_out, const float *in,
                  const float *w, const float *b, float *out)
{
    ops->gemm_bias(ops->ctx, n, n_out, n_in, in, w, b, NULL, out);
}

static void forward(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a, float *h1,
                    float *h2, float *logits)
{
    int64_t d = p->settings.features, h = p->settings.hidden, k = p->settings.classes;
    int64_t n = a->rows;
    dense(ops, n, d, h, a->inputs[0].data, param(p, a->params, W1), param(p, a->params, B1), h1);
    ops->tanh(ops->ctx, n * h, h1, h1);
    dense(ops, n, h, h, h1, param(p, a->params, W2), param(p, a->params, B2), h2);
    ops->relu(ops->ctx, n * h, h2, h2);
    dense(ops, n, h, k, h2, param(p, a->params, W3), param(p, a->params, B3), logits);
}

/* dW = in^T dout, db = column sums of dout */
static void dense_grad(const ifd_ops *ops, int64_t n, int64_t n_in, int64_t n_out, const float *in,
                       const float *dout, float *dw, float *db)
{
    ops->gemm(ops->ctx, 1, 0, n_in, n_out, n, 1.0f, in, dout, 0.0f, dw);
    ops->col_sum(ops->ctx, n, n_out, dout, db);
}

static int mlp2_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                     ifd_error *err)
{
    (void)err;
    int64_t d = p->settings.features, h = p->settings.hidden, k = p->settings.classes;
    int64_t n = a->rows;
    float *h1 = a->workspace, *dh1 = h1 + n * h, *h2 = dh1 + n * h, *dh2 = h2 + n * h;
    float *logits = dh2 + n * h, *dlogits = logits + n * k;
    forward(p, ops, a, h1, h2, logits);
    /* the loss, and class and confidence from the same pass when the runtime takes the outfeed
     * tensors (class, confidence, label: see mlp2_setup) */
    void *const *o = a->outfeeds;
    ops->softmax_xent_classify(ops->ctx, n, k, logits, a->inputs[1].data, a->scale, dlogits, a->out,
                               o ? o[0] : NULL, o ? o[1] : NULL);
    if (o)
        ops->copy(ops->ctx, o[2], a->inputs[1].data, n * (int64_t)sizeof(int32_t));
    float *g = a->grads; /* NULL in eval: the loss only */
    if (g != NULL) {
        const float *pr = a->params;
        dense_grad(ops, n, h, k, h2, dlogits, g + p->params[W3].offset, g + p->params[B3].offset);
        ops->gemm(ops->ctx, 0, 1, n, h, k, 1.0f, dlogits, param(p, pr, W3), 0.0f, dh2);
        ops->relu_grad(ops->ctx, n * h, h2, dh2, dh2);
        dense_grad(ops, n, h, h, h1, dh2, g + p->params[W2].offset, g + p->params[B2].offset);
        ops->gemm(ops->ctx, 0, 1, n, h, h, 1.0f, dh2, param(p, pr, W2), 0.0f, dh1);
        ops->tanh_grad(ops->ctx, n * h, h1, dh1, dh1);
        dense_grad(ops, n, d, h, a->inputs[0].data, dh1, g + p->params[W1].offset,
                   g + p->params[B1].offset);
    }
    /* After the loss op (which sets out->loss) and the gradients (to which it adds). */
    float decay = ((const mlp2_state *)p->state)->decay;
    if (decay > 0.0f) {
        static const int weights[] = {W1, W2, W3};
        for (int i = 0; i < 3; i++) {
            const ifd_param_spec *ps = &p->params[weights[i]];
            ops->l2_decay(ops->ctx, ps->count, decay, a->scale, a->params + ps->offset,
                          g ? g + ps->offset : NULL, a->out);
        }
    }
    return IFD_OK;
}

/* Class probabilities [rows, K]. */
static int mlp2_predict(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                        ifd_error *err)
{
    (void)err;
    int64_t h = p->settings.hidden, n = a->rows;
    float *h1 = a->workspace, *h2 = h1 + 2 * n * h, *logits = h2 + 2 * n * h;
    forward(p, ops, a, h1, h2, logits);
    ops->softmax(ops->ctx, n, p->settings.classes, logits, a->predictions);
    return IFD_OK;
}

static const ifd_program_class mlp2_class = {
    .name = "mlp2",
    .description = "two hidden layers of width H = hidden (tanh, then ReLU), a softmax output and "
                   "L2 weight decay: x float32 [D], y int32 [] in [0, K)",
    .setup = mlp2_setup,
    .init_params = mlp2_init_params,
    .workspace_floats = mlp2_workspace,
    .check_batch = mlp2_check,
    .train_step = mlp2_step,
    .predict_step = mlp2_predict,
    .free_state = mlp2_free_state,
};

static int mlp2_register(ifd_program_registry *reg, ifd_error *err)
{
    return reg->add(reg, &mlp2_class, err);
}

IFD_PROGRAM_PLUGIN(mlp2_register)
