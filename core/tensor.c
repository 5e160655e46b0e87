#include <infeed/tensor.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const char *ifd_dtype_name(ifd_dtype dt)
{
    switch (dt) {
#define IFD_DTYPE_NAME_(name, s, size)                                                             \
    case IFD_##name:                                                                               \
        return s;
        IFD_DTYPE_MAP(IFD_DTYPE_NAME_)
#undef IFD_DTYPE_NAME_
    default:
        return "invalid";
    }
}

size_t ifd_dtype_size(ifd_dtype dt)
{
    switch (dt) {
#define IFD_DTYPE_SIZE_(name, s, size)                                                             \
    case IFD_##name:                                                                               \
        return size;
        IFD_DTYPE_MAP(IFD_DTYPE_SIZE_)
#undef IFD_DTYPE_SIZE_
    default:
        return 0;
    }
}

int ifd_dtype_parse(const char *name, ifd_dtype *out)
{
    for (int dt = IFD_DTYPE_INVALID + 1; dt < IFD_DTYPE_MAX; dt++) {
        if (strcmp(name, ifd_dtype_name((ifd_dtype)dt)) == 0) {
            *out = (ifd_dtype)dt;
            return IFD_OK;
        }
    }
    return IFD_EDTYPE;
}

int ifd_tensor_init(ifd_tensor *t, ifd_dtype dt, int rank, const int64_t *dims, void *data)
{
    if (rank < 0 || rank > IFD_MAX_RANK || ifd_dtype_size(dt) == 0)
        return IFD_EINVAL;
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->shape.rank = rank;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return IFD_EINVAL;
        t->shape.dims[i] = dims[i];
    }
    t->data = data;
    return IFD_OK;
}

int64_t ifd_shape_numel(const ifd_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++)
        n *= s->dims[i];
    return n;
}

int64_t ifd_shape_row_numel(const ifd_shape *s)
{
    int64_t n = 1;
    for (int i = 1; i < s->rank; i++)
        n *= s->dims[i];
    return n;
}

int ifd_shape_equal(const ifd_shape *a, const ifd_shape *b)
{
    if (a->rank != b->rank)
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return 0;
    return 1;
}

char *ifd_shape_format(const ifd_shape *s, char *buf, size_t len)
{
    size_t off = 0;
    off += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < s->rank && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%" PRId64, i ? ", " : "", s->dims[i]);
    if (off < len)
        snprintf(buf + off, len - off, "]");
    return buf;
}

size_t ifd_tensor_nbytes(const ifd_tensor *t)
{
    return (size_t)ifd_tensor_numel(t) * ifd_dtype_size(t->dtype);
}

size_t ifd_tensor_row_bytes(const ifd_tensor *t)
{
    return (size_t)ifd_shape_row_numel(&t->shape) * ifd_dtype_size(t->dtype);
}

int ifd_tensor_rows(const ifd_tensor *t, int64_t begin, int64_t end, ifd_tensor *out)
{
    if (t->shape.rank < 1 || begin < 0 || end < begin || end > t->shape.dims[0])
        return IFD_ERANGE;
    *out = *t;
    out->shape.dims[0] = end - begin;
    out->data = (unsigned char *)t->data + (size_t)begin * ifd_tensor_row_bytes(t);
    return IFD_OK;
}
