/* The cpu op set's products (device/ops_gemm_cpu.c), for ifd_cpu_ops_init. ctx: the replica's
 * team (device/cpu/team.h) or NULL. */
#ifndef IFD_DEVICE_OPS_GEMM_CPU_H
#define IFD_DEVICE_OPS_GEMM_CPU_H

#include <stddef.h>
#include <stdint.h>

/* The op set's gemm (include/infeed/program.h). */
void ifd_cpu_gemm(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, const float *b, float beta, float *c);
/* The op set's gemm_bias. */
void ifd_cpu_gemm_bias(void *ctx, int64_t m, int64_t n, int64_t k, const float *a, const float *b,
                       const float *bias, const float *res, float *c);
/* One product on the caller's thread (sgemv for one output column), never split. */
void ifd_cpu_gemm_one(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      const float *b, float beta, float *c);

/*
 * A small product on the caller's thread, row-major with leading dimensions (the attention's
 * per-head blocks): a libxsmm JIT kernel where the build has libxsmm and the call fits one
 * (B not transposed, alpha 1, beta 0 or 1, every side at most IFD_GEMM_SMALL_MAX), else
 * OpenBLAS's sgemm. libxsmm's kernels read the operands where they lie; OpenBLAS's small-matrix
 * path ran these products at half the rate or less (bench_blas, bench/README.md).
 */
#define IFD_GEMM_SMALL_MAX 256
void ifd_cpu_gemm_small(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc);
/* dst[j][i] = src[i][j] for i < rows, j < cols: dst [cols, rows], src's rows ld apart (libxsmm's
 * transpose where the build has it and both sides are at most IFD_GEMM_SMALL_MAX). */
void ifd_cpu_transpose(int64_t rows, int64_t cols, const float *src, int64_t ld, float *dst);
/* "libxsmm 1.17 (cpx kernels)" where ifd_cpu_gemm_small can run libxsmm's kernels, else "OpenBLAS".
 */
const char *ifd_cpu_gemm_small_library(void);
/* The calling thread's scratch of at least `floats` floats, kept until the thread ends and
 * shared by everything on that thread that does not hold it across a call to another
 * (ifd_cpu_gemm's split along k, the attention's transposed blocks); NULL when out of memory. */
float *ifd_cpu_scratch(size_t floats);

#endif
