#include "intake/inputs.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* |x| <= limit on the bits, for a limit in [0, FLT_MAX]: a non-negative float's bits order as its
 * value, and the magnitude bits of inf and of every NaN lie above FLT_MAX's, so the test is exactly
 * fabsf(x) <= limit, NaN included. It is an integer comparison (both sides below 2^31, so signed),
 * which the compiler vectorises whatever the floating-point flags; a float comparison under
 * trapping math stays one scalar compare and branch an element (8 % of the daemon's samples for
 * MLP batch 1024 inputs, bench/README.md). */
typedef int32_t aliased_i32 __attribute__((may_alias));
enum { BLOCK = 256 };

/* Whether some element of the block x[0..BLOCK) is outside (0 or 1). */
static inline __attribute__((always_inline)) int block_bad(const aliased_i32 *x, int32_t lim)
{
    int32_t bad = 0;
    for (int i = 0; i < BLOCK; i++)
        bad |= (x[i] & 0x7fffffff) > lim;
    return bad;
}

__attribute__((target("avx2"))) static int block_bad_avx2(const aliased_i32 *x, int32_t lim)
{
    return block_bad(x, lim);
}

static int block_bad_sse2(const aliased_i32 *x, int32_t lim)
{
    return block_bad(x, lim);
}

/* The first element of x[0..n) that is not within [-limit, limit] (NaN never is); n when none.
 * Whole blocks are scanned for any bad element (AVX2 where the CPU has it, read at each call as
 * device/nn_cpu.c does: no resolver the sanitizers' startup would run); the exact position is
 * looked for only in a block that failed, and in the tail. */
static size_t first_outside(const float *x, size_t n, float limit)
{
    int32_t lim;
    memcpy(&lim, &limit, sizeof lim);
    const aliased_i32 *bits = (const aliased_i32 *)x;
    int (*bad)(const aliased_i32 *, int32_t) =
        __builtin_cpu_supports("avx2") ? block_bad_avx2 : block_bad_sse2;
    size_t b = 0;
    for (; n - b >= BLOCK; b += BLOCK)
        if (bad(bits + b, lim))
            break;
    for (size_t i = b; i < n; i++)
        if ((bits[i] & 0x7fffffff) > lim)
            return i;
    return n;
}

int ifd_infeed_check_values(const ifd_program *p, const ifd_batch *b, ifd_mode mode, double max_abs,
                            ifd_error *err)
{
    int idx[IFD_MAX_INPUTS];
    int n = ifd_infeed_mode_inputs(p, mode, idx);
    float limit = max_abs > 0 && max_abs < FLT_MAX ? (float)max_abs : FLT_MAX;
    for (int j = 0; j < n && j < b->ntensors; j++) {
        const ifd_tensor *t = &b->tensors[j];
        if (t->dtype != IFD_F32 || t->data == NULL)
            continue;
        size_t count = ifd_tensor_nbytes(t) / sizeof(float);
        size_t at = first_outside(t->data, count, limit);
        if (at == count)
            continue;
        size_t per_row = b->rows > 0 ? count / (size_t)b->rows : 1;
        float v = ((const float *)t->data)[at];
        const char *name = p->inputs[idx[j]].name;
        long long row = (long long)(at / per_row), col = (long long)(at % per_row);
        if (!isfinite(v))
            return ifd_error_set(err, IFD_ERANGE,
                                 "tensor '%s' row %lld element %lld: expected a finite value, got "
                                 "%s (check_finite; --check-finite off accepts it)",
                                 name, row, col,
                                 isnan(v) ? "NaN"
                                 : v > 0  ? "inf"
                                          : "-inf");
        return ifd_error_set(err, IFD_ERANGE,
                             "tensor '%s' row %lld element %lld: expected a magnitude of at most "
                             "%g (max_abs_input), got %g",
                             name, row, col, max_abs, (double)v);
    }
    return IFD_OK;
}
