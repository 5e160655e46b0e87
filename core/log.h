/*
 * Leveled logging to stderr. IFD_LOG checks the level before formatting anything, so a disabled
 * debug line costs one load and a compare (Redis serverLog).
 */
#ifndef IFD_CORE_LOG_H
#define IFD_CORE_LOG_H

#include "infeed/infeed.h"

extern volatile int ifd_log_level_;

void ifd_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define IFD_LOG(level, ...)                                                                        \
    do {                                                                                           \
        if ((level) <= ifd_log_level_)                                                             \
            ifd_log_write((level), __VA_ARGS__);                                                   \
    } while (0)

#define IFD_LOG_ERROR(...) IFD_LOG(IFD_LOG_ERROR, __VA_ARGS__)
#define IFD_LOG_WARN(...) IFD_LOG(IFD_LOG_WARN, __VA_ARGS__)
#define IFD_LOG_INFO(...) IFD_LOG(IFD_LOG_INFO, __VA_ARGS__)
#define IFD_LOG_DEBUG(...) IFD_LOG(IFD_LOG_DEBUG, __VA_ARGS__)

#endif
