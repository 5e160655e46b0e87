#include "intake/inputs.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The first element of x[0..n) that is not within [-limit, limit] (NaN never is); n when none.
 * The scan is one comparison an element, folded per block so that the compiler vectorises it:
 * the exact position is looked for only in a block that failed. */
static size_t first_outside(const float *x, size_t n, float limit)
{
    enum { BLOCK = 256 };
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t e = n - b < BLOCK ? n : b + BLOCK;
        int ok = 1;
        for (size_t i = b; i < e; i++)
            ok &= fabsf(x[i]) <= limit;
        if (!ok)
            for (size_t i = b; i < e; i++)
                if (!(fabsf(x[i]) <= limit))
                    return i;
    }
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
