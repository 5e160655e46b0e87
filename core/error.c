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

static void no_key(ifd_error *err)
{
    err->key[0] = '\0';
    err->key_at = err->key_len = 0;
}

int ifd_error_set(ifd_error *err, int code, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    no_key(err);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int ifd_error_set_key(ifd_error *err, int code, const char *key, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    int n = snprintf(err->msg, sizeof err->msg, "%s: ", key);
    if (n < 0 || (size_t)n >= sizeof err->msg)
        n = (int)strlen(err->msg);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
    va_end(ap);
    ifd_error_mark_key(err, key, 0, (int)strlen(key));
    return code;
}

int ifd_error_mark_key(ifd_error *err, const char *key, int at, int len)
{
    if (err == NULL)
        return IFD_OK;
    size_t msg_len = strlen(err->msg);
    if (at < 0 || len < 0 || (size_t)at + (size_t)len > msg_len || strlen(key) >= sizeof err->key) {
        no_key(err);
        return err->code;
    }
    snprintf(err->key, sizeof err->key, "%s", key);
    err->key_at = at;
    err->key_len = len;
    return err->code;
}

void ifd_error_name_key(ifd_error *err, const char *name)
{
    if (err == NULL || err->key[0] == '\0')
        return;
    if (err->key_at < 0 || err->key_len < 0 ||
        (size_t)err->key_at + (size_t)err->key_len > strnlen(err->msg, sizeof err->msg - 1)) {
        no_key(err);
        return;
    }
    char old[IFD_ERROR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%.*s%s%s", err->key_at, old, name,
             old + err->key_at + err->key_len);
    err->key_len = (int)strlen(name);
    if ((size_t)(err->key_at + err->key_len) > strlen(err->msg))
        no_key(err); /* cut off by the buffer's end */
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
    if (err->key[0] && old[0]) {
        int shift = (int)strlen(prefix) + 2;
        if ((size_t)(err->key_at + shift + err->key_len) <= strlen(err->msg))
            err->key_at += shift;
        else
            no_key(err);
    } else if (!old[0]) {
        no_key(err);
    }
    return err->code;
}

void ifd_error_clear(ifd_error *err)
{
    if (err) {
        err->code = IFD_OK;
        err->msg[0] = '\0';
        no_key(err);
    }
}

const char *ifd_error_text(const ifd_error *err)
{
    if (err->msg[0])
        return err->msg;
    return ifd_strerror(err->code);
}
