/* Data and runs for the host-call suites (tests/outfeed/test_reducers*.c): see reducer_data.h. */
#include "tests/util/reducer_data.h"
#include "tests/util/numbers.h"
#include "tests/util/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void tu_vals_init(tu_vals *v, ifd_dtype dt, int rank, const int64_t *dims)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    v->data = tu_xmalloc(4 * (size_t)(n > 0 ? n : 1));
    ck_assert_int_eq(ifd_tensor_init(&v->t, dt, rank, dims, v->data), IFD_OK);
}

/* Random values [rows, ...]: rank 1 to 3, rows 0 to max_rows; floats of a random scale (some
 * NaN and infinities when nonfinite), int32 of a random span. */
void tu_vals_random(tu_vals *v, ifd_rng *rng, ifd_dtype dt, int64_t max_rows, int nonfinite)
{
    int64_t dims[3] = {rand_between(rng, 0, max_rows), rand_between(rng, 1, 4),
                       rand_between(rng, 1, 3)};
    tu_vals_init(v, dt, (int)rand_between(rng, 1, 3), dims);
    int64_t n = ifd_tensor_numel(&v->t);
    const double scales[] = {1e-3, 1.0, 1e6};
    const int64_t spans[] = {3, 1000, INT64_C(1) << 30};
    double scale = scales[ifd_rng_below(rng, 3)];
    int64_t span = spans[ifd_rng_below(rng, 3)];
    for (int64_t i = 0; i < n; i++) {
        if (dt == IFD_F32)
            TU_F(v)[i] = (float)(tu_urand(rng, -1, 1) * scale);
        else
            TU_I(v)[i] = (int32_t)rand_between(rng, -span, span - 1);
    }
    for (int j = 0; nonfinite && dt == IFD_F32 && n > 0 && j < 6; j++)
        TU_F(v)
    [ifd_rng_below(rng, (uint64_t)n)] = j % 3 == 0 ? NAN : j % 3 == 1 ? INFINITY : -INFINITY;
}

/* The same rows in a random order (src and label, if any, permuted alike). */
void tu_vals_permute(const tu_vals *src, const tu_vals *label, tu_vals *out, tu_vals *lout,
                     ifd_rng *rng)
{
    int64_t rows = src->t.shape.dims[0];
    size_t rb = ifd_tensor_row_bytes(&src->t);
    tu_vals_init(out, src->t.dtype, src->t.shape.rank, src->t.shape.dims);
    if (label != NULL)
        tu_vals_init(lout, label->t.dtype, label->t.shape.rank, label->t.shape.dims);
    int64_t *perm = tu_xmalloc(sizeof(int64_t) * (size_t)(rows + 1));
    for (int64_t i = 0; i < rows; i++)
        perm[i] = i;
    for (int64_t i = rows - 1; i > 0; i--) {
        int64_t j = (int64_t)ifd_rng_below(rng, (uint64_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < rows; i++) {
        memcpy((char *)out->data + (size_t)i * rb, (char *)src->data + (size_t)perm[i] * rb, rb);
        if (label != NULL)
            memcpy((char *)lout->data + 4 * (size_t)i, (char *)label->data + 4 * (size_t)perm[i],
                   4);
    }
    free(perm);
}

ifd_shape tu_row_of(const ifd_tensor *t)
{
    ifd_shape row = {.rank = t->shape.rank - 1};
    for (int i = 1; i < t->shape.rank; i++)
        row.dims[i - 1] = t->shape.dims[i];
    return row;
}

ifd_reducer *tu_reducer_make(const char *spec, int64_t classes)
{
    ifd_reducer *r;
    ifd_error err = {0};
    RC_OK(ifd_reducer_create(&r, "x", spec, classes, &err), err);
    return r;
}

/* Adds v (and label) to r in random chunks of consecutive rows, empty ones included. */
void tu_reducer_add_chunks(ifd_reducer *r, const tu_vals *v, const tu_vals *label, ifd_rng *rng)
{
    ifd_error err = {0};
    ifd_shape row = tu_row_of(&v->t), lrow = label ? tu_row_of(&label->t) : row;
    RC_OK(ifd_reducer_check(r, v->t.dtype, &row, label ? label->t.dtype : IFD_DTYPE_INVALID,
                            label ? &lrow : NULL, &err),
          err);
    int64_t rows = v->t.shape.dims[0], at = 0;
    while (at < rows || at == 0) {
        int64_t take = rand_between(rng, 0, rows - at);
        ifd_tensor part, lpart;
        ck_assert_int_eq(ifd_tensor_rows(&v->t, at, at + take, &part), IFD_OK);
        if (label)
            ck_assert_int_eq(ifd_tensor_rows(&label->t, at, at + take, &lpart), IFD_OK);
        RC_OK(ifd_reducer_add(r, &part, label ? &lpart : NULL, &err), err);
        at += take;
        if (rows == 0)
            break;
    }
}

/* The value of spec over v (and label) added in random chunks. */
json_t *tu_reduce(const char *spec, int64_t classes, const tu_vals *v, const tu_vals *label,
                  ifd_rng *rng)
{
    ifd_reducer *r = tu_reducer_make(spec, classes);
    tu_reducer_add_chunks(r, v, label, rng);
    json_t *j = ifd_reducer_value(r);
    ck_assert_ptr_nonnull(j);
    ifd_reducer_destroy(r);
    return j;
}

double tu_json_num(const json_t *j, const char *key)
{
    json_t *v = key ? json_object_get(j, key) : (json_t *)j;
    RASSERT(json_is_number(v), "%s is not a number", key ? key : "the value");
    return json_number_value(v);
}

int64_t tu_json_int(const json_t *j, const char *key)
{
    json_t *v = key ? json_object_get(j, key) : (json_t *)j;
    RASSERT(json_is_integer(v), "%s is not an integer", key ? key : "the value");
    return json_integer_value(v);
}

void tu_assert_close(double got, double want, double rel, const char *what)
{
    RASSERT(fabs(got - want) <= rel * fmax(fabs(want), 1e-300) || got == want,
            "%s: got %.17g, want %.17g", what, got, want);
}

double tu_vals_at(const tu_vals *v, int64_t i)
{
    return v->t.dtype == IFD_F32 ? (double)TU_F(v)[i] : (double)TU_I(v)[i];
}

void tu_assert_int_array(const json_t *a, const int64_t *want, int64_t n, const char *what)
{
    RASSERT(json_is_array(a) && (int64_t)json_array_size(a) == n, "%s: %zu entries, want %lld",
            what, json_is_array(a) ? json_array_size(a) : 0, (long long)n);
    for (int64_t i = 0; i < n; i++)
        RASSERT(tu_json_int(json_array_get(a, (size_t)i), NULL) == want[i],
                "%s[%lld]: got %lld, want %lld", what, (long long)i,
                (long long)tu_json_int(json_array_get(a, (size_t)i), NULL), (long long)want[i]);
}

/* Predicted classes and labels in [0, k), right with probability acc; [rows] or [rows, 1]. */
void tu_classes_random(tu_vals *p, tu_vals *y, ifd_rng *rng, int64_t k, int64_t rows)
{
    int64_t dims[2] = {rows, 1};
    int rank = (int)rand_between(rng, 1, 2);
    tu_vals_init(p, IFD_I32, rank, dims);
    tu_vals_init(y, IFD_I32, (int)rand_between(rng, 1, 2), dims);
    double acc = ifd_rng_uniform(rng);
    for (int64_t i = 0; i < rows; i++) {
        TU_I(y)[i] = (int32_t)ifd_rng_below(rng, (uint64_t)k);
        TU_I(p)
        [i] = ifd_rng_uniform(rng) < acc ? TU_I(y)[i] : (int32_t)ifd_rng_below(rng, (uint64_t)k);
    }
}

/* Data for spec: values and, when it takes one, a label. */
void tu_reducer_data(const char *spec, ifd_rng *rng, int64_t rows, tu_vals *v, tu_vals *label)
{
    int64_t dims[2] = {rows, 3};
    label->data = NULL;
    if (strncmp(spec, "confusion", 9) == 0 || strncmp(spec, "class_acc", 9) == 0 ||
        strncmp(spec, "precision", 9) == 0) {
        tu_classes_random(v, label, rng, 5, rows);
        return;
    }
    if (strncmp(spec, "top_k", 5) == 0 || strncmp(spec, "auc", 3) == 0) {
        int auc = spec[0] == 'a';
        tu_vals_init(v, IFD_F32, auc ? 1 : 2, dims);
        tu_vals_init(label, IFD_I32, 1, dims);
        for (int64_t i = 0; i < rows * (auc ? 1 : 3); i++)
            TU_F(v)[i] = auc ? (float)ifd_rng_uniform(rng) : (float)ifd_rng_below(rng, 3);
        for (int64_t i = 0; i < rows; i++)
            TU_I(label)[i] = (int32_t)ifd_rng_below(rng, auc ? 2 : 3);
        return;
    }
    tu_vals_init(v, IFD_F32, 2, dims);
    for (int64_t i = 0; i < rows * 3; i++)
        TU_F(v)[i] = (float)(tu_urand(rng, -2, 2) * tu_urand(rng, 0, 2));
}
