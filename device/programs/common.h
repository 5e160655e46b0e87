/* Settings checks shared by the built-in programs. */
#ifndef IFD_DEVICE_PROGRAMS_COMMON_H
#define IFD_DEVICE_PROGRAMS_COMMON_H

#include "infeed/program.h"

#include <inttypes.h>

/* A setting that must lie in [1, max]. */
static inline int ifd_program_need(const ifd_program *p, const char *key, int64_t v, int64_t max,
                                   ifd_error *err)
{
    if (v < 1 || v > max)
        return ifd_error_set(err, IFD_EINVAL,
                             "program '%s': setting '%s' must be between 1 and %" PRId64
                             ", got %" PRId64,
                             p->cls->name, key, max, v);
    return IFD_OK;
}

#define IFD_PROGRAM_MAX_DIM (1 << 20)

#endif
