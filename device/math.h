/*
 * The elementwise math, written once. Every function here compiles as host C (the cpu backend's
 * ops loop over them) and as CUDA device code (the cuda backend's kernels call them per row or
 * element), so the CPU tests check the formulas the GPU runs. No libc beyond <math.h>, no
 * allocation, no globals.
 */
#ifndef IFD_DEVICE_MATH_H
#define IFD_DEVICE_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define IFD_HD static inline __host__ __device__
#else
#define IFD_HD static inline
#endif

/* (ifd_math_argmax_row, then the cross-entropy row, below.) */
/* The first argmax of logits[0..k) (k >= 1); *mx gets its value. */
IFD_HD int64_t ifd_math_argmax_row(const float *logits, int64_t k, float *mx)
{
    int64_t arg = 0;
    *mx = logits[0];
    for (int64_t j = 1; j < k; j++) {
        if (logits[j] > *mx) {
            *mx = logits[j];
            arg = j;
        }
    }
    return arg;
}

/* Softmax cross-entropy of one row. Writes gscale * (softmax - onehot) to dlogits (may alias
 * nothing else), returns the row's loss -log p[label] and sets *correct when the first argmax is
 * the label; from the same pass, unless NULL, *cls = that argmax and *conf = its softmax
 * probability (ifd_math_classify_row's bits). */
IFD_HD float ifd_math_softmax_xent_classify_row(const float *logits, int64_t k, int32_t label,
                                                float gscale, float *dlogits, int *correct,
                                                int32_t *cls, float *conf)
{
    float mx;
    int64_t arg = ifd_math_argmax_row(logits, k, &mx);
    /* one exp an element: e_j = exp(logits[j] - mx) kept in dlogits, p_j = e_j / sum */
    float sum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        dlogits[j] = expf(logits[j] - mx);
        sum += dlogits[j];
    }
    float inv = 1.0f / sum;
    for (int64_t j = 0; j < k; j++)
        dlogits[j] = gscale * (dlogits[j] * inv - (j == label ? 1.0f : 0.0f));
    *correct = (arg == label);
    if (cls)
        *cls = (int32_t)arg;
    if (conf)
        *conf = inv;
    return mx + logf(sum) - logits[label];
}

IFD_HD float ifd_math_softmax_xent_row(const float *logits, int64_t k, int32_t label, float gscale,
                                       float *dlogits, int *correct)
{
    return ifd_math_softmax_xent_classify_row(logits, k, label, gscale, dlogits, correct,
                                              (int32_t *)0, (float *)0);
}

/* Softmax of one row: probs[j] = exp(logits[j] - max) / sum_i exp(logits[i] - max), the same
 * max-shifted form as the cross-entropy above (one exp an element). */
IFD_HD void ifd_math_softmax_row(const float *logits, int64_t k, float *probs)
{
    float mx = logits[0];
    for (int64_t j = 1; j < k; j++)
        if (logits[j] > mx)
            mx = logits[j];
    float sum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        probs[j] = expf(logits[j] - mx);
        sum += probs[j];
    }
    float inv = 1.0f / sum;
    for (int64_t j = 0; j < k; j++)
        probs[j] *= inv;
}

/* A classifier's verdict on row r of logits [*, k]: cls[r] = the argmax (the first of equal
 * maxima, as in the cross-entropy above), conf[r] = its softmax probability,
 * 1 / sum_j exp(logits[j] - max); either output may be NULL. */
IFD_HD void ifd_math_classify_row(const float *logits, int64_t k, int64_t r, int32_t *cls,
                                  float *conf)
{
    const float *z = logits + r * k;
    float mx;
    int64_t arg = ifd_math_argmax_row(z, k, &mx);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; j++)
        sum += expf(z[j] - mx);
    if (cls)
        cls[r] = (int32_t)arg;
    if (conf)
        conf[r] = 1.0f / sum;
}

/* Least squares of one row: returns 0.5 * |pred - y|^2 and writes gscale * (pred - y). */
IFD_HD float ifd_math_sq_err_row(const float *pred, const float *y, int64_t k, float gscale,
                                 float *dpred)
{
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        float d = pred[j] - y[j];
        s += d * d;
        dpred[j] = gscale * d;
    }
    return 0.5f * s;
}

IFD_HD float ifd_math_relu(float x)
{
    return x > 0.0f ? x : 0.0f;
}

IFD_HD float ifd_math_relu_grad(float y, float dy)
{
    return y > 0.0f ? dy : 0.0f;
}

IFD_HD float ifd_math_tanh(float x)
{
    return tanhf(x);
}

/* d tanh(x) / dx = 1 - tanh(x)^2, from the forward's output y = tanh(x). */
IFD_HD float ifd_math_tanh_grad(float y, float dy)
{
    return dy * (1.0f - y * y);
}

/* L2 weight decay of one weight: its term decay / 2 * w^2 of the loss, and the gradient
 * g + coef * w it leaves (coef: scale * decay). */
IFD_HD float ifd_math_l2_term(float w, float decay)
{
    return 0.5f * decay * w * w;
}

IFD_HD float ifd_math_l2_grad(float w, float g, float coef)
{
    return g + coef * w;
}

/* Optimizer updates of one element. */
IFD_HD void ifd_math_sgd(float *p, float g, float lr)
{
    *p -= lr * g;
}

/* m = mu * m + g; p -= lr * m (TensorFlow's MomentumOptimizer without Nesterov). */
IFD_HD void ifd_math_momentum(float *p, float *m, float g, float lr, float mu)
{
    *m = mu * *m + g;
    *p -= lr * *m;
}

/* The step size of Adam at step t (1-based): lr * sqrt(1 - beta2^t) / (1 - beta1^t). */
IFD_HD float ifd_math_adam_lr(float lr, float beta1, float beta2, int64_t t)
{
    double b1t = pow((double)beta1, (double)t), b2t = pow((double)beta2, (double)t);
    return (float)((double)lr * sqrt(1.0 - b2t) / (1.0 - b1t));
}

/* m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr_t m / (sqrt(v) + eps) (TensorFlow's Adam). */
IFD_HD void ifd_math_adam(float *p, float *m, float *v, float g, float lr_t, float beta1,
                          float beta2, float eps)
{
    *m = beta1 * *m + (1.0f - beta1) * g;
    *v = beta2 * *v + (1.0f - beta2) * g * g;
    *p -= lr_t * *m / (sqrtf(*v) + eps);
}

/* AdamW (Keras 3's AdamW, Loshchilov and Hutter's decoupled weight decay): p -= p * wd * lr
 * with the schedule's rate lr (not Adam's lr_t), then Adam's update with the same g. wd = 0
 * (a parameter left out of decay) gives Adam's bits for a finite p. */
IFD_HD void ifd_math_adamw(float *p, float *m, float *v, float g, float lr_t, float beta1,
                           float beta2, float eps, float wd, float lr)
{
    *p = *p - *p * wd * lr;
    ifd_math_adam(p, m, v, g, lr_t, beta1, beta2, eps);
}

/* Clipping by global norm: the factor the gradients are multiplied by, clip / norm when norm is
 * above clip, else 1 (clip <= 0: no clipping). TensorFlow's clip_by_global_norm computes
 * clip * min(1 / norm, 1 / clip): the same up to one rounding. */
IFD_HD float ifd_math_clip_scale(float norm, float clip)
{
    return clip > 0.0f && norm > clip ? clip / norm : 1.0f;
}

/* The learning rate of update t (0-based: the updates done before it), in double, rounded once:
 * lr * t / warmup while t < warmup; then lr (constant, schedule 0), or from lr down to min_lr
 * at t = decay_steps by half a cosine (schedule 1: min_lr + (lr - min_lr) * (1 + cos(pi f)) / 2,
 * f = (t - warmup) / (decay_steps - warmup), at most 1) or linearly (schedule 2:
 * min_lr + (lr - min_lr) * (1 - f)). Optax's warmup_cosine_decay_schedule with init_value 0,
 * peak_value lr, end_value min_lr; Keras's CosineDecay with initial_learning_rate 0,
 * warmup_target lr, decay_steps decay_steps - warmup, alpha min_lr / lr. decay_steps > warmup
 * when schedule is not 0 (ifd_config_validate). */
IFD_HD float ifd_math_lr_at(int schedule, float lr, float min_lr, int64_t warmup,
                            int64_t decay_steps, int64_t t)
{
    if (t < warmup)
        return (float)((double)lr * ((double)t / (double)warmup));
    if (schedule == 0)
        return lr;
    int64_t span = decay_steps - warmup, done = t - warmup < span ? t - warmup : span;
    double f = (double)done / (double)span;
    double k = schedule == 1 ? 0.5 * (1.0 + cos(3.14159265358979323846 * f)) : 1.0 - f;
    return (float)((double)min_lr + ((double)lr - (double)min_lr) * k);
}

/* Whether element i lies in one of the sorted, disjoint ranges [r[2j], r[2j+1]), j < nranges
 * (AdamW's parameters left out of decay): a binary search, for a kernel's thread. */
IFD_HD int ifd_math_in_ranges(const int64_t *r, int64_t nranges, int64_t i)
{
    int64_t lo = 0, hi = nranges;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (i < r[2 * mid])
            hi = mid;
        else if (i >= r[2 * mid + 1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

#endif
