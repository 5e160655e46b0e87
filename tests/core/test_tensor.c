/*
 * Dtypes, shapes and tensors (include/infeed/tensor.h): names, sizes and parsing of dtypes, shapes
 * of random ranks and dims, their text, and row views that share the tensor's bytes.
 *
 * Sizes are random. The seed comes from IFD_TEST_SEED when set, else from the clock, and every
 * failure message names it so that a failing run can be repeated.
 */
#include "tests/util/testutil.h"

#include "core/rng.h"
#include <infeed/tensor.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- tensor ------------------------------------------------------------------------------- */

START_TEST(test_dtype_names_sizes_parse)
{
    static const struct {
        ifd_dtype dt;
        const char *name;
        size_t size;
    } k[] = {{IFD_F32, "float32", 4},
             {IFD_I32, "int32", 4},
             {IFD_I64, "int64", 8},
             {IFD_U8, "uint8", 1}};
    ck_assert_int_eq((int)(sizeof k / sizeof k[0]), IFD_DTYPE_MAX - 1);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        ck_assert_str_eq(ifd_dtype_name(k[i].dt), k[i].name);
        ck_assert_uint_eq(ifd_dtype_size(k[i].dt), k[i].size);
        ifd_dtype out = IFD_DTYPE_INVALID;
        ck_assert_int_eq(ifd_dtype_parse(k[i].name, &out), IFD_OK);
        ck_assert_int_eq(out, k[i].dt);
    }
    ck_assert_str_eq(ifd_dtype_name(IFD_DTYPE_INVALID), "invalid");
    ck_assert_str_eq(ifd_dtype_name(IFD_DTYPE_MAX), "invalid");
    ck_assert_str_eq(ifd_dtype_name((ifd_dtype)77), "invalid");
    ck_assert_uint_eq(ifd_dtype_size(IFD_DTYPE_INVALID), 0);
    ck_assert_uint_eq(ifd_dtype_size(IFD_DTYPE_MAX), 0);

    const char *bad[] = {"",       "float64", "Float32", "float32 ",
                         " int32", "int",     "invalid", "uint8x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ifd_dtype out = IFD_I64;
        ck_assert_msg(ifd_dtype_parse(bad[i], &out) == IFD_EDTYPE, "parse('%s') accepted", bad[i]);
        ck_assert_int_eq(out, IFD_I64);
    }
}
END_TEST

START_TEST(test_tensor_init_and_shapes)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor t;
    float x = 1.0f;
    /* A scalar. */
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_F32, 0, NULL, &x), IFD_OK);
    ck_assert_int_eq(t.shape.rank, 0);
    ck_assert_int_eq(ifd_tensor_numel(&t), 1);
    ck_assert_uint_eq(ifd_tensor_nbytes(&t), 4);
    ck_assert_ptr_eq(t.data, &x);

    int64_t dims[IFD_MAX_RANK + 1] = {2, 3, 4, 5, 6, 7, 8, 9, 10};
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_F32, -1, dims, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_F32, IFD_MAX_RANK + 1, dims, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_DTYPE_INVALID, 2, dims, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_DTYPE_MAX, 2, dims, NULL), IFD_EINVAL);
    int64_t neg[3] = {4, -1, 2};
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_I32, 3, neg, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_I32, IFD_MAX_RANK, dims, NULL), IFD_OK);

    for (int round = 0; round < 200; round++) {
        int rank = (int)rand_between(&rng, 1, IFD_MAX_RANK);
        ifd_dtype dt = (ifd_dtype)rand_between(&rng, 1, IFD_DTYPE_MAX - 1);
        int64_t d[IFD_MAX_RANK];
        int64_t numel = 1, row = 1;
        for (int i = 0; i < rank; i++) {
            d[i] = rand_between(&rng, 0, 5);
            numel *= d[i];
            if (i > 0)
                row *= d[i];
        }
        RASSERT(ifd_tensor_init(&t, dt, rank, d, &x) == IFD_OK, "init rank %d", rank);
        RASSERT(t.dtype == dt && t.shape.rank == rank, "init fields");
        for (int i = 0; i < rank; i++)
            RASSERT(t.shape.dims[i] == d[i], "dim %d: %" PRId64 " != %" PRId64, i, t.shape.dims[i],
                    d[i]);
        RASSERT(ifd_tensor_numel(&t) == numel, "numel %" PRId64 ", expected %" PRId64,
                ifd_tensor_numel(&t), numel);
        RASSERT(ifd_shape_numel(&t.shape) == numel, "shape numel");
        RASSERT(ifd_shape_row_numel(&t.shape) == row, "row numel %" PRId64 ", expected %" PRId64,
                ifd_shape_row_numel(&t.shape), row);
        RASSERT(ifd_tensor_nbytes(&t) == (size_t)numel * ifd_dtype_size(dt), "nbytes %zu",
                ifd_tensor_nbytes(&t));
        RASSERT(ifd_tensor_row_bytes(&t) == (size_t)row * ifd_dtype_size(dt), "row bytes %zu",
                ifd_tensor_row_bytes(&t));

        /* shape_equal: equal to a copy, not to one with any dim or the rank changed. */
        ifd_shape s2 = t.shape;
        RASSERT(ifd_shape_equal(&t.shape, &s2), "shape not equal to its copy");
        int k = (int)rand_between(&rng, 0, rank - 1);
        s2.dims[k]++;
        RASSERT(!ifd_shape_equal(&t.shape, &s2), "shapes differing at dim %d compare equal", k);
        s2 = t.shape;
        s2.rank = rank - 1;
        RASSERT(!ifd_shape_equal(&t.shape, &s2), "shapes of rank %d and %d compare equal", rank,
                rank - 1);
    }
    /* Rank 1: one element per row. */
    int64_t one[1] = {7};
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_I64, 1, one, NULL), IFD_OK);
    ck_assert_int_eq(ifd_shape_row_numel(&t.shape), 1);
    ck_assert_uint_eq(ifd_tensor_row_bytes(&t), 8);
}
END_TEST

START_TEST(test_shape_format)
{
    char buf[64];
    ifd_shape s = {.rank = 2, .dims = {64, 10}};
    ck_assert_str_eq(ifd_shape_format(&s, buf, sizeof buf), "[64, 10]");
    ck_assert_ptr_eq(ifd_shape_format(&s, buf, sizeof buf), buf);
    s = (ifd_shape){.rank = 1, .dims = {3}};
    ck_assert_str_eq(ifd_shape_format(&s, buf, sizeof buf), "[3]");
    s = (ifd_shape){.rank = 0};
    ck_assert_str_eq(ifd_shape_format(&s, buf, sizeof buf), "[]");
    s = (ifd_shape){.rank = 4, .dims = {1, 0, 123456789012, 2}};
    ck_assert_str_eq(ifd_shape_format(&s, buf, sizeof buf), "[1, 0, 123456789012, 2]");

    /* A short buffer gets a terminated prefix and nothing past its end. */
    s = (ifd_shape){.rank = 8, .dims = {1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000}};
    for (size_t len = 1; len < 48; len++) {
        char small[64];
        memset(small, '#', sizeof small);
        ifd_shape_format(&s, small, len);
        ck_assert_msg(memchr(small, '\0', len) != NULL, "len %zu: not terminated", len);
        for (size_t i = len; i < sizeof small; i++)
            ck_assert_msg(small[i] == '#', "len %zu: byte %zu written", len, i);
        ck_assert(
            strncmp(small, "[1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000]", strlen(small)) == 0);
    }
}
END_TEST

START_TEST(test_tensor_rows_share_bytes)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 100; round++) {
        int rank = (int)rand_between(&rng, 1, 4);
        ifd_dtype dt = (ifd_dtype)rand_between(&rng, 1, IFD_DTYPE_MAX - 1);
        int64_t d[4];
        d[0] = rand_between(&rng, 0, 20);
        for (int i = 1; i < rank; i++)
            d[i] = rand_between(&rng, 1, 5);
        ifd_tensor t;
        size_t esz = ifd_dtype_size(dt);
        int64_t numel = 1;
        for (int i = 0; i < rank; i++)
            numel *= d[i];
        unsigned char *buf = malloc((size_t)(numel ? numel : 1) * esz);
        for (int64_t i = 0; i < numel * (int64_t)esz; i++)
            buf[i] = (unsigned char)(i * 31 + 7);
        ck_assert_int_eq(ifd_tensor_init(&t, dt, rank, d, buf), IFD_OK);
        size_t row_bytes = ifd_tensor_row_bytes(&t);

        int64_t b = rand_between(&rng, 0, d[0]);
        int64_t e = rand_between(&rng, b, d[0]);
        ifd_tensor v;
        memset(&v, 0, sizeof v);
        RASSERT(ifd_tensor_rows(&t, b, e, &v) == IFD_OK,
                "rows [%" PRId64 ", %" PRId64 ") of %" PRId64 " failed", b, e, d[0]);
        /* A view of the same bytes: the pointer is into t's data, nothing was copied. */
        RASSERT(v.data == buf + (size_t)b * row_bytes,
                "rows [%" PRId64 ", %" PRId64 "): data at offset %td, expected %zu", b, e,
                (unsigned char *)v.data - buf, (size_t)b * row_bytes);
        RASSERT(v.dtype == dt && v.shape.rank == rank && v.shape.dims[0] == e - b,
                "view dtype/rank/dims[0] wrong");
        for (int i = 1; i < rank; i++)
            RASSERT(v.shape.dims[i] == d[i], "view dim %d changed", i);
        RASSERT(ifd_tensor_nbytes(&v) == (size_t)(e - b) * row_bytes, "view nbytes %zu",
                ifd_tensor_nbytes(&v));
        /* t itself is untouched. */
        RASSERT(t.data == buf && t.shape.dims[0] == d[0], "source tensor modified");
        /* Writing through the view changes the source's bytes. */
        if (e > b) {
            size_t off = (size_t)b * row_bytes;
            unsigned char before = buf[off];
            ((unsigned char *)v.data)[0] = (unsigned char)(before ^ 0xFF);
            RASSERT(buf[off] == (unsigned char)(before ^ 0xFF),
                    "write through view not seen in the source");
            buf[off] = before;
        }
        /* A view of a view composes. */
        if (e > b) {
            int64_t b2 = rand_between(&rng, 0, e - b);
            int64_t e2 = rand_between(&rng, b2, e - b);
            ifd_tensor w;
            RASSERT(ifd_tensor_rows(&v, b2, e2, &w) == IFD_OK, "view of view");
            RASSERT(w.data == buf + (size_t)(b + b2) * row_bytes && w.shape.dims[0] == e2 - b2,
                    "view of view at the wrong rows");
        }

        /* Out of range. */
        int64_t bad[][2] = {{-1, d[0]}, {0, d[0] + 1},        {d[0], d[0] + 1}, {b + 1, b},
                            {-5, -1},   {d[0] + 1, d[0] + 2}, {0, INT64_MAX},   {INT64_MIN, 0}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            ifd_tensor w;
            int rc = ifd_tensor_rows(&t, bad[i][0], bad[i][1], &w);
            RASSERT(rc == IFD_ERANGE,
                    "rows [%" PRId64 ", %" PRId64 ") of %" PRId64 " rows gave %s, not ERANGE",
                    bad[i][0], bad[i][1], d[0], ifd_errname(rc));
        }
        /* Edges are in range. */
        ifd_tensor w;
        ck_assert_int_eq(ifd_tensor_rows(&t, 0, d[0], &w), IFD_OK);
        ck_assert_ptr_eq(w.data, buf);
        ck_assert_int_eq(ifd_tensor_rows(&t, d[0], d[0], &w), IFD_OK);
        ck_assert_int_eq(w.shape.dims[0], 0);
        ck_assert_int_eq(ifd_tensor_rows(&t, 0, 0, &w), IFD_OK);
        free(buf);
    }
    /* A scalar has no rows. */
    ifd_tensor s, w;
    float x = 0;
    ck_assert_int_eq(ifd_tensor_init(&s, IFD_F32, 0, NULL, &x), IFD_OK);
    ck_assert_int_eq(ifd_tensor_rows(&s, 0, 0, &w), IFD_ERANGE);
    ck_assert_int_eq(ifd_tensor_rows(&s, 0, 1, &w), IFD_ERANGE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tensor");
    TCase *tc = tu_tcase(s, "tensor", 30);
    tcase_add_test(tc, test_dtype_names_sizes_parse);
    tcase_add_test(tc, test_tensor_init_and_shapes);
    tcase_add_test(tc, test_shape_format);
    tcase_add_test(tc, test_tensor_rows_share_bytes);
    return tu_run_suite(s);
}
