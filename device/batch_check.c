#include "device/batch_check.h"
#include "device/step.h"

#include <stdint.h>

/* An ifd_program_add_ids input: every value in [0, limit). */
static int check_ids(const ifd_input_spec *in, int64_t limit, const ifd_tensor *t, int64_t rows,
                     ifd_error *err)
{
    if (limit <= 0 || rows <= 0)
        return IFD_OK;
    int64_t per_row = 1;
    for (int d = 0; d < in->rank; d++)
        per_row *= in->dims[d];
    const int32_t *v = t->data;
    for (int64_t i = 0; i < rows * per_row; i++)
        if (v[i] < 0 || v[i] >= limit)
            return ifd_error_set(err, IFD_ERANGE,
                                 "tensor '%s' row %lld element %lld: %d is out of range, expected "
                                 "0 <= value < %lld",
                                 in->name, (long long)(i / per_row), (long long)(i % per_row),
                                 (int)v[i], (long long)limit);
    return IFD_OK;
}

int ifd_program_check_batch(const ifd_program *p, const ifd_batch *b, int64_t batch_size,
                            ifd_mode mode, ifd_error *err)
{
    char want[96], got[96];
    int idx[IFD_MAX_INPUTS];
    int n = ifd_step_inputs(p, mode, idx);
    if (b->ntensors != n)
        return ifd_error_set(err, IFD_ESHAPE, "has %d tensors, the program '%s' takes %d%s",
                             b->ntensors, p->cls->name, n,
                             mode == IFD_MODE_PREDICT ? " in predict mode (no labels)" : "");
    if (mode == IFD_MODE_PREDICT && batch_size > 0 && (b->rows < 1 || b->rows > batch_size))
        return ifd_error_set(err, IFD_ESHAPE,
                             "has %lld rows, expected 1 to %lld (the batch size; predict mode pads "
                             "a partial batch)",
                             (long long)b->rows, (long long)batch_size);
    if (mode != IFD_MODE_PREDICT && batch_size > 0 && b->rows != batch_size)
        return ifd_error_set(err, IFD_ESHAPE, "has %lld rows, expected %lld", (long long)b->rows,
                             (long long)batch_size);
    for (int j = 0; j < n; j++) {
        int i = idx[j];
        const ifd_input_spec *in = &p->inputs[i];
        const ifd_tensor *t = &b->tensors[j];
        if (t->dtype != in->dtype)
            return ifd_error_set(err, IFD_EDTYPE, "tensor '%s' has dtype %s, expected %s", in->name,
                                 ifd_dtype_name(t->dtype), ifd_dtype_name(in->dtype));
        ifd_shape expect = {.rank = in->rank + 1};
        expect.dims[0] = b->rows;
        for (int d = 0; d < in->rank; d++)
            expect.dims[d + 1] = in->dims[d];
        if (!ifd_shape_equal(&t->shape, &expect))
            return ifd_error_set(err, IFD_ESHAPE, "tensor '%s' has shape %s, expected %s", in->name,
                                 ifd_shape_format(&t->shape, got, sizeof got),
                                 ifd_shape_format(&expect, want, sizeof want));
        if (t->data == NULL && b->rows > 0)
            return ifd_error_set(err, IFD_EINVAL, "tensor '%s' has no data", in->name);
    }
    for (int j = 0; j < n; j++) {
        int rc =
            check_ids(&p->inputs[idx[j]], p->input_limit[idx[j]], &b->tensors[j], b->rows, err);
        if (rc)
            return rc;
    }
    if (p->cls->check_batch && mode != IFD_MODE_PREDICT)
        return p->cls->check_batch(p, b->tensors, b->rows, err);
    return IFD_OK;
}
