/* The cpu op set's products (device/ops_gemm_cpu.c), for ifd_cpu_ops_init. ctx: the replica's
 * team (device/cpu/team.h) or NULL. */
#ifndef IFD_DEVICE_OPS_GEMM_CPU_H
#define IFD_DEVICE_OPS_GEMM_CPU_H

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

#endif
