/* A small deterministic generator (splitmix64) for parameter initialisation and tests: the same
 * seed gives the same numbers on every machine. Written here because libc has no seedable,
 * portable generator and nothing else in the dependency set provides one. */
#ifndef IFD_CORE_RNG_H
#define IFD_CORE_RNG_H

#include <stdint.h>

typedef struct ifd_rng {
    uint64_t s;
} ifd_rng;

static inline void ifd_rng_seed(ifd_rng *r, uint64_t seed)
{
    r->s = seed ^ 0x9E3779B97F4A7C15ull;
}

static inline uint64_t ifd_rng_next(ifd_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double ifd_rng_uniform(ifd_rng *r)
{
    return (double)(ifd_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n). */
static inline uint64_t ifd_rng_below(ifd_rng *r, uint64_t n)
{
    return n ? ifd_rng_next(r) % n : 0;
}

#endif
