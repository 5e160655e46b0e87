/*
 * The transformer's ops on the host (issue 22): embedding lookup and its gradient, layer norm,
 * GELU, causal self-attention, each forward and backward, on row-major float32 arrays in host
 * memory. Plain functions of their arguments, one thread each; the cpu backend's op table wraps
 * them (the cuda backend has its own in cuda/nn_kernels.cu). Every sum runs in a fixed order
 * (rows in order; the embedding gradient's scatter-add in row order), so results repeat bit for
 * bit run to run.
 */
#ifndef IFD_DEVICE_NN_CPU_H
#define IFD_DEVICE_NN_CPU_H

#include <stdint.h>

/*
 * IFD_NN_WIDE: a host function's loops built for AVX-512 and AVX2 too where the compiler can
 * (GCC, clang 14 and later, x86-64), the one the CPU runs chosen at load time (target_clones):
 * 16 or 8 lanes instead of SSE's 4. Neither target enables FMA and C11 does not contract, so
 * every lane computes the baseline code's operations: the same bits on every machine
 * (test_nn_ops compares GELU with the _baseline functions below, test_nn_op_table the column
 * sums with plain loops, test_optimizer the update with device/math.h's one-element functions).
 */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define IFD_NN_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define IFD_NN_SANITIZED 1
#endif
/* Not under the sanitizers: the loader runs a static function's resolver before the runtime is
 * up, and the instrumented resolver crashes there (ThreadSanitizer). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) &&                            \
    !defined(IFD_NN_SANITIZED) && (!defined(__clang__) || __clang_major__ >= 14)
#define IFD_NN_WIDE __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define IFD_NN_WIDE
#endif

/* x[r, j] += bias[j] over rows [rows, dim] (the op set's bias_add), and y[i] += alpha x[i], i < n
 * (its add): elementwise, so their AVX-512 and AVX2 builds give the baseline's bits. */
void ifd_nn_bias_add_rows(int64_t rows, int64_t dim, const float *bias, float *x);
void ifd_nn_axpy(int64_t n, float alpha, const float *x, float *y);
/* y[r, j] = res[r, j] + bias[j] (res NULL: bias[j]) over rows [rows, dim], res may be y: the
 * start of gemm_bias's C. */
void ifd_nn_bias_fill_rows(int64_t rows, int64_t dim, const float *bias, const float *res,
                           float *y);

/* out[r, :] = table[ids[r], :], r < rows; ids in [0, vocab) (checked by the caller). */
void ifd_nn_embedding(int64_t rows, int64_t dim, const int32_t *ids, const float *table,
                      float *out);
/* dtable[ids[r], :] += dout[r, :], in row order (a deterministic scatter-add). */
void ifd_nn_embedding_grad(int64_t rows, int64_t dim, const int32_t *ids, const float *dout,
                           float *dtable);
/* The same for columns [c0, c1) only (rows in order): column ranges split over threads. */
void ifd_nn_embedding_grad_cols(int64_t rows, int64_t dim, int64_t c0, int64_t c1,
                                const int32_t *ids, const float *dout, float *dtable);

/* Layer norm over each row's dim values: y = (x - mean) * rstd * gamma + beta, rstd =
 * 1 / sqrt(var + eps) (the biased variance, as Keras and PyTorch); mean and rstd ([rows]) are
 * kept for the backward. y may be x. */
void ifd_nn_layernorm(int64_t rows, int64_t dim, const float *x, const float *gamma,
                      const float *beta, float eps, float *y, float *mean, float *rstd);
/* From the forward's x, mean and rstd: dx (written), dgamma and dbeta (added to). dx may be
 * dy. */
void ifd_nn_layernorm_grad(int64_t rows, int64_t dim, const float *x, const float *gamma,
                           const float *mean, const float *rstd, const float *dy, float *dx,
                           float *dgamma, float *dbeta);
/* ifd_nn_layernorm_grad in two parts that split over threads with the same bits: dgamma and
 * dbeta (added to) of columns [c0, c1), rows in order; and dx of rows [r0, r1). The parameters'
 * part reads dy, so when dx is dy it runs first. */
void ifd_nn_layernorm_grad_params(int64_t rows, int64_t dim, int64_t c0, int64_t c1, const float *x,
                                  const float *mean, const float *rstd, const float *dy,
                                  float *dgamma, float *dbeta);
void ifd_nn_layernorm_grad_input(int64_t r0, int64_t r1, int64_t dim, const float *x,
                                 const float *gamma, const float *mean, const float *rstd,
                                 const float *dy, float *dx);

/* out[c] = the sum over the rows of x [rows, dim] of column c, c in [c0, c1), each column's from
 * 0 over the rows in order (16 columns at a time in vector registers: the same bits). */
void ifd_nn_col_sum(int64_t rows, int64_t dim, int64_t c0, int64_t c1, const float *x, float *out);

/* GELU, exact (Keras' default approximate=False): y = x / 2 * (1 + erf(x / sqrt 2)); y may be
 * x. The gradient from the forward's input x: dx = dy * (Phi(x) + x * phi(x)); dx may be dy. */
void ifd_nn_gelu(int64_t n, const float *x, float *y);
void ifd_nn_gelu_grad(int64_t n, const float *x, const float *dy, float *dx);
/* The same two built for the baseline ISA alone, for tests: the bits must agree. ifd_nn_gelu and
 * ifd_nn_gelu_grad evaluate erf's and exp's polynomials by fmaf (one rounding a step on every
 * machine) and run AVX-512 or AVX2 lanes with FMA instructions where the CPU has them (chosen at
 * each call, not by a resolver: so under the sanitizers too); the baseline's fmaf is libm's, a
 * call an element (about 20 times slower). */
void ifd_nn_gelu_baseline(int64_t n, const float *x, float *y);
void ifd_nn_gelu_grad_baseline(int64_t n, const float *x, const float *dy, float *dx);

/*
 * Softmax cross-entropy of rows [r0, r1) of logits [*, k] against labels in [0, k): the outputs
 * of device/math.h's ifd_math_softmax_xent_classify_row (dlogits = gscale * (softmax - onehot),
 * the first argmax, its probability), with the exp by nn_cpu.c's vectorized polynomial (GELU's)
 * and each row's sum of exps in 16 float lanes, then the lanes in a fixed tree (libm's expf a
 * call an element and one chain of float adds were most of charlm's cross-entropy). Returns the sum
 * of the rows' losses in row order and adds the rows whose first argmax is the label to *correct
 * (unless NULL). labels NULL: classify only (dlogits unused). cls and conf may be NULL. The cpu
 * backend's softmax_xent, softmax_xent_classify and classify all run it, so their outputs agree
 * bit for bit.
 */
double ifd_nn_softmax_xent_rows(int64_t r0, int64_t r1, int64_t k, const float *logits,
                                const int32_t *labels, float gscale, float *dlogits,
                                int64_t *correct, int32_t *cls, float *conf);

/*
 * Causal self-attention of `batch` sequences of t positions, `heads` heads of width dh (C =
 * heads * dh). qkv is [batch * t, 3C]: each row's query, key and value, head h's in columns
 * [h dh, (h + 1) dh) of each third. out is [batch * t, C]: head h's output in its columns.
 * probs ([batch, heads, t, t]) keeps the softmax of the scaled, masked scores for the backward
 * (zero above the diagonal). Scores are scaled by 1 / sqrt(dh); position i attends to j <= i.
 */
void ifd_nn_attention(int64_t batch, int64_t t, int64_t heads, int64_t dh, const float *qkv,
                      float *probs, float *out);
/* From qkv and the forward's probs: dqkv ([batch * t, 3C], written) from dout ([batch * t, C]).
 * work: t * t floats. */
void ifd_nn_attention_grad(int64_t batch, int64_t t, int64_t heads, int64_t dh, const float *qkv,
                           const float *probs, const float *dout, float *dqkv, float *work);
/* The two above for one sequence b and one head h: each writes its own part of probs and out
 * (dqkv), so heads run on threads of their own with the same bits (work: t * t floats each). */
void ifd_nn_attention_head(int64_t t, int64_t heads, int64_t dh, int64_t b, int64_t h,
                           const float *qkv, float *probs, float *out);
void ifd_nn_attention_grad_head(int64_t t, int64_t heads, int64_t dh, int64_t b, int64_t h,
                                const float *qkv, const float *probs, const float *dout,
                                float *dqkv, float *work);

#endif
