#include "infeed/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *ifd_strerror(int code)
{
    switch (code) {
    case IFD_OK:
        return "success";
#define IFD_STRERROR_CASE_(name, s)                                                                \
    case IFD_##name:                                                                               \
        return s;
        IFD_ERRNO_MAP(IFD_STRERROR_CASE_)
#undef IFD_STRERROR_CASE_
    default:
        return "unknown error";
    }
}

const char *ifd_errname(int code)
{
    switch (code) {
    case IFD_OK:
        return "IFD_OK";
#define IFD_ERRNAME_CASE_(name, s)                                                                 \
    case IFD_##name:                                                                               \
        return "IFD_" #name;
        IFD_ERRNO_MAP(IFD_ERRNAME_CASE_)
#undef IFD_ERRNAME_CASE_
    default:
        return "IFD_EUNKNOWN";
    }
}

int ifd_error_set(ifd_error *err, int code, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int ifd_error_prefix(ifd_error *err, const char *fmt, ...)
{
    if (err == NULL)
        return IFD_OK;
    char prefix[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[IFD_ERROR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    int n = snprintf(err->msg, sizeof err->msg, "%s: %s", prefix,
                     old[0] ? old : ifd_strerror(err->code));
    (void)n; /* a sentence longer than the buffer is cut there */
    return err->code;
}

void ifd_error_clear(ifd_error *err)
{
    if (err) {
        err->code = IFD_OK;
        err->msg[0] = '\0';
    }
}

const char *ifd_error_text(const ifd_error *err)
{
    if (err->msg[0])
        return err->msg;
    return ifd_strerror(err->code);
}
