// Compiles device/math.h as CUDA device code, so that a change that breaks the formulas' CUDA
// build fails the build here, before the CUDA backend uses them. Nothing runs this kernel.
#include "device/math.h"

extern "C" __global__ void ifd_math_check_kernel(const float *logits, const int *labels, float *out,
                                                 float *dlogits, long long rows, long long k)
{
    long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    int correct = 0;
    float loss =
        ifd_math_softmax_xent_row(logits + r * k, k, labels[r], 1.0f, dlogits + r * k, &correct);
    loss += ifd_math_sq_err_row(logits + r * k, logits + r * k, k, 1.0f, dlogits + r * k);
    float p = loss, m = 0.0f, v = 0.0f;
    ifd_math_sgd(&p, ifd_math_relu(loss), 0.1f);
    ifd_math_momentum(&p, &m, ifd_math_relu_grad(loss, 1.0f), 0.1f, 0.9f);
    ifd_math_adam(&p, &m, &v, loss, ifd_math_adam_lr(0.1f, 0.9f, 0.999f, r + 1), 0.9f, 0.999f,
                  1e-8f);
    float lr = ifd_math_lr_at((int)(r % 3), 0.1f, 0.01f, 10, 100, r);
    ifd_math_adamw(&p, &m, &v, loss * ifd_math_clip_scale(loss, 1.0f),
                   ifd_math_adam_lr(lr, 0.9f, 0.999f, r + 1), 0.9f, 0.999f, 1e-8f,
                   ifd_math_in_ranges((const int64_t *)0, 0, r) ? 0.0f : 0.01f, lr);
    p = ifd_math_l2_grad(p, ifd_math_tanh_grad(ifd_math_tanh(p), 1.0f), 1e-4f);
    out[r] = p + ifd_math_l2_term(p, 1e-4f) + (float)correct;
}
