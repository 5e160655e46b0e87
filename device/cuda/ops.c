/*
 * The cuda backend (cuda_backend.h lists its files): the op set (include/infeed/program.h) on a
 * replica's compute stream, cuBLAS for the products and kernels.cu / nn_kernels.cu for the rest.
 * An op cannot return an error: the first failure is kept in the replica (ifd_cu_op_check) and
 * the step reports it.
 */
#include "device/cuda/cuda_backend.h"

#include <limits.h>
#include <math.h>

/* ---- the op set (include/infeed/program.h) on the compute stream ---------------------------- */

static void op_fail(cu_replica *rep, int code, const char *what, const char *text)
{
    if (rep->op_rc == IFD_OK)
        rep->op_rc =
            ifd_error_set(&rep->op_err, code, "cuda backend: GPU %d: %s: %s", rep->gpu, what, text);
}

void ifd_cu_op_check(cu_replica *rep, cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        op_fail(rep, IFD_ECUDA, what, cudaGetErrorString(e));
    }
}

static int ld(int64_t v)
{
    return v > 1 ? (int)v : 1;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and m, n
 * and keep the row-major leading dimensions (as cblas with CblasRowMajor). */
void ifd_cu_gemm(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, const float *b, float beta, float *c)
{
    cu_replica *rep = ctx;
    if (rep->op_rc)
        return;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
        op_fail(rep, IFD_EINVAL, "cublasSgemm", "a dimension exceeds INT_MAX");
        return;
    }
    cublasStatus_t st = cublasSgemm(rep->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha,
                                    b, ld(tb ? k : n), a, ld(ta ? m : k), &beta, c, ld(n));
    if (st != CUBLAS_STATUS_SUCCESS)
        op_fail(rep, IFD_ECUDA, "cublasSgemm", cublasGetStatusString(st));
}

void ifd_cu_bias_add(void *ctx, int64_t rows, int64_t cols, const float *bias, float *x)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_bias_add(rep->cs, rows, cols, bias, x), "bias_add kernel");
}

/* C starts as res + bias, then cublasSgemm adds the product (beta 1). */
void ifd_cu_gemm_bias(void *ctx, int64_t m, int64_t n, int64_t k, const float *a, const float *b,
                      const float *bias, const float *res, float *c)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_bias_fill(rep->cs, m, n, bias, res, c), "bias_fill kernel");
    ifd_cu_gemm(ctx, 0, 0, m, n, k, 1.0f, a, b, 1.0f, c);
}

void ifd_cu_col_sum(void *ctx, int64_t rows, int64_t cols, const float *x, float *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_col_sum(rep->cs, rows, cols, x, out), "col_sum kernel");
}

void ifd_cu_relu(void *ctx, int64_t n, const float *x, float *y)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_relu(rep->cs, n, x, y), "relu kernel");
}

void ifd_cu_relu_grad(void *ctx, int64_t n, const float *y, const float *dy, float *dx)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_relu_grad(rep->cs, n, y, dy, dx), "relu_grad kernel");
}

void ifd_cu_tanh(void *ctx, int64_t n, const float *x, float *y)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_tanh(rep->cs, n, x, y), "tanh kernel");
}

void ifd_cu_tanh_grad(void *ctx, int64_t n, const float *y, const float *dy, float *dx)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_tanh_grad(rep->cs, n, y, dy, dx), "tanh_grad kernel");
}

void ifd_cu_l2_decay(void *ctx, int64_t n, float decay, float scale, const float *w, float *grad,
                     ifd_step_out *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_l2_decay(rep->cs, n, decay, scale, w, grad, out),
                        "l2_decay kernel");
}

void ifd_cu_softmax_xent(void *ctx, int64_t rows, int64_t k, const float *logits,
                         const int32_t *labels, float scale, float *dlogits, ifd_step_out *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(
            rep, ifd_cuda_softmax_xent(rep->cs, rows, k, logits, labels, scale, dlogits, out),
            "softmax_xent kernel");
}

void ifd_cu_softmax_xent_classify(void *ctx, int64_t rows, int64_t k, const float *logits,
                                  const int32_t *labels, float scale, float *dlogits,
                                  ifd_step_out *out, int32_t *cls, float *conf)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep,
                        ifd_cuda_softmax_xent_classify(rep->cs, rows, k, logits, labels, scale,
                                                       dlogits, out, cls, conf),
                        "softmax_xent_classify kernel");
}

void ifd_cu_softmax(void *ctx, int64_t rows, int64_t k, const float *logits, float *probs)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_softmax(rep->cs, rows, k, logits, probs), "softmax kernel");
}

void ifd_cu_squared_error(void *ctx, int64_t rows, int64_t k, const float *pred, const float *y,
                          float scale, float *dpred, ifd_step_out *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_squared_error(rep->cs, rows, k, pred, y, scale, dpred, out),
                        "squared_error kernel");
}

void ifd_cu_classify(void *ctx, int64_t rows, int64_t k, const float *logits, int32_t *cls,
                     float *conf)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_classify(rep->cs, rows, k, logits, cls, conf),
                        "classify kernel");
}

void ifd_cu_copy(void *ctx, void *dst, const void *src, int64_t bytes)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK && bytes > 0)
        ifd_cu_op_check(rep,
                        cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, rep->cs),
                        "cudaMemcpyAsync (copy op)");
}

/* ---- the transformer's ops (ABI 4; kernels in nn_kernels.cu) ----------------------------------
 */

/* cublasSgemmStridedBatched on row-major operands with their own leading dimensions: the swap of
 * ifd_cu_gemm (column-major C^T = op(B)^T op(A)^T), each matrix of the batch stride floats after
 * the previous one. */
static void gemm_batched(cu_replica *rep, int ta, int tb, int64_t m, int64_t n, int64_t k,
                         float alpha, const float *a, int64_t lda, int64_t stride_a, const float *b,
                         int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                         int64_t stride_c, int64_t batch)
{
    if (rep->op_rc || batch <= 0)
        return;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX || batch > INT_MAX) {
        op_fail(rep, IFD_EINVAL, "cublasSgemmStridedBatched",
                "a dimension, leading dimension or batch count exceeds INT_MAX");
        return;
    }
    cublasStatus_t st = cublasSgemmStridedBatched(
        rep->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
        (int)k, &alpha, b, ld(ldb), stride_b, a, ld(lda), stride_a, &beta, c, ld(ldc), stride_c,
        (int)batch);
    if (st != CUBLAS_STATUS_SUCCESS)
        op_fail(rep, IFD_ECUDA, "cublasSgemmStridedBatched", cublasGetStatusString(st));
}

void ifd_cu_gemm_strided_batched(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k,
                                 float alpha, const float *a, int64_t stride_a, const float *b,
                                 int64_t stride_b, float beta, float *c, int64_t stride_c,
                                 int64_t batch)
{
    gemm_batched(ctx, ta, tb, m, n, k, alpha, a, ta ? m : k, stride_a, b, tb ? k : n, stride_b,
                 beta, c, n, stride_c, batch);
}

void ifd_cu_fill(void *ctx, int64_t n, float value, float *x)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_fill(rep->cs, n, value, x), "fill kernel");
}

void ifd_cu_add(void *ctx, int64_t n, float alpha, const float *x, float *y)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_add(rep->cs, n, alpha, x, y), "add kernel");
}

void ifd_cu_embedding(void *ctx, int64_t rows, int64_t dim, const int32_t *ids, const float *table,
                      float *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_embedding(rep->cs, rows, dim, ids, table, out),
                        "embedding kernel");
}

void ifd_cu_embedding_grad(void *ctx, int64_t rows, int64_t dim, const int32_t *ids,
                           const float *dout, float *dtable)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_embedding_grad(rep->cs, rows, dim, ids, dout, dtable),
                        "embedding_grad kernel");
}

void ifd_cu_layernorm(void *ctx, int64_t rows, int64_t dim, const float *x, const float *gamma,
                      const float *beta, float eps, float *y, float *mean, float *rstd)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep,
                        ifd_cuda_layernorm(rep->cs, rows, dim, x, gamma, beta, eps, y, mean, rstd),
                        "layernorm kernel");
}

void ifd_cu_layernorm_grad(void *ctx, int64_t rows, int64_t dim, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep,
                        ifd_cuda_layernorm_grad(rep->cs, rows, dim, x, gamma, mean, rstd, dy, dx,
                                                dgamma, dbeta),
                        "layernorm_grad kernel");
}

void ifd_cu_gelu(void *ctx, int64_t n, const float *x, float *y)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_gelu(rep->cs, n, x, y), "gelu kernel");
}

void ifd_cu_gelu_grad(void *ctx, int64_t n, const float *x, const float *dy, float *dx)
{
    cu_replica *rep = ctx;
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_gelu_grad(rep->cs, n, x, dy, dx), "gelu_grad kernel");
}

/*
 * The attention's per-(sequence, head) matrices as strided batches. Head h of sequence b has its
 * query, key and value [t, dh] at qkv + b t ld + h dh (+ C, + 2C; row stride ld = 3C), its output
 * at out + b t C + h dh (row stride C) and its [t, t] probabilities at probs + (b heads + h) t t.
 * One batched product covers the sequences of one head (or, with fewer sequences than heads, the
 * heads of one sequence): outer products of inner matrices each, at these offsets and strides.
 */
typedef struct attn_plan {
    int64_t outer, inner;
    int64_t qkv_off, qkv_stride; /* qkv and dqkv */
    int64_t out_off, out_stride; /* out and dout */
    int64_t p_off, p_stride;     /* probs and work */
} attn_plan;

static attn_plan attn_plan_for(int64_t batch, int64_t t, int64_t heads, int64_t dh)
{
    int64_t c = heads * dh, ld = 3 * c;
    if (heads <= batch) /* outer: heads; inner: sequences */
        return (attn_plan){heads, batch, dh, t * ld, dh, t * c, t * t, heads * t * t};
    return (attn_plan){batch, heads, t * ld, dh, t * c, dh, heads * t * t, t * t};
}

void ifd_cu_attention(void *ctx, int64_t batch, int64_t t, int64_t heads, int64_t dh,
                      const float *qkv, float *probs, float *out)
{
    cu_replica *rep = ctx;
    if (rep->op_rc || batch <= 0 || t <= 0 || heads <= 0 || dh <= 0)
        return;
    int64_t c = heads * dh, ld = 3 * c;
    float scale = 1.0f / sqrtf((float)dh);
    attn_plan pl = attn_plan_for(batch, t, heads, dh);
    for (int64_t o = 0; o < pl.outer; o++) { /* S = scale Q K^T */
        const float *q = qkv + o * pl.qkv_off;
        gemm_batched(rep, 0, 1, t, t, dh, scale, q, ld, pl.qkv_stride, q + c, ld, pl.qkv_stride,
                     0.0f, probs + o * pl.p_off, t, pl.p_stride, pl.inner);
    }
    if (rep->op_rc == IFD_OK)
        ifd_cu_op_check(rep, ifd_cuda_causal_softmax(rep->cs, batch * heads, t, probs),
                        "causal_softmax kernel");
    for (int64_t o = 0; o < pl.outer; o++) /* O = P V */
        gemm_batched(rep, 0, 0, t, dh, t, 1.0f, probs + o * pl.p_off, t, pl.p_stride,
                     qkv + o * pl.qkv_off + 2 * c, ld, pl.qkv_stride, 0.0f, out + o * pl.out_off, c,
                     pl.out_stride, pl.inner);
}

void ifd_cu_attention_grad(void *ctx, int64_t batch, int64_t t, int64_t heads, int64_t dh,
                           const float *qkv, const float *probs, const float *dout, float *dqkv,
                           float *work)
{
    cu_replica *rep = ctx;
    if (rep->op_rc || batch <= 0 || t <= 0 || heads <= 0 || dh <= 0)
        return;
    int64_t c = heads * dh, ld = 3 * c;
    float scale = 1.0f / sqrtf((float)dh);
    attn_plan pl = attn_plan_for(batch, t, heads, dh);
    for (int64_t o = 0; o < pl.outer; o++) {
        const float *v = qkv + o * pl.qkv_off + 2 * c, *p = probs + o * pl.p_off;
        const float *d_o = dout + o * pl.out_off;
        gemm_batched(rep, 1, 0, t, dh, t, 1.0f, p, t, pl.p_stride, d_o, c, pl.out_stride, 0.0f,
                     dqkv + o * pl.qkv_off + 2 * c, ld, pl.qkv_stride, pl.inner); /* dV = P^T dO */
        gemm_batched(rep, 0, 1, t, t, dh, 1.0f, d_o, c, pl.out_stride, v, ld, pl.qkv_stride, 0.0f,
                     work + o * pl.p_off, t, pl.p_stride, pl.inner); /* dP = dO V^T */
    }
    if (rep->op_rc == IFD_OK) /* dS = P (dP - rowsum(P dP)) */
        ifd_cu_op_check(rep, ifd_cuda_causal_softmax_grad(rep->cs, batch * heads, t, probs, work),
                        "causal_softmax_grad kernel");
    for (int64_t o = 0; o < pl.outer; o++) {
        const float *q = qkv + o * pl.qkv_off, *ds = work + o * pl.p_off;
        float *dq = dqkv + o * pl.qkv_off;
        gemm_batched(rep, 0, 0, t, dh, t, scale, ds, t, pl.p_stride, q + c, ld, pl.qkv_stride, 0.0f,
                     dq, ld, pl.qkv_stride, pl.inner); /* dQ = scale dS K */
        gemm_batched(rep, 1, 0, t, dh, t, scale, ds, t, pl.p_stride, q, ld, pl.qkv_stride, 0.0f,
                     dq + c, ld, pl.qkv_stride, pl.inner); /* dK = scale dS^T Q */
    }
}
