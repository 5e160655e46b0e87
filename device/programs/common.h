/* What the built-in programs share: settings checks, the label check of classifiers, and the dense
 * layer logits = x W + b with its gradients, around which linear and softmax differ only in their
 * loss (mlp stacks two of them). */
#ifndef IFD_DEVICE_PROGRAMS_COMMON_H
#define IFD_DEVICE_PROGRAMS_COMMON_H

#include <infeed/program.h>

#include <inttypes.h>
#include <string.h>

#define IFD_PROGRAM_MAX_DIM (1 << 20)

/* A setting that must lie in [min, max]; 0 is a setting not set (include/infeed/program.h). */
static inline int ifd_program_need(const ifd_program *p, const char *key, int64_t v, int64_t min,
                                   int64_t max, ifd_error *err)
{
    return ifd_program_check_setting(p->cls->name, key, v, min, max, err);
}

/* Host memory: every int32 label in in[label] lies in [0, K), K = classes; the sentence names the
 * first row that does not, and its label. */
static inline int ifd_program_check_labels(const ifd_program *p, const ifd_tensor *in, int label,
                                           int64_t rows, ifd_error *err)
{
    const int32_t *y = in[label].data;
    int64_t k = p->settings.classes;
    for (int64_t r = 0; r < rows; r++)
        if (y[r] < 0 || y[r] >= k)
            return ifd_error_set(err, IFD_ERANGE,
                                 "tensor '%s' row %lld: label %d is out of range, expected 0 <= "
                                 "label < %lld",
                                 p->inputs[label].name, (long long)r, (int)y[r], (long long)k);
    return IFD_OK;
}

/* Inputs x float32 [D] and the label y (y_dtype, per-row shape y_rank ? [K] : []), with
 * D = features >= 1 and K = classes >= min_classes; predict mode writes K floats a row. */
static inline int ifd_dense_io_setup(ifd_program *p, ifd_dtype y_dtype, int y_rank,
                                     int64_t min_classes, ifd_error *err)
{
    int64_t d = p->settings.features, k = p->settings.classes;
    int rc = ifd_program_need(p, "features", d, 1, IFD_PROGRAM_MAX_DIM, err);
    if (rc == IFD_OK)
        rc = ifd_program_need(p, "classes", k, min_classes, IFD_PROGRAM_MAX_DIM, err);
    if (rc)
        return rc;
    ifd_program_add_input(p, "x", IFD_F32, 1, &d);
    ifd_program_add_label(p, "y", y_dtype, y_rank, &k);
    p->predict_cols = k;
    return IFD_OK;
}

/* A bias [n]: zeros (the runtime's; init_params writes the same zeros, for callers that run it
 * alone), no weight decay. */
static inline int ifd_program_add_bias(ifd_program *p, const char *name, int64_t n)
{
    ifd_param_init zeros = {.kind = IFD_INIT_ZEROS};
    return ifd_program_add_param_with(p, name, 1, &n, zeros, IFD_PARAM_NO_DECAY);
}

/* The inputs of ifd_dense_io_setup and the parameters W [D,K] and b [K]. */
static inline int ifd_dense_setup(ifd_program *p, ifd_dtype y_dtype, int y_rank,
                                  int64_t min_classes, int classifier, ifd_error *err)
{
    int rc = ifd_dense_io_setup(p, y_dtype, y_rank, min_classes, err);
    if (rc)
        return rc;
    int64_t wdims[2] = {p->settings.features, p->settings.classes};
    rc = ifd_program_add_param(p, "W", 2, wdims);
    if (rc == IFD_OK)
        rc = ifd_program_add_bias(p, "b", wdims[1]);
    p->classifier = classifier;
    return rc;
}

/* A classifier's outfeed tensors, in this order: "class" (int32 a row, the argmax of the
 * logits), "confidence" (float32 a row, its softmax probability) and "label" (int32 a row, a
 * copy of the label input). */
enum { IFD_OUT_CLASS = 0, IFD_OUT_CONFIDENCE, IFD_OUT_LABEL };

static inline int ifd_classifier_outfeeds_setup(ifd_program *p)
{
    int rc = ifd_program_add_outfeed(p, "class", IFD_I32, 1, 0, NULL);
    if (rc == IFD_OK)
        rc = ifd_program_add_outfeed(p, "confidence", IFD_F32, 1, 0, NULL);
    if (rc == IFD_OK)
        rc = ifd_program_add_outfeed(p, "label", IFD_I32, 1, 0, NULL);
    return rc;
}

/* A classifier's loss over logits [rows, K] against the int32 labels a->inputs[1] (writes
 * a->out and dlogits), and, when the runtime takes outfeed tensors this step, them: class and
 * confidence from the same pass over the logits, the label copied. */
static inline void ifd_classifier_loss(const ifd_ops *ops, const ifd_step_args *a, int64_t k,
                                       const float *logits, float *dlogits)
{
    void *const *o = a->outfeeds;
    const int32_t *labels = a->inputs[1].data;
    ops->softmax_xent_classify(ops->ctx, a->rows, k, logits, labels, a->scale, dlogits, a->out,
                               o ? o[IFD_OUT_CLASS] : NULL, o ? o[IFD_OUT_CONFIDENCE] : NULL);
    if (o)
        ops->copy(ops->ctx, o[IFD_OUT_LABEL], labels, a->rows * (int64_t)sizeof(int32_t));
}

/* W Glorot-uniform from seed, b zero. */
static inline void ifd_dense_init_params(const ifd_program *p, float *params, uint64_t seed)
{
    const ifd_param_spec *w = &p->params[0], *b = &p->params[1];
    ifd_program_init_glorot(params + w->offset, w->dims[0], w->dims[1], seed);
    memset(params + b->offset, 0, sizeof(float) * (size_t)b->count);
}

/* logits [rows, K] and their gradient [rows, K]. */
static inline int64_t ifd_dense_workspace(const ifd_program *p, int64_t rows)
{
    return 2 * rows * p->settings.classes;
}

/* One dense layer over rows rows: out [rows, n_out] = x [rows, n_in] w [n_in, n_out] + b. */
static inline void ifd_dense_forward(const ifd_ops *ops, int64_t rows, int64_t n_in, int64_t n_out,
                                     const float *x, const float *w, const float *b, float *out)
{
    ops->gemm(ops->ctx, 0, 0, rows, n_out, n_in, 1.0f, x, w, 0.0f, out);
    ops->bias_add(ops->ctx, rows, n_out, b, out);
}

/* Its parameter gradients from dout [rows, n_out]: dw = x^T dout, db = column sums of dout. */
static inline void ifd_dense_backward(const ifd_ops *ops, int64_t rows, int64_t n_in, int64_t n_out,
                                      const float *x, const float *dout, float *dw, float *db)
{
    ops->gemm(ops->ctx, 1, 0, n_in, n_out, rows, 1.0f, x, dout, 0.0f, dw);
    ops->col_sum(ops->ctx, rows, n_out, dout, db);
}

/* The loss of a dense program: writes a->out and the gradient of the loss w.r.t. logits. */
typedef void (*ifd_dense_loss)(const ifd_ops *ops, int64_t rows, int64_t k, const float *logits,
                               const void *y, float scale, float *dlogits, ifd_step_out *out);

/* logits = x W + b; loss (NULL: the classifier's, ifd_classifier_loss); dW = x^T dlogits; db =
 * column sums of dlogits (not in eval: a->grads NULL). */
static inline void ifd_dense_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                                  ifd_dense_loss loss)
{
    int64_t d = p->settings.features, k = p->settings.classes, n = a->rows;
    const float *x = a->inputs[0].data;
    const float *w = a->params + p->params[0].offset, *b = a->params + p->params[1].offset;
    float *logits = a->workspace, *dlogits = a->workspace + n * k;

    ifd_dense_forward(ops, n, d, k, x, w, b, logits);
    if (loss)
        loss(ops, n, k, logits, a->inputs[1].data, a->scale, dlogits, a->out);
    else
        ifd_classifier_loss(ops, a, k, logits, dlogits);
    if (a->grads == NULL)
        return;
    ifd_dense_backward(ops, n, d, k, x, dlogits, a->grads + p->params[0].offset,
                       a->grads + p->params[1].offset);
}

/* The predict step of a dense program: a->predictions = x W + b, through the softmax for
 * classifiers (the logits go through the workspace first). */
static inline void ifd_dense_predict(const ifd_program *p, const ifd_ops *ops,
                                     const ifd_step_args *a)
{
    int64_t d = p->settings.features, k = p->settings.classes, n = a->rows;
    const float *x = a->inputs[0].data;
    const float *w = a->params + p->params[0].offset, *b = a->params + p->params[1].offset;
    float *logits = p->classifier ? a->workspace : a->predictions;
    ifd_dense_forward(ops, n, d, k, x, w, b, logits);
    if (p->classifier)
        ops->softmax(ops->ctx, n, k, logits, a->predictions);
}

#endif
