#include "core/log.h"
#include <infeed/error.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

volatile int ifd_log_level_ = IFD_LOG_WARN;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static char log_name[24] = "infeed";

void ifd_log_set_host(int rank)
{
    if (rank < 0)
        snprintf(log_name, sizeof log_name, "infeed");
    else
        snprintf(log_name, sizeof log_name, "infeed@%d", rank);
}

void ifd_log_set_level(int level)
{
    if (level < IFD_LOG_ERROR)
        level = IFD_LOG_ERROR;
    if (level > IFD_LOG_DEBUG)
        level = IFD_LOG_DEBUG;
    ifd_log_level_ = level;
}

int ifd_log_get_level(void)
{
    return ifd_log_level_;
}

int ifd_log_level_parse(const char *name, int *out)
{
    for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = i;
            return IFD_OK;
        }
    }
    return IFD_EINVAL;
}

const char *ifd_log_level_name(int level)
{
    if (level < IFD_LOG_ERROR || level > IFD_LOG_DEBUG)
        return "?";
    return level_names[level];
}

/* One unsigned decimal number of str up to `stop`: 0 and *out, or -1. */
static int parse_u64(const char *str, char stop, const char **rest, unsigned long long *out)
{
    if (*str < '0' || *str > '9')
        return -1;
    char *end = NULL;
    errno = 0;
    *out = strtoull(str, &end, 10);
    if (errno != 0 || *end != stop)
        return -1;
    *rest = end;
    return 0;
}

int ifd_log_journal_stream_matches(const char *journal_stream, int fd)
{
    unsigned long long dev, ino;
    const char *p = journal_stream;
    if (p == NULL || parse_u64(p, ':', &p, &dev) || parse_u64(p + 1, '\0', &p, &ino))
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return 0;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* stderr is the journal (systemd sets JOURNAL_STREAM to its device and inode): lines start with
 * the sd-daemon priority prefix ("<3>" error, "<4>" warn, "<6>" info, "<7>" debug) and carry no
 * time, which the journal records. Decided at the first line. */
static int to_journal;
static pthread_once_t journal_once = PTHREAD_ONCE_INIT;

static void journal_detect(void)
{
    to_journal = ifd_log_journal_stream_matches(getenv("JOURNAL_STREAM"), STDERR_FILENO);
}

void ifd_log_write(int level, const char *fmt, ...)
{
    static const int priorities[] = {3, 4, 6, 7};
    char line[1024 + 2];
    char tname[16] = "?";
    pthread_once(&journal_once, journal_detect);
    pthread_getname_np(pthread_self(), tname, sizeof tname);
    int n;
    if (to_journal) {
        int pri = level >= IFD_LOG_ERROR && level <= IFD_LOG_DEBUG ? priorities[level] : 6;
        n = snprintf(line, sizeof line, "<%d>%s %-5s [%s] ", pri, log_name,
                     ifd_log_level_name(level), tname);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %s %-5s [%s] ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_name, ifd_log_level_name(level), tname);
    }
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One fputs per line keeps lines from different threads whole; a line too long for the
     * buffer is cut, and still ends with its newline. */
    size_t len = strlen(line);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len] = '\n';
    line[len + 1] = '\0';
    fputs(line, stderr);
}

int ifd_log_limit_allow(ifd_log_limit *l, long long *suppressed)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ifd_log_limit_allow_at(l, (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec, suppressed);
}

int ifd_log_limit_allow_at(ifd_log_limit *l, int64_t now, long long *suppressed)
{
    *suppressed = 0;
    if (l->window_start == 0 || now - l->window_start >= l->interval_ns) {
        l->window_start = now;
        l->in_window = 0;
    }
    if (l->in_window >= l->burst) {
        l->suppressed++;
        return 0;
    }
    l->in_window++;
    *suppressed = l->suppressed;
    l->suppressed = 0;
    return 1;
}

const char *ifd_log_escape(const char *in, char *out, size_t len)
{
    size_t o = 0;
    if (len == 0)
        return out;
    for (const unsigned char *p = (const unsigned char *)in; p && *p; p++) {
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            if (o + 1 >= len)
                break;
            out[o++] = (char)*p;
        } else {
            if (o + 4 >= len)
                break;
            o += (size_t)snprintf(out + o, len - o, "\\x%02x", *p);
        }
    }
    out[o] = '\0';
    return out;
}
