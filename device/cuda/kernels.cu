// The cuda backend's kernels. Every formula comes from device/math.h, the same functions the cpu
// backend loops over; these files only decide which thread runs which row or element.
#include "device/cuda/cuda_internal.h"
#include "device/cuda/launch.cuh"
#include "device/math.h"

__global__ void bias_add_kernel(int64_t rows, int64_t cols, const float *bias, float *x)
{
    GRID_STRIDE(i, rows * cols)
    {
        x[i] += bias[i % cols];
    }
}

/* c = res + bias (res NULL: bias) a row: gemm_bias's start of C */
__global__ void bias_fill_kernel(int64_t rows, int64_t cols, const float *bias, const float *res,
                                 float *c)
{
    GRID_STRIDE(i, rows * cols)
    {
        c[i] = res ? res[i] + bias[i % cols] : bias[i % cols];
    }
}

__global__ void col_sum_kernel(int64_t rows, int64_t cols, const float *x, float *out)
{
    GRID_STRIDE(c, cols)
    {
        float s = 0.0f;
        for (int64_t r = 0; r < rows; r++)
            s += x[r * cols + c];
        out[c] = s;
    }
}

__global__ void relu_kernel(int64_t n, const float *x, float *y)
{
    GRID_STRIDE(i, n)
    {
        y[i] = ifd_math_relu(x[i]);
    }
}

__global__ void relu_grad_kernel(int64_t n, const float *y, const float *dy, float *dx)
{
    GRID_STRIDE(i, n)
    {
        dx[i] = ifd_math_relu_grad(y[i], dy[i]);
    }
}

__global__ void tanh_kernel(int64_t n, const float *x, float *y)
{
    GRID_STRIDE(i, n)
    {
        y[i] = ifd_math_tanh(x[i]);
    }
}

__global__ void tanh_grad_kernel(int64_t n, const float *y, const float *dy, float *dx)
{
    GRID_STRIDE(i, n)
    {
        dx[i] = ifd_math_tanh_grad(y[i], dy[i]);
    }
}

__global__ void l2_grad_kernel(int64_t n, float coef, const float *w, float *grad)
{
    GRID_STRIDE(i, n)
    {
        grad[i] = ifd_math_l2_grad(w[i], grad[i], coef);
    }
}

// One block: thread t takes rows t, t + blockDim, ...; the partial sums are then added in a fixed
// tree order, so the result is the same run to run.
__device__ static void block_sum(double *loss, long long *count)
{
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            loss[threadIdx.x] += loss[threadIdx.x + s];
            count[threadIdx.x] += count[threadIdx.x + s];
        }
        __syncthreads();
    }
}

__global__ void softmax_xent_kernel(int64_t rows, int64_t k, const float *logits,
                                    const int32_t *labels, float scale, float *dlogits,
                                    ifd_step_out *out, int32_t *cls, float *conf)
{
    __shared__ double loss[IFD_CUDA_THREADS];
    __shared__ long long correct[IFD_CUDA_THREADS];
    float gscale = rows > 0 ? scale / (float)rows : 0.0f;
    double l = 0.0;
    long long c = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        int ok = 0;
        l += ifd_math_softmax_xent_classify_row(logits + r * k, k, labels[r], gscale,
                                                dlogits + r * k, &ok, cls ? cls + r : NULL,
                                                conf ? conf + r : NULL);
        c += ok;
    }
    loss[threadIdx.x] = l;
    correct[threadIdx.x] = c;
    __syncthreads();
    block_sum(loss, correct);
    if (threadIdx.x == 0) {
        out->loss = rows > 0 ? (float)(scale * loss[0] / (double)rows) : 0.0f;
        out->correct = (float)correct[0];
    }
}

__global__ void squared_error_kernel(int64_t rows, int64_t k, const float *pred, const float *y,
                                     float scale, float *dpred, ifd_step_out *out)
{
    __shared__ double loss[IFD_CUDA_THREADS];
    __shared__ long long unused[IFD_CUDA_THREADS];
    float gscale = rows > 0 ? scale / (float)rows : 0.0f;
    double l = 0.0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
        l += ifd_math_sq_err_row(pred + r * k, y + r * k, k, gscale, dpred + r * k);
    loss[threadIdx.x] = l;
    unused[threadIdx.x] = 0;
    __syncthreads();
    block_sum(loss, unused);
    if (threadIdx.x == 0) {
        out->loss = rows > 0 ? (float)(scale * loss[0] / (double)rows) : 0.0f;
        out->correct = 0.0f;
    }
}

// One block, as the losses: out->loss += scale * sum of the weights' terms, in a fixed order.
__global__ void l2_loss_kernel(int64_t n, float decay, float scale, const float *w,
                               ifd_step_out *out)
{
    __shared__ double loss[IFD_CUDA_THREADS];
    __shared__ long long unused[IFD_CUDA_THREADS];
    double l = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        l += ifd_math_l2_term(w[i], decay);
    loss[threadIdx.x] = l;
    unused[threadIdx.x] = 0;
    __syncthreads();
    block_sum(loss, unused);
    if (threadIdx.x == 0)
        out->loss += (float)(scale * loss[0]);
}

// A classifier's outfeed, one thread per row (device/math.h's ifd_math_classify_row).
__global__ void classify_kernel(int64_t rows, int64_t k, const float *logits, int32_t *cls,
                                float *conf)
{
    GRID_STRIDE(r, rows)
    {
        ifd_math_classify_row(logits, k, r, cls, conf);
    }
}

// *dst = the L2 norm of x, one block, the sum of squares in double in a fixed order.
__global__ void l2_norm_kernel(int64_t n, const float *x, float *dst)
{
    __shared__ double sq[IFD_CUDA_THREADS];
    __shared__ long long unused[IFD_CUDA_THREADS];
    double l = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        l += (double)x[i] * (double)x[i];
    sq[threadIdx.x] = l;
    unused[threadIdx.x] = 0;
    __syncthreads();
    block_sum(sq, unused);
    if (threadIdx.x == 0)
        *dst = (float)sqrt(sq[0]);
}

/* One update (device/step.h's optimizer_apply): the schedule's rate at *opt_step (block 0's
 * thread 0 reports it in out->learning_rate, skipped or not), the gradients scaled by the
 * clipping factor of out->grad_norm, AdamW's decay outside the nodecay ranges. */
__global__ void optimizer_kernel(ifd_optimizer opt, const int64_t *opt_step, int64_t n,
                                 float *params, const float *grads, float *slot0, float *slot1,
                                 const int64_t *nodecay, int64_t nnodecay, ifd_step_out *out)
{
    int64_t t = *opt_step;
    float lr = ifd_math_lr_at((int)opt.lr_schedule, opt.learning_rate, opt.min_learning_rate,
                              opt.warmup_steps, opt.decay_steps, t);
    if (blockIdx.x == 0 && threadIdx.x == 0)
        out->learning_rate = lr;
    if (out->skipped != 0.0f)
        return; /* a skipped step (guard_loss_kernel, check_grads_kernel) */
    float s = ifd_math_clip_scale(out->grad_norm, opt.clip_norm);
    switch (opt.kind) {
    case IFD_OPT_SGD:
        GRID_STRIDE(i, n)
        {
            ifd_math_sgd(&params[i], grads[i] * s, lr);
        }
        break;
    case IFD_OPT_MOMENTUM:
        GRID_STRIDE(i, n)
        {
            ifd_math_momentum(&params[i], &slot0[i], grads[i] * s, lr, opt.momentum);
        }
        break;
    case IFD_OPT_ADAM: {
        float lr_t = ifd_math_adam_lr(lr, opt.beta1, opt.beta2, t + 1);
        GRID_STRIDE(i, n)
        {
            ifd_math_adam(&params[i], &slot0[i], &slot1[i], grads[i] * s, lr_t, opt.beta1,
                          opt.beta2, opt.epsilon);
        }
        break;
    }
    case IFD_OPT_ADAMW: {
        float lr_t = ifd_math_adam_lr(lr, opt.beta1, opt.beta2, t + 1);
        GRID_STRIDE(i, n)
        {
            float wd = ifd_math_in_ranges(nodecay, nnodecay, i) ? 0.0f : opt.weight_decay;
            ifd_math_adamw(&params[i], &slot0[i], &slot1[i], grads[i] * s, lr_t, opt.beta1,
                           opt.beta2, opt.epsilon, wd, lr);
        }
        break;
    }
    }
}

__global__ void softmax_kernel(int64_t rows, int64_t k, const float *logits, float *probs)
{
    GRID_STRIDE(r, rows)
    {
        ifd_math_softmax_row(logits + r * k, k, probs + r * k);
    }
}

__global__ void finish_step_kernel(int64_t *step, int64_t *opt_step, ifd_step_out *out,
                                   int64_t rows)
{
    if (step)
        *step += 1;
    if (opt_step && out->skipped == 0.0f)
        *opt_step += 1;
    out->count = (float)rows;
}

/* Before the all-reduce: a replica whose loss is not finite poisons its gradients, so that
 * every replica's sum is not finite and every one skips the step. */
__global__ void guard_loss_kernel(ifd_step_out *out, float *grads)
{
    int bad = !isfinite(out->loss);
    out->loss_nonfinite = bad ? 1.0f : 0.0f;
    if (bad)
        grads[0] = __int_as_float(0x7fc00000); /* NaN */
    out->skipped = 0.0f;                       /* check_grads_kernel sets it */
}

/* After the all-reduce: out->skipped = 1 when an element is not finite (every thread that
 * finds one writes the same 1; guard_loss_kernel cleared it earlier in the stream). */
__global__ void check_grads_kernel(const float *grads, int64_t n, ifd_step_out *out)
{
    GRID_STRIDE(i, n)
    {
        if (!isfinite(grads[i])) {
            out->skipped = 1.0f;
            return;
        }
    }
}

extern "C" cudaError_t ifd_cuda_bias_add(cudaStream_t s, int64_t rows, int64_t cols,
                                         const float *bias, float *x)
{
    clear_stale_error();
    if (rows > 0 && cols > 0)
        bias_add_kernel<<<grid_for(rows * cols), IFD_CUDA_THREADS, 0, s>>>(rows, cols, bias, x);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_bias_fill(cudaStream_t s, int64_t rows, int64_t cols,
                                          const float *bias, const float *res, float *c)
{
    clear_stale_error();
    if (rows > 0 && cols > 0)
        bias_fill_kernel<<<grid_for(rows * cols), IFD_CUDA_THREADS, 0, s>>>(rows, cols, bias, res,
                                                                            c);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_col_sum(cudaStream_t s, int64_t rows, int64_t cols, const float *x,
                                        float *out)
{
    clear_stale_error();
    if (cols > 0)
        col_sum_kernel<<<grid_for(cols), IFD_CUDA_THREADS, 0, s>>>(rows, cols, x, out);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_relu(cudaStream_t s, int64_t n, const float *x, float *y)
{
    clear_stale_error();
    if (n > 0)
        relu_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_relu_grad(cudaStream_t s, int64_t n, const float *y,
                                          const float *dy, float *dx)
{
    clear_stale_error();
    if (n > 0)
        relu_grad_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, y, dy, dx);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_tanh(cudaStream_t s, int64_t n, const float *x, float *y)
{
    clear_stale_error();
    if (n > 0)
        tanh_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_tanh_grad(cudaStream_t s, int64_t n, const float *y,
                                          const float *dy, float *dx)
{
    clear_stale_error();
    if (n > 0)
        tanh_grad_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, y, dy, dx);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_l2_decay(cudaStream_t s, int64_t n, float decay, float scale,
                                         const float *w, float *grad, ifd_step_out *out)
{
    clear_stale_error();
    l2_loss_kernel<<<1, IFD_CUDA_THREADS, 0, s>>>(n, decay, scale, w, out);
    if (grad != NULL && n > 0)
        l2_grad_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, scale * decay, w, grad);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_softmax_xent(cudaStream_t s, int64_t rows, int64_t k,
                                             const float *logits, const int32_t *labels,
                                             float scale, float *dlogits, ifd_step_out *out)
{
    clear_stale_error();
    softmax_xent_kernel<<<1, IFD_CUDA_THREADS, 0, s>>>(rows, k, logits, labels, scale, dlogits, out,
                                                       NULL, NULL);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_softmax_xent_classify(cudaStream_t s, int64_t rows, int64_t k,
                                                      const float *logits, const int32_t *labels,
                                                      float scale, float *dlogits,
                                                      ifd_step_out *out, int32_t *cls, float *conf)
{
    clear_stale_error();
    softmax_xent_kernel<<<1, IFD_CUDA_THREADS, 0, s>>>(rows, k, logits, labels, scale, dlogits, out,
                                                       cls, conf);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_softmax(cudaStream_t s, int64_t rows, int64_t k,
                                        const float *logits, float *probs)
{
    clear_stale_error();
    if (rows > 0 && k > 0)
        softmax_kernel<<<grid_for(rows), IFD_CUDA_THREADS, 0, s>>>(rows, k, logits, probs);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_squared_error(cudaStream_t s, int64_t rows, int64_t k,
                                              const float *pred, const float *y, float scale,
                                              float *dpred, ifd_step_out *out)
{
    clear_stale_error();
    squared_error_kernel<<<1, IFD_CUDA_THREADS, 0, s>>>(rows, k, pred, y, scale, dpred, out);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_optimizer_apply(cudaStream_t s, const ifd_optimizer *opt,
                                                const int64_t *opt_step, int64_t n, float *params,
                                                const float *grads, float *slot0, float *slot1,
                                                const int64_t *nodecay, int64_t nnodecay,
                                                ifd_step_out *out)
{
    clear_stale_error();
    /* n = 0 still reports the learning rate */
    unsigned int grid = n > 0 ? grid_for(n) : 1;
    optimizer_kernel<<<grid, IFD_CUDA_THREADS, 0, s>>>(*opt, opt_step, n, params, grads, slot0,
                                                       slot1, nodecay, nnodecay, out);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_classify(cudaStream_t s, int64_t rows, int64_t k,
                                         const float *logits, int32_t *cls, float *conf)
{
    clear_stale_error();
    if (rows > 0 && k > 0)
        classify_kernel<<<grid_for(rows), IFD_CUDA_THREADS, 0, s>>>(rows, k, logits, cls, conf);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_l2_norm(cudaStream_t s, int64_t n, const float *x, float *dst)
{
    clear_stale_error();
    l2_norm_kernel<<<1, IFD_CUDA_THREADS, 0, s>>>(n, x, dst);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_guard_loss(cudaStream_t s, ifd_step_out *out, float *grads)
{
    clear_stale_error();
    guard_loss_kernel<<<1, 1, 0, s>>>(out, grads);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_check_grads(cudaStream_t s, const float *grads, int64_t n,
                                            ifd_step_out *out)
{
    clear_stale_error();
    if (n > 0)
        check_grads_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(grads, n, out);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_finish_step(cudaStream_t s, int64_t *step, int64_t *opt_step,
                                            ifd_step_out *out, int64_t rows)
{
    clear_stale_error();
    finish_step_kernel<<<1, 1, 0, s>>>(step, opt_step, out, rows);
    return cudaGetLastError();
}
