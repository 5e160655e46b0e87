#include "tests/util/numbers.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *tu_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

float *tu_falloc(int64_t n)
{
    return tu_xmalloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
}

float *tu_frand_scaled(ifd_rng *rng, int64_t n, double scale)
{
    float *p = tu_falloc(n);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)((ifd_rng_uniform(rng) * 2.0 - 1.0) * scale);
    return p;
}

float *tu_frand(ifd_rng *rng, int64_t n)
{
    return tu_frand_scaled(rng, n, 1.0);
}

void tu_fill_nan(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}

int tu_has_number(const char *s, long long v)
{
    char num[32];
    snprintf(num, sizeof num, "%lld", v);
    size_t len = strlen(num);
    for (const char *q = strstr(s, num); q; q = strstr(q + 1, num)) {
        int before_ok = q == s || !((q[-1] >= '0' && q[-1] <= '9') || (v >= 0 && q[-1] == '-'));
        int after_ok = !(q[len] >= '0' && q[len] <= '9');
        if (before_ok && after_ok)
            return 1;
    }
    return 0;
}
