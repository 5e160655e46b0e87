/*
 * infeed error codes. Every fallible function returns one of these (IFD_OK is 0); where a person
 * will read the failure, an ifd_error also carries a sentence that names what was wrong, what was
 * expected and what arrived.
 */
#ifndef IFD_ERROR_H
#define IFD_ERROR_H

#include <stddef.h>

#define IFD_ERRNO_MAP(XX)                                                                          \
    XX(ENOMEM, "out of memory")                                                                    \
    XX(EINVAL, "invalid argument")                                                                 \
    XX(ESHAPE, "shape mismatch")                                                                   \
    XX(EDTYPE, "dtype mismatch")                                                                   \
    XX(ERANGE, "value out of range")                                                               \
    XX(EPROTO, "protocol error")                                                                   \
    XX(EIO, "input/output error")                                                                  \
    XX(ECLOSED, "closed")                                                                          \
    XX(EEOF, "input ended")                                                                        \
    XX(ETIMEDOUT, "timed out")                                                                     \
    XX(ESTOPPED, "stopped")                                                                        \
    XX(ECANCELED, "canceled")                                                                      \
    XX(ENOTSUP, "not supported")                                                                   \
    XX(ENOTFOUND, "not found")                                                                     \
    XX(ENUMERIC, "numeric error")                                                                  \
    XX(EBLAS, "BLAS error")                                                                        \
    XX(ECUDA, "CUDA error")                                                                        \
    XX(ENCCL, "NCCL error")                                                                        \
    XX(EPERM, "not permitted")                                                                     \
    XX(EINTERNAL, "internal error")                                                                \
    XX(EBUSY, "in use")

typedef enum {
    IFD_OK = 0,
#define IFD_ERRNO_ENUM_(name, s) IFD_##name,
    IFD_ERRNO_MAP(IFD_ERRNO_ENUM_)
#undef IFD_ERRNO_ENUM_
        IFD_ERRNO_MAX
} ifd_errno;

/* The short description of a code ("shape mismatch"); never NULL. */
const char *ifd_strerror(int code);
/* The code's name ("IFD_ESHAPE"); never NULL. */
const char *ifd_errname(int code);

#define IFD_ERROR_MSG_MAX 512

/* A code and the sentence that explains it. Embedded by value; no destroy. */
typedef struct ifd_error {
    int code;
    char msg[IFD_ERROR_MSG_MAX];
} ifd_error;

/* Sets code and a printf-style sentence and returns code, so that callers can write
 * `return ifd_error_set(err, IFD_ESHAPE, "...", ...);`. err may be NULL. */
int ifd_error_set(ifd_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefixes the existing sentence with a context ("infeed: ..."). Returns err->code. */
int ifd_error_prefix(ifd_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ifd_error_clear(ifd_error *err);
/* The sentence, or ifd_strerror(code) when there is none. */
const char *ifd_error_text(const ifd_error *err);

/* True for codes that mean "stopped because something else stopped the run" rather than a cause
 * (the seed's rule: cancelled/aborted errors caused by the stop itself are not the cause). */
static inline int ifd_error_is_secondary(int code)
{
    return code == IFD_ESTOPPED || code == IFD_ECANCELED || code == IFD_ECLOSED;
}

#endif
