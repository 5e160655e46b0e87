/*
 * Leveled logging to stderr. IFD_LOG checks the level before formatting anything, so a disabled
 * debug line costs one load and a compare (Redis serverLog).
 */
#ifndef IFD_CORE_LOG_H
#define IFD_CORE_LOG_H

#include <infeed/logging.h>

#include <stddef.h>
#include <stdint.h>

extern volatile int ifd_log_level_;

/* Writes one line to stderr: "HH:MM:SS.mmm infeed LEVEL [thread] message", or, when stderr is
 * the systemd journal (JOURNAL_STREAM names it), "<PRIORITY>infeed LEVEL [thread] message". */
void ifd_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 when journal_stream (JOURNAL_STREAM's value, "DEVICE:INODE" in decimal; may be NULL) names
 * the file open on fd, as systemd's documentation says to check; 0 otherwise. */
int ifd_log_journal_stream_matches(const char *journal_stream, int fd);

#define IFD_LOG(level, ...)                                                                        \
    do {                                                                                           \
        if ((level) <= ifd_log_level_)                                                             \
            ifd_log_write((level), __VA_ARGS__);                                                   \
    } while (0)

#define IFD_LOG_ERROR(...) IFD_LOG(IFD_LOG_ERROR, __VA_ARGS__)
#define IFD_LOG_WARN(...) IFD_LOG(IFD_LOG_WARN, __VA_ARGS__)
#define IFD_LOG_INFO(...) IFD_LOG(IFD_LOG_INFO, __VA_ARGS__)
#define IFD_LOG_DEBUG(...) IFD_LOG(IFD_LOG_DEBUG, __VA_ARGS__)

/* A rate limit for a log line that peers can trigger (a rejected batch, a refused key): at most
 * `burst` lines in each `interval_ns`; the first line let through after some were held back says
 * how many ("(12 similar lines suppressed)"). A limit belongs to one thread (no lock). */
typedef struct ifd_log_limit {
    int64_t interval_ns;
    int burst;
    int64_t window_start;
    int in_window;
    long long suppressed;
} ifd_log_limit;

#define IFD_LOG_LIMIT_INIT(burst, interval_ns)                                                     \
    {                                                                                              \
        (interval_ns), (burst), 0, 0, 0                                                            \
    }

/* 1 when a line may be written now, with *suppressed the lines held back since the last one let
 * through (then reset); 0 (and the line counted) otherwise. */
int ifd_log_limit_allow(ifd_log_limit *l, long long *suppressed);
/* The same at a given CLOCK_MONOTONIC time in nanoseconds (> 0). */
int ifd_log_limit_allow_at(ifd_log_limit *l, int64_t now_ns, long long *suppressed);

#define IFD_LOG_LIMITED(lim, level, fmt, ...)                                                      \
    do {                                                                                           \
        long long sup_;                                                                            \
        if ((level) <= ifd_log_level_ && ifd_log_limit_allow((lim), &sup_)) {                      \
            if (sup_)                                                                              \
                ifd_log_write((level), fmt " (%lld similar lines suppressed)", __VA_ARGS__, sup_); \
            else                                                                                   \
                ifd_log_write((level), fmt, __VA_ARGS__);                                          \
        }                                                                                          \
    } while (0)

/* Text a peer chose (a producer name, a key), made safe for one log line: printable ASCII kept,
 * every other byte (newlines, escapes, UTF-8) and the backslash written as \xHH; cut to fit len
 * (always terminated). Returns out. */
const char *ifd_log_escape(const char *in, char *out, size_t len);

#endif
