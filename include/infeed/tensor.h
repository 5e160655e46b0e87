/*
 * Tensor views: a dtype, a shape and a pointer to row-major, batch-major data that the view does
 * not own. Slicing rows makes another view of the same bytes; nothing here copies or frees.
 */
#ifndef IFD_TENSOR_H
#define IFD_TENSOR_H

#include <infeed/error.h>

#include <stddef.h>
#include <stdint.h>

#define IFD_MAX_RANK 8

#define IFD_DTYPE_MAP(XX)                                                                          \
    XX(F32, "float32", 4)                                                                          \
    XX(I32, "int32", 4)                                                                            \
    XX(I64, "int64", 8)                                                                            \
    XX(U8, "uint8", 1)

typedef enum {
    IFD_DTYPE_INVALID = 0,
#define IFD_DTYPE_ENUM_(name, s, size) IFD_##name,
    IFD_DTYPE_MAP(IFD_DTYPE_ENUM_)
#undef IFD_DTYPE_ENUM_
        IFD_DTYPE_MAX
} ifd_dtype;

/* "float32"; "invalid" for an unknown dtype. */
const char *ifd_dtype_name(ifd_dtype dt);
/* Bytes per element; 0 for an unknown dtype. */
size_t ifd_dtype_size(ifd_dtype dt);
/* IFD_OK and *out, or IFD_EDTYPE for a name that is not a dtype. */
int ifd_dtype_parse(const char *name, ifd_dtype *out);

typedef struct ifd_shape {
    int rank;
    int64_t dims[IFD_MAX_RANK];
} ifd_shape;

typedef struct ifd_tensor {
    ifd_dtype dtype;
    ifd_shape shape;
    void *data;
} ifd_tensor;

/* Fills a view. rank may be 0 (a scalar). Returns IFD_EINVAL for a bad rank, a negative dim or an
 * unknown dtype. */
int ifd_tensor_init(ifd_tensor *t, ifd_dtype dt, int rank, const int64_t *dims, void *data);
int64_t ifd_shape_numel(const ifd_shape *s);
/* Elements in one row: the product of dims[1..]. 1 for rank 1. */
int64_t ifd_shape_row_numel(const ifd_shape *s);
int ifd_shape_equal(const ifd_shape *a, const ifd_shape *b);
/* Writes "[64, 10]" into buf. Returns buf. */
char *ifd_shape_format(const ifd_shape *s, char *buf, size_t len);

static inline int64_t ifd_tensor_numel(const ifd_tensor *t)
{
    return ifd_shape_numel(&t->shape);
}
size_t ifd_tensor_nbytes(const ifd_tensor *t);
size_t ifd_tensor_row_bytes(const ifd_tensor *t);

/* out = rows [begin, end) of t along axis 0, sharing t's bytes. t must have rank >= 1.
 * IFD_ERANGE when the range is not inside [0, dims[0]]. */
int ifd_tensor_rows(const ifd_tensor *t, int64_t begin, int64_t end, ifd_tensor *out);

#endif
