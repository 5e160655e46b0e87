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
#define IFD_ERROR_KEY_MAX 48

/* A code and the sentence that explains it. Embedded by value; no destroy.
 *
 * A sentence about a setting also carries its key, set where the sentence is made
 * (ifd_error_set_key, ifd_program_check_setting): key is the setting ("batch_size", "hidden"),
 * and msg[key_at, key_at + key_len) the words of the sentence that name it ("batch_size",
 * "setting 'hidden'"), so that a caller that knows the setting by another name (infeedd: the
 * flag the user typed) names it so with ifd_error_name_key, without searching the text. */
typedef struct ifd_error {
    int code;
    char msg[IFD_ERROR_MSG_MAX];
    char key[IFD_ERROR_KEY_MAX]; /* "": the sentence is about no setting */
    int key_at, key_len;
} ifd_error;

/* Sets code and a printf-style sentence and returns code, so that callers can write
 * `return ifd_error_set(err, IFD_ESHAPE, "...", ...);`. err may be NULL. */
int ifd_error_set(ifd_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* As ifd_error_set, for a sentence about the setting key: the sentence is "key: " and fmt's. */
int ifd_error_set_key(ifd_error *err, int code, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Marks msg[at, at + len) as the words naming the setting key (the sentence already holds them).
 * Returns err->code. */
int ifd_error_mark_key(ifd_error *err, const char *key, int at, int len);
/* Replaces the words that name the error's key with name ("--batch-size"); nothing when the
 * error names no key. */
void ifd_error_name_key(ifd_error *err, const char *name);
/* Prefixes the existing sentence with a context ("infeed: ..."); the words naming its key, if
 * any, move with it. Returns err->code. */
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
