/* Numbers in tests: memory that fails the test instead of returning NULL, random floats, and
 * finding a number in a sentence. */
#ifndef IFD_TEST_NUMBERS_H
#define IFD_TEST_NUMBERS_H

#include "core/rng.h"

#include <stddef.h>
#include <stdint.h>

/* malloc(n), at least 1 byte; fails the test when there is no memory. */
void *tu_xmalloc(size_t n);
/* n floats (at least 1) from tu_xmalloc. */
float *tu_falloc(int64_t n);
/* n floats uniform in [-1, 1). */
float *tu_frand(ifd_rng *rng, int64_t n);
/* n floats uniform in [-scale, scale). */
float *tu_frand_scaled(ifd_rng *rng, int64_t n, double scale);
/* Sets x[0..n) to NaN: memory a step must write before it reads. */
void tu_fill_nan(float *x, int64_t n);

/* Uniform in [lo, hi). */
static inline double tu_urand(ifd_rng *rng, double lo, double hi)
{
    return lo + (hi - lo) * ifd_rng_uniform(rng);
}

/* Whether the decimal number v appears in s as a whole number (not part of a longer one). */
int tu_has_number(const char *s, long long v);

#endif
