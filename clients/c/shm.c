/*
 * The shared-memory pool of a producer: mapping and checking what WELCOME describes, and the slot
 * allocator (shm.h). No socket here: the producer (send_shm.c) drives it.
 */
#include "clients/c/shm.h"

#include "core/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- slots -------------------------------------------------------------------------------- */

int ifdp_slots_init(ifdp_slots *s, int n)
{
    memset(s, 0, sizeof *s);
    s->state = calloc((size_t)n, sizeof *s->state);
    s->step = calloc((size_t)n, sizeof *s->step);
    s->msg = calloc((size_t)n, sizeof *s->msg);
    if (s->state == NULL || s->step == NULL || s->msg == NULL) {
        ifdp_slots_fini(s);
        return IFD_ENOMEM;
    }
    s->n = n;
    return IFD_OK;
}

void ifdp_slots_fini(ifdp_slots *s)
{
    free(s->state);
    free(s->step);
    free(s->msg);
    memset(s, 0, sizeof *s);
}

int ifdp_slots_find(const ifdp_slots *s, int k)
{
    if (k < 1 || k > s->n)
        return -1;
    for (int i = 0; i < s->n; i++) {
        int first = (s->next + i) % s->n;
        if (first + k > s->n)
            continue; /* fewer than k left before the end: go on at 0 */
        int j = 0;
        while (j < k && s->state[first + j] == IFDP_SLOT_FREE)
            j++;
        if (j == k)
            return first;
        i += j; /* slot first + j is taken: no run can start before it */
    }
    return -1;
}

void ifdp_slots_reserve(ifdp_slots *s, int first, int k)
{
    for (int j = 0; j < k; j++)
        s->state[first + j] = IFDP_SLOT_RESERVED;
}

void ifdp_slots_take(ifdp_slots *s, int first, int k, int64_t seq)
{
    for (int j = 0; j < k; j++) {
        s->state[first + j] = IFDP_SLOT_IN_FLIGHT;
        s->step[first + j] = seq + j;
        s->msg[first + j] = seq;
    }
    s->next = (first + k) % s->n;
}

void ifdp_slots_unreserve(ifdp_slots *s, int first, int k)
{
    for (int j = 0; j < k; j++)
        if (s->state[first + j] == IFDP_SLOT_RESERVED)
            s->state[first + j] = IFDP_SLOT_FREE;
}

void ifdp_slots_ack(ifdp_slots *s, int64_t seq)
{
    for (int i = 0; i < s->n; i++)
        if (s->state[i] == IFDP_SLOT_IN_FLIGHT && s->step[i] <= seq)
            s->state[i] = IFDP_SLOT_FREE;
}

void ifdp_slots_reject(ifdp_slots *s, int64_t seq)
{
    for (int i = 0; i < s->n; i++)
        if (s->state[i] == IFDP_SLOT_IN_FLIGHT && s->msg[i] == seq)
            s->state[i] = IFDP_SLOT_FREE;
}

int ifdp_slots_busy(const ifdp_slots *s)
{
    int busy = 0;
    for (int i = 0; i < s->n; i++)
        busy += s->state[i] != IFDP_SLOT_FREE;
    return busy;
}

/* ---- the pool ----------------------------------------------------------------------------- */

/* The layout WELCOME describes, against the schema: every region inside the pool. */
static int check_layout(const ifdp_shm_desc *d, const size_t *row_bytes, int n, int64_t batch_size,
                        ifd_error *err)
{
    if (d->why[0])
        return ifd_error_set(err, IFD_EPROTO, "WELCOME: shm: %s", d->why);
    if (d->n != n)
        return ifd_error_set(err, IFD_EPROTO,
                             "WELCOME: shm: offsets and step_bytes: expected %d entries (one per "
                             "schema tensor), got %d",
                             n, d->n);
    if (d->slots < 1 || d->slots > INT32_MAX / 2)
        return ifd_error_set(err, IFD_EPROTO, "WELCOME: shm: slots: expected 1 to %d, got %lld",
                             INT32_MAX / 2, (long long)d->slots);
    if (d->size < IFD_SHM_HEADER)
        return ifd_error_set(err, IFD_EPROTO,
                             "WELCOME: shm: size: expected at least %d bytes, got %llu",
                             IFD_SHM_HEADER, (unsigned long long)d->size);
    for (int i = 0; i < n; i++) {
        uint64_t want = (uint64_t)batch_size * row_bytes[i], end;
        if (d->step_bytes[i] != want)
            return ifd_error_set(err, IFD_EPROTO,
                                 "WELCOME: shm: step_bytes[%d]: expected %llu (batch_size %lld x "
                                 "%zu bytes a row), got %llu",
                                 i, (unsigned long long)want, (long long)batch_size, row_bytes[i],
                                 (unsigned long long)d->step_bytes[i]);
        if (d->offsets[i] % IFD_SHM_ALIGN || d->offsets[i] < IFD_SHM_HEADER)
            return ifd_error_set(err, IFD_EPROTO,
                                 "WELCOME: shm: offsets[%d]: expected a multiple of %d, at least "
                                 "%d, got %llu",
                                 i, IFD_SHM_ALIGN, IFD_SHM_HEADER,
                                 (unsigned long long)d->offsets[i]);
        if (__builtin_mul_overflow(d->step_bytes[i], (uint64_t)d->slots, &end) ||
            __builtin_add_overflow(end, d->offsets[i], &end) || end > d->size)
            return ifd_error_set(err, IFD_EPROTO,
                                 "WELCOME: shm: tensor %d's region (offset %llu, %lld slots of "
                                 "%llu bytes): expected it inside the pool's %llu bytes",
                                 i, (unsigned long long)d->offsets[i], (long long)d->slots,
                                 (unsigned long long)d->step_bytes[i], (unsigned long long)d->size);
    }
    if (d->size > SIZE_MAX)
        return ifd_error_set(err, IFD_ENOMEM,
                             "shm pool %s: %llu bytes do not fit the address space", d->path,
                             (unsigned long long)d->size);
    return IFD_OK;
}

static int open_error(const char *path, int e, ifd_error *err)
{
    int code = e == EACCES || e == EPERM ? IFD_EPERM : e == ENOENT ? IFD_ENOTFOUND : IFD_EIO;
    return ifd_error_set(err, code,
                         "shm pool %s: cannot open it read-write: %s (the daemon must run as "
                         "this user, on this host, in this PID namespace)",
                         path, strerror(e));
}

int ifdp_pool_map(ifdp_pool *pool, const ifdp_shm_desc *d, const size_t *row_bytes, int n,
                  int64_t batch_size, ifd_error *err)
{
    memset(pool, 0, sizeof *pool);
    int rc = check_layout(d, row_bytes, n, batch_size, err);
    if (rc)
        return rc;
    int fd = open(d->path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return open_error(d->path, errno, err);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = ifd_error_set(err, IFD_EIO, "shm pool %s: fstat: %s", d->path, strerror(errno));
        goto fail_fd;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != d->size) {
        rc = ifd_error_set(err, IFD_EPROTO,
                           "shm pool %s: size: expected a file of %llu bytes (WELCOME's size), "
                           "got %s of %lld",
                           d->path, (unsigned long long)d->size,
                           S_ISREG(st.st_mode) ? "one" : "something that is not a regular file",
                           (long long)st.st_size);
        goto fail_fd;
    }
    void *base = mmap(NULL, (size_t)d->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = ifd_error_set(err, errno == ENOMEM ? IFD_ENOMEM : IFD_EIO, "shm pool %s: mmap: %s",
                           d->path, strerror(errno));
        goto fail_fd;
    }
    const unsigned char *h = base;
    if (memcmp(h, IFD_SHM_MAGIC, IFD_SHM_MAGIC_LEN) != 0) {
        rc = ifd_error_set(err, IFD_EPROTO,
                           "shm pool %s: magic: expected the bytes 'IFDSHM1\\0', got %02x %02x "
                           "%02x %02x %02x %02x %02x %02x (not the daemon's pool)",
                           d->path, h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
        goto fail_map;
    }
    if (memcmp(h + IFD_SHM_MAGIC_LEN, d->token, IFD_SHM_TOKEN_LEN) != 0) {
        rc = ifd_error_set(err, IFD_EPROTO,
                           "shm pool %s: token: the file's 16 bytes after the magic are not "
                           "WELCOME's token (another producer's pool, or a stale path)",
                           d->path);
        goto fail_map;
    }
    if ((rc = ifdp_slots_init(&pool->slots, (int)d->slots))) {
        ifd_error_set(err, rc, "shm pool %s: out of memory for %lld slots", d->path,
                      (long long)d->slots);
        goto fail_map;
    }
    close(fd);
    pool->base = base;
    pool->size = (size_t)d->size;
    pool->n = n;
    for (int i = 0; i < n; i++) {
        pool->offsets[i] = (size_t)d->offsets[i];
        pool->step_bytes[i] = (size_t)d->step_bytes[i];
    }
    return IFD_OK;

fail_map:
    munmap(base, (size_t)d->size);
fail_fd:
    close(fd);
    return rc;
}

void ifdp_pool_unmap(ifdp_pool *pool)
{
    if (pool->base)
        munmap(pool->base, pool->size);
    ifdp_slots_fini(&pool->slots);
    memset(pool, 0, sizeof *pool);
}
