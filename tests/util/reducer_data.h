/* The host-call suites' data (tests/outfeed/test_reducers*.c): random values, classes and
 * labels owned by the test, rows permuted, and a reducer run over them in random step splits. */
#ifndef IFD_TEST_REDUCER_DATA_H
#define IFD_TEST_REDUCER_DATA_H

#include "core/rng.h"
#include "outfeed/reducers.h"

#include <jansson.h>
#include <stdint.h>

/* Values owned by the test: a tensor view over data (free data). */
typedef struct tu_vals {
    ifd_tensor t;
    void *data;
} tu_vals;

#define TU_F(v) ((float *)(v)->data)
#define TU_I(v) ((int32_t *)(v)->data)

void tu_vals_init(tu_vals *v, ifd_dtype dt, int rank, const int64_t *dims);
/* Random values [rows, ...]: rank 1 to 3, rows 0 to max_rows; floats of a random scale (some
 * NaN and infinities when nonfinite), int32 of a random span. */
void tu_vals_random(tu_vals *v, ifd_rng *rng, ifd_dtype dt, int64_t max_rows, int nonfinite);
/* The same rows in a random order (src and label, if any, permuted alike). */
void tu_vals_permute(const tu_vals *src, const tu_vals *label, tu_vals *out, tu_vals *lout,
                     ifd_rng *rng);
/* Element i, as a double. */
double tu_vals_at(const tu_vals *v, int64_t i);
/* Predicted classes p and labels y in [0, k), [rows] or [rows, 1], p right with a random
 * probability. */
void tu_classes_random(tu_vals *p, tu_vals *y, ifd_rng *rng, int64_t k, int64_t rows);
/* Data for spec: values *v and, when spec takes one, a label (label->data NULL otherwise). */
void tu_reducer_data(const char *spec, ifd_rng *rng, int64_t rows, tu_vals *v, tu_vals *label);

/* t's row shape: its shape without axis 0. */
ifd_shape tu_row_of(const ifd_tensor *t);
/* A reducer on tensor "x" (fails the test on an error). */
ifd_reducer *tu_reducer_make(const char *spec, int64_t classes);
/* Checks the shapes, then adds v (and label) to r in random chunks of consecutive rows, empty
 * ones included. */
void tu_reducer_add_chunks(ifd_reducer *r, const tu_vals *v, const tu_vals *label, ifd_rng *rng);
/* The value of spec over v (and label) added in random chunks. */
json_t *tu_reduce(const char *spec, int64_t classes, const tu_vals *v, const tu_vals *label,
                  ifd_rng *rng);

/* j[key] (j itself when key is NULL), failing the test unless it is a number, an integer. */
double tu_json_num(const json_t *j, const char *key);
int64_t tu_json_int(const json_t *j, const char *key);
/* |got - want| <= rel |want| */
void tu_assert_close(double got, double want, double rel, const char *what);
/* a is an array of n integers equal to want's. */
void tu_assert_int_array(const json_t *a, const int64_t *want, int64_t n, const char *what);

#endif
