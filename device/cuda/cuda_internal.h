/*
 * What the cuda backend's files share: the kernel launchers (kernels.cu) and the macros that turn
 * a cudaError_t or ncclResult_t into an ifd_error. Nothing outside device/cuda/ includes this
 * file: CUDA and NCCL types never leave the backend. What only its host C files share (its state,
 * the functions one file calls in another) is in cuda_backend.h.
 *
 * Every launcher clears a stale non-sticky error, enqueues on the given stream and returns
 * cudaGetLastError() (a launch configuration error), so that it may be called while the stream is
 * being captured into a graph. Pointers are device memory; sizes are element counts.
 */
#ifndef IFD_DEVICE_CUDA_INTERNAL_H
#define IFD_DEVICE_CUDA_INTERNAL_H

#include <infeed/infeed.h>

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x[r,c] += bias[c] */
cudaError_t ifd_cuda_bias_add(cudaStream_t s, int64_t rows, int64_t cols, const float *bias,
                              float *x);
/* c[r,j] = res[r,j] + bias[j] (res NULL: bias[j]); res may be c (gemm_bias's start). */
cudaError_t ifd_cuda_bias_fill(cudaStream_t s, int64_t rows, int64_t cols, const float *bias,
                               const float *res, float *c);
/* out[c] = sum over r of x[r,c], in row order (the cpu backend's order, so the same bits). */
cudaError_t ifd_cuda_col_sum(cudaStream_t s, int64_t rows, int64_t cols, const float *x,
                             float *out);
cudaError_t ifd_cuda_relu(cudaStream_t s, int64_t n, const float *x, float *y);
cudaError_t ifd_cuda_relu_grad(cudaStream_t s, int64_t n, const float *y, const float *dy,
                               float *dx);
cudaError_t ifd_cuda_tanh(cudaStream_t s, int64_t n, const float *x, float *y);
cudaError_t ifd_cuda_tanh_grad(cudaStream_t s, int64_t n, const float *y, const float *dy,
                               float *dx);
/* out->loss += scale * decay / 2 * sum w^2 (one block, in a fixed order); grad (unless NULL)
 * += scale * decay * w. */
cudaError_t ifd_cuda_l2_decay(cudaStream_t s, int64_t n, float decay, float scale, const float *w,
                              float *grad, ifd_step_out *out);
/* The ifd_ops losses (include/infeed/program.h): write dlogits/dpred and out->loss,
 * out->correct in device memory. One block; the sum over rows is in double, in a fixed order. */
cudaError_t ifd_cuda_softmax_xent(cudaStream_t s, int64_t rows, int64_t k, const float *logits,
                                  const int32_t *labels, float scale, float *dlogits,
                                  ifd_step_out *out);
/* softmax_xent and classify's outputs (cls, conf: NULL or [rows]) in the same kernel. */
cudaError_t ifd_cuda_softmax_xent_classify(cudaStream_t s, int64_t rows, int64_t k,
                                           const float *logits, const int32_t *labels, float scale,
                                           float *dlogits, ifd_step_out *out, int32_t *cls,
                                           float *conf);
/* probs[r,:] = softmax(logits[r,:]), one thread per row. */
cudaError_t ifd_cuda_softmax(cudaStream_t s, int64_t rows, int64_t k, const float *logits,
                             float *probs);
cudaError_t ifd_cuda_squared_error(cudaStream_t s, int64_t rows, int64_t k, const float *pred,
                                   const float *y, float scale, float *dpred, ifd_step_out *out);
/* cls[r] = argmax of logits[r,:], conf[r] = its softmax probability (either may be NULL), one
 * thread per row. */
cudaError_t ifd_cuda_classify(cudaStream_t s, int64_t rows, int64_t k, const float *logits,
                              int32_t *cls, float *conf);
/* *dst = the L2 norm of x[0..n) (one block, the sum in double in a fixed order). */
cudaError_t ifd_cuda_l2_norm(cudaStream_t s, int64_t n, const float *x, float *dst);
/* One optimizer update (device/step.h's optimizer_apply, but param_norm): the kernel reads
 * *opt_step (the schedule's step, Adam's t - 1), out->skipped (nonzero: nothing changes) and
 * out->grad_norm (clipping), and writes out->learning_rate; AdamW leaves the nnodecay ranges
 * at nodecay (device memory) out of decay. */
cudaError_t ifd_cuda_optimizer_apply(cudaStream_t s, const ifd_optimizer *opt,
                                     const int64_t *opt_step, int64_t n, float *params,
                                     const float *grads, float *slot0, float *slot1,
                                     const int64_t *nodecay, int64_t nnodecay, ifd_step_out *out);
/* device/step.h's guard_loss and check_grads (out->skipped is cleared by guard_loss). */
cudaError_t ifd_cuda_guard_loss(cudaStream_t s, ifd_step_out *out, float *grads);
cudaError_t ifd_cuda_check_grads(cudaStream_t s, const float *grads, int64_t n, ifd_step_out *out);
/* *step += 1, *opt_step += 1 unless out->skipped (each when not NULL), out->count = rows. */
cudaError_t ifd_cuda_finish_step(cudaStream_t s, int64_t *step, int64_t *opt_step,
                                 ifd_step_out *out, int64_t rows);

/* The transformer's kernels (nn_kernels.cu): device/nn_cpu.h's ops, the same arguments. */
cudaError_t ifd_cuda_fill(cudaStream_t s, int64_t n, float value, float *x);
cudaError_t ifd_cuda_add(cudaStream_t s, int64_t n, float alpha, const float *x, float *y);
cudaError_t ifd_cuda_embedding(cudaStream_t s, int64_t rows, int64_t dim, const int32_t *ids,
                               const float *table, float *out);
/* Deterministic without atomics: each vocabulary row is summed by one block, in row order. */
cudaError_t ifd_cuda_embedding_grad(cudaStream_t s, int64_t rows, int64_t dim, const int32_t *ids,
                                    const float *dout, float *dtable);
cudaError_t ifd_cuda_layernorm(cudaStream_t s, int64_t rows, int64_t dim, const float *x,
                               const float *gamma, const float *beta, float eps, float *y,
                               float *mean, float *rstd);
cudaError_t ifd_cuda_layernorm_grad(cudaStream_t s, int64_t rows, int64_t dim, const float *x,
                                    const float *gamma, const float *mean, const float *rstd,
                                    const float *dy, float *dx, float *dgamma, float *dbeta);
cudaError_t ifd_cuda_gelu(cudaStream_t s, int64_t n, const float *x, float *y);
cudaError_t ifd_cuda_gelu_grad(cudaStream_t s, int64_t n, const float *x, const float *dy,
                               float *dx);
/* p: nseq [t, t] score matrices, each row i replaced by the softmax of its entries 0..i and
 * zeros after (the causal mask). */
cudaError_t ifd_cuda_causal_softmax(cudaStream_t s, int64_t nseq, int64_t t, float *p);
/* dp (the gradient of causal_softmax's output p) becomes the gradient of its scores, in place. */
cudaError_t ifd_cuda_causal_softmax_grad(cudaStream_t s, int64_t nseq, int64_t t, const float *p,
                                         float *dp);

#ifdef __cplusplus
}
#endif

/*
 * CUDA_TRY_GOTO(gpu, call, rc, err, label): runs a CUDA runtime call; on failure clears CUDA's
 * last error, fills *err with "cuda backend: GPU <gpu>: <function>: <CUDA's text>", sets rc to
 * IFD_ECUDA and jumps to label (NCCL's CUDACHECKGOTO in src/include/checks.h).
 * NCCL_TRY_GOTO does the same for NCCL calls with IFD_ENCCL. gpu < 0 names no GPU.
 */
#define CUDA_TRY_GOTO(gpu, call, rc, err, label)                                                   \
    do {                                                                                           \
        cudaError_t cuda_try_e_ = (call);                                                          \
        if (cuda_try_e_ != cudaSuccess) {                                                          \
            (void)cudaGetLastError();                                                              \
            (rc) = ifd_cuda_error((err), (gpu), #call, cudaGetErrorString(cuda_try_e_));           \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define NCCL_TRY_GOTO(gpu, call, rc, err, label)                                                   \
    do {                                                                                           \
        ncclResult_t nccl_try_r_ = (call);                                                         \
        if (nccl_try_r_ != ncclSuccess) {                                                          \
            (rc) = ifd_nccl_error((err), (gpu), #call, ncclGetErrorString(nccl_try_r_));           \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Fill err with "cuda backend: GPU <gpu>: <name of the function called in expr>: <text>" and
 * return IFD_ECUDA / IFD_ENCCL. */
int ifd_cuda_error(ifd_error *err, int gpu, const char *expr, const char *text);
int ifd_nccl_error(ifd_error *err, int gpu, const char *expr, const char *text);

#endif
