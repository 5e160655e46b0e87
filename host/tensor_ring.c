#include "host/tensor_ring.h"
#include "host/shm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* The seqlock's fences. ThreadSanitizer does not model fences (gcc's -Wtsan); the ring's readers
 * are other processes, which it does not see, so there a compiler barrier stands in. */
#if defined(__SANITIZE_THREAD__)
#define RING_FENCE(order) __atomic_signal_fence(order)
#else
#define RING_FENCE(order) __atomic_thread_fence(order)
#endif

struct ifd_tensor_ring {
    ifd_shm_file file;   /* mapped read-write */
    unsigned char *base; /* file.base */
    uint64_t cap;
    uint64_t pos; /* where the next message may start (the writer's own; never read back) */
    char token[2 * IFD_TENSOR_RING_TOKEN_LEN + 1];
};

static uint64_t *written_word(const unsigned char *base)
{
    return (uint64_t *)(uintptr_t)(base + IFD_TENSOR_RING_WRITTEN);
}

static void put_u64(unsigned char *at, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        at[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *at)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | at[i];
    return v;
}

int ifd_tensor_ring_create(ifd_tensor_ring **out, int64_t cap, ifd_error *err)
{
    *out = NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (cap < IFD_TENSOR_RING_MIN || (uint64_t)cap > SIZE_MAX / 2)
        return ifd_error_set(err, IFD_EINVAL,
                             "tensor_shm_bytes: expected %lld bytes or more for the ring of "
                             "tensor messages in shared memory, got %lld",
                             (long long)IFD_TENSOR_RING_MIN, (long long)cap);
    ifd_tensor_ring *r = calloc(1, sizeof *r);
    if (r == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "tensor ring: out of memory");
    r->file.fd = -1;
    r->cap = ((uint64_t)cap + page - 1) / page * page;
    size_t size = IFD_TENSOR_RING_HEADER + (size_t)r->cap;
    unsigned char tok[IFD_TENSOR_RING_TOKEN_LEN], hdr[IFD_TENSOR_RING_HEADER] = {0};
    int rc = IFD_EIO;
    if (getrandom(tok, sizeof tok, 0) != (ssize_t)sizeof tok) {
        ifd_error_set(err, IFD_EIO, "tensor ring: getrandom: %s", strerror(errno));
        goto fail;
    }
    for (int i = 0; i < IFD_TENSOR_RING_TOKEN_LEN; i++)
        snprintf(r->token + 2 * i, 3, "%02x", tok[i]);
    memcpy(hdr, IFD_TENSOR_RING_MAGIC, 8);
    memcpy(hdr + 8, tok, sizeof tok);
    put_u64(hdr + 24, r->cap);
    char made[160];
    if ((rc = ifd_shm_file_make(&r->file, "infeed-tensor-ring", size, hdr, sizeof hdr,
                                PROT_READ | PROT_WRITE, MAP_POPULATE, made, sizeof made)) !=
        IFD_OK) {
        ifd_error_set(err, rc,
                      "tensor ring: the ring of tensor messages in shared memory "
                      "(tensor_shm_bytes %lld): %s",
                      (long long)cap, made);
        goto fail;
    }
    r->base = r->file.base;
    *out = r;
    return IFD_OK;
fail:
    ifd_tensor_ring_destroy(r);
    return rc;
}

void ifd_tensor_ring_destroy(ifd_tensor_ring *r)
{
    if (r == NULL)
        return;
    ifd_shm_file_close(&r->file);
    free(r);
}

size_t ifd_tensor_ring_max_message(const ifd_tensor_ring *r)
{
    return (size_t)(r->cap / 4);
}

char *ifd_tensor_ring_claim(ifd_tensor_ring *r, size_t n, uint64_t *seq)
{
    if (n > ifd_tensor_ring_max_message(r))
        return NULL;
    uint64_t len =
        ((uint64_t)n + IFD_TENSOR_RING_ALIGN - 1) / IFD_TENSOR_RING_ALIGN * IFD_TENSOR_RING_ALIGN;
    uint64_t off = r->pos % r->cap;
    if (off + len > r->cap) /* never across the end */
        r->pos += r->cap - off, off = 0;
    *seq = r->pos;
    r->pos += len;
    /* the bytes up to pos are being written: a reader of any message that lay there sees it
     * lost from now on. The fence orders this store before the data's (the Linux seqlock's
     * smp_wmb: a compiler barrier on x86, dmb on arm64). */
    __atomic_store_n(written_word(r->base), r->pos, __ATOMIC_RELAXED);
    RING_FENCE(__ATOMIC_RELEASE);
    return (char *)r->base + IFD_TENSOR_RING_HEADER + off;
}

const char *ifd_tensor_ring_path(const ifd_tensor_ring *r)
{
    return r->file.path;
}

size_t ifd_tensor_ring_size(const ifd_tensor_ring *r)
{
    return r->file.size;
}

const char *ifd_tensor_ring_token(const ifd_tensor_ring *r)
{
    return r->token;
}

/* ---- a subscriber's side ---- */

int ifd_tensor_ring_open(ifd_tensor_ring_reader *rd, const char *path, size_t size,
                         const char *token, ifd_error *err)
{
    memset(rd, 0, sizeof *rd);
    if (size <= IFD_TENSOR_RING_HEADER)
        return ifd_error_set(err, IFD_EPROTO,
                             "tensor ring %s: size: expected more than %d bytes, got %zu", path,
                             IFD_TENSOR_RING_HEADER, size);
    int fd = open(path, O_RDONLY | O_CLOEXEC), rc = IFD_OK;
    if (fd < 0) {
        int e = errno;
        return ifd_error_set(err, e == EACCES || e == EPERM ? IFD_EPERM : IFD_EIO,
                             "tensor ring %s: cannot open it: %s (a subscriber of another user, "
                             "host or PID namespace cannot: ask for \"tensor:NAME\" instead)",
                             path, strerror(e));
    }
    struct stat st;
    void *base = MAP_FAILED;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size) {
        rc = ifd_error_set(err, IFD_EPROTO,
                           "tensor ring %s: size: expected a file of %zu bytes (the notice's), "
                           "got %lld",
                           path, size, (long long)st.st_size);
        goto done;
    }
    base = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        rc = ifd_error_set(err, IFD_ENOMEM, "tensor ring %s: mmap of %zu bytes: %s", path, size,
                           strerror(errno));
        goto done;
    }
    const unsigned char *h = base;
    char hex[2 * IFD_TENSOR_RING_TOKEN_LEN + 1];
    for (int i = 0; i < IFD_TENSOR_RING_TOKEN_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", h[8 + i]);
    uint64_t cap = get_u64(h + 24);
    if (memcmp(h, IFD_TENSOR_RING_MAGIC, 8) != 0 || strcmp(hex, token) != 0 ||
        cap != size - IFD_TENSOR_RING_HEADER) {
        rc =
            ifd_error_set(err, IFD_EPROTO,
                          "tensor ring %s: expected the magic IFDRING1, token %.32s and %zu "
                          "data bytes, got token %s and %llu bytes (not this daemon's ring)",
                          path, token, size - IFD_TENSOR_RING_HEADER, hex, (unsigned long long)cap);
        munmap(base, size);
        goto done;
    }
    rd->base = base;
    rd->size = size;
    rd->cap = cap;
    snprintf(rd->path, sizeof rd->path, "%s", path);
    snprintf(rd->token, sizeof rd->token, "%s", hex);
done:
    close(fd);
    return rc;
}

void ifd_tensor_ring_close(ifd_tensor_ring_reader *rd)
{
    if (rd->base)
        munmap((void *)(uintptr_t)rd->base, rd->size);
    memset(rd, 0, sizeof *rd);
}

static uint64_t written_now(const ifd_tensor_ring_reader *rd, int order)
{
    return __atomic_load_n(written_word(rd->base), order);
}

const void *ifd_tensor_ring_at(const ifd_tensor_ring_reader *rd, uint64_t seq, size_t n,
                               ifd_error *err)
{
    uint64_t off = seq % rd->cap;
    if (n > rd->cap - off || seq + n > written_now(rd, __ATOMIC_ACQUIRE)) {
        ifd_error_set(err, IFD_EPROTO,
                      "tensor ring %s: a notice names %zu bytes at %llu, which the ring of %llu "
                      "bytes does not hold",
                      rd->path, n, (unsigned long long)seq, (unsigned long long)rd->cap);
        return NULL;
    }
    return rd->base + IFD_TENSOR_RING_HEADER + off;
}

int ifd_tensor_ring_intact(const ifd_tensor_ring_reader *rd, uint64_t seq)
{
    /* what was read before this load was read before the writer's later claims */
    RING_FENCE(__ATOMIC_ACQUIRE);
    return written_now(rd, __ATOMIC_RELAXED) <= seq + rd->cap;
}

int ifd_tensor_ring_read(const ifd_tensor_ring_reader *rd, uint64_t seq, size_t n, void *dst,
                         ifd_error *err)
{
    const void *at = ifd_tensor_ring_at(rd, seq, n, err);
    if (at == NULL)
        return IFD_EPROTO;
    if (!ifd_tensor_ring_intact(rd, seq))
        return IFD_ERANGE;
    if (n)
        memcpy(dst, at, n);
    return ifd_tensor_ring_intact(rd, seq) ? IFD_OK : IFD_ERANGE;
}
