#include "clients/c/wire.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

int64_t ifdw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ifdw_deadline(int timeout_ms)
{
    if (timeout_ms < 0)
        return -1;
    return ifdw_now_ns() + (int64_t)timeout_ms * 1000000;
}

long ifdw_left_ms(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - ifdw_now_ns();
    if (left <= 0)
        return 0;
    return (long)((left + 999999) / 1000000);
}

int ifdw_code_parse(const char *name)
{
    if (name == NULL)
        return -1;
#define IFDW_CODE_CASE_(code, s)                                                                   \
    if (strcmp(name, #code) == 0)                                                                  \
        return IFD_##code;
    IFD_ERRNO_MAP(IFDW_CODE_CASE_)
#undef IFDW_CODE_CASE_
    return -1;
}

int ifdw_zmq_error(ifd_error *err, const char *what)
{
    int e = errno;
    int code = e == ENOMEM ? IFD_ENOMEM : e == ETERM ? IFD_ECLOSED : IFD_EIO;
    return ifd_error_set(err, code, "%s: %s", what, zmq_strerror(e));
}
