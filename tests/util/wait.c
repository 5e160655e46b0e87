#include "tests/util/wait.h"

#include "core/thread.h"
#include "tests/util/testutil.h"

#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int tu_wait_flag(atomic_int *flag, int64_t timeout_ns)
{
    int64_t deadline = ifd_clock_ns() + timeout_ns;
    while (!atomic_load(flag) && ifd_clock_ns() < deadline)
        ifd_sleep_ns(MS);
    return atomic_load(flag);
}

int tu_self_tid(void)
{
    return (int)syscall(SYS_gettid);
}

/* The scheduler state of one of our threads ('R', 'S', ...), '?' when /proc cannot tell. */
static char thread_state(int tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* "tid (comm) S ..." */
    return paren && paren[1] == ' ' && paren[2] ? paren[2] : '?';
}

static int finished(atomic_int *done)
{
    return done != NULL && atomic_load(done);
}

int tu_thread_blocked(atomic_int *tid, atomic_int *done, int64_t timeout_ns)
{
    int64_t deadline = ifd_clock_ns() + timeout_ns;
    for (int seen = 0; seen < 2;) {
        if (finished(done))
            return 0;
        if (ifd_clock_ns() >= deadline)
            return -1;
        int t = atomic_load(tid);
        char st = t ? thread_state(t) : 'R';
        seen = st == 'S' || st == '?' ? seen + 1 : 0;
        ifd_sleep_ns(MS);
    }
    ifd_sleep_ns(TU_BLOCK_CHECK_NS);
    return finished(done) ? 0 : 1;
}

void tu_wait_blocked(atomic_int *tid, atomic_int *done, const char *what)
{
    int rc = tu_thread_blocked(tid, done, 10000 * MS);
    RASSERT(rc != 0, "%s returned instead of blocking", what);
    RASSERT(rc != -1, "%s: never seen blocked within 10 s", what);
}
